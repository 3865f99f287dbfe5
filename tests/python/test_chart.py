"""The Helm chart (helm/herald), with the real Helm engine (helm-python-sdk bundles Helm v4's Go
SDK) and the Kubernetes OpenAPI schemas that kubernetes-validate ships (no cluster, no network):

- lint in strict mode and render, for the default values and for every helm/herald/ci/*.yaml;
- validate every rendered object in strict mode (unknown fields rejected) against the oldest
  Kubernetes the chart supports and the newest kubernetes-validate knows;
- check the properties operators rely on (restricted security context, probes on the right
  ports, PDB and spread, hook Job, references between objects);
- smoke: start the real binaries with the command, args and environment of the rendered
  manifests against a private database, and call what the probes call.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

import harness

CHART = harness.REPO / "helm" / "herald"
CI_FILES = sorted((CHART / "ci").glob("*.yaml"))
VALUES = [None, *CI_FILES]
IDS = ["default", *[p.name for p in CI_FILES]]
# The chart's kubeVersion floor (native gRPC probes) and the newest schemas kubernetes-validate
# ships.
KUBE_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
RELEASE, NAMESPACE = "herald", "herald"

# Everything but the smoke test needs neither binaries nor PostgreSQL: script/test runs those
# first (`-m chart`), before the long build.
chart = pytest.mark.chart

# The subset of monitoring.coreos.com/v1 PrometheusRule the chart uses: named groups of alerting
# rules, each with an expression, unknown fields rejected.
PROMETHEUS_RULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                "type": "object",
                "required": ["name", "rules"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "rules": {"type": "array", "minItems": 4, "items": {
                        "type": "object",
                        "required": ["alert", "expr"],
                        "additionalProperties": False,
                        "properties": {
                            "alert": {"type": "string"},
                            "expr": {"type": "string", "minLength": 1},
                            "for": {"type": "string"},
                            "labels": {"type": "object"},
                            "annotations": {"type": "object"},
                        },
                    }},
                },
            }}},
        },
    },
}

# kubernetes-validate knows built-in kinds only; the Prometheus Operator's CRD is checked against
# the subset of monitoring.coreos.com/v1 ServiceMonitor the chart uses, unknown fields rejected.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "matchExpressions": {"type": "array", "items": {
                            "type": "object",
                            "required": ["key", "operator"],
                            "additionalProperties": False,
                            "properties": {
                                "key": {"type": "string"},
                                "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                                "values": {"type": "array", "items": {"type": "string"}},
                            },
                        }},
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string"},
                        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                        "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                        # SafeAuthorization: the credentials come from a Secret, never inline.
                        "authorization": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "type": {"type": "string"},
                                "credentials": {
                                    "type": "object",
                                    "required": ["name", "key"],
                                    "additionalProperties": False,
                                    "properties": {"name": {"type": "string"}, "key": {"type": "string"},
                                                   "optional": {"type": "boolean"}},
                                },
                            },
                        },
                    },
                }},
            },
        },
    },
}


def load_values(path):
    return yaml.safe_load(path.read_text()) if path else None


def render(values=None):
    """Renders the chart as `helm install` would; returns (objects, NOTES.txt)."""
    chart = helm.Chart.load(str(CHART))
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects, notes = [], ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["__template"] = path
                objects.append(doc)
    return objects, notes


def clean(obj):
    return {k: v for k, v in obj.items() if k != "__template"}


def find(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def one(objects, kind, name):
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, got {len(found)}"
    return found[0]


def workloads(objects):
    """(object, pod spec) of every Deployment and Job."""
    return [(o, o["spec"]["template"]["spec"]) for o in objects if o["kind"] in ("Deployment", "Job")]


# --- lint, render, validate --------------------------------------------------------------------


@chart
def test_ci_values_cover_ha_and_tls():
    assert CI_FILES, "helm/herald/ci/ has no values files"
    ha_tls = [p for p in CI_FILES if (v := load_values(p)).get("tls", {}).get("enabled")
              and v.get("scheduler", {}).get("replicaCount", 2) >= 2]
    assert ha_tls, "no ci values file turns TLS on with several scheduler replicas"


@chart
@pytest.mark.parametrize("values_file", VALUES, ids=IDS)
def test_lint(values_file):
    report = helm.lint(str(CHART), load_values(values_file), strict=True, kube_version="v1.27.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report


@chart
@pytest.mark.parametrize("values_file", VALUES, ids=IDS)
def test_rendered_objects_are_valid_kubernetes(values_file):
    objects, notes = render(load_values(values_file))
    assert objects and "herald" in notes
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "ConfigMap"} <= kinds
    for obj in objects:
        body = clean(obj)
        where = f"{obj['__template']}: {obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "ServiceMonitor":
            jsonschema.validate(body, SERVICE_MONITOR_SCHEMA)
            continue
        if obj["kind"] == "PrometheusRule":
            jsonschema.validate(body, PROMETHEUS_RULE_SCHEMA)
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(body, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{where} is not valid for Kubernetes {version}: {e.message} at {list(e.path)}")


@chart
def test_strict_validation_catches_unknown_fields():
    """The validation above would notice a misspelt field (strict mode is really on)."""
    objects, _ = render()
    deployment = clean(one(objects, "Deployment", "herald-scheduler"))
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    kubernetes_validate.validate(deployment, KUBE_VERSIONS[0], strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[0], strict=True)


@pytest.mark.parametrize("values, message", [
    ({"scheduler": {"replicaCout": 3}}, "replicaCout"),
    ({"scheduler": {"config": {"leaseTtl": "thirty"}}}, "leaseTtl"),
    ({"tls": {"enabled": True}}, "existingSecret"),
    ({"database": {"existingSecret": ""}}, "existingSecret"),
    ({"database": {"url": "db-a:5432,db-b:5432"}}, "url"),
    ({"database": {"cloudNativePG": {"cluster": "Herald_PG"}}}, "cluster"),
    ({"database": {"cloudNativePG": {"instances": 3}}}, "instances"),
    ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ({"executor": {"config": {"maxInFlight": 0}}}, "maxInFlight"),
])
@chart
def test_schema_rejects_bad_values(values, message):
    with pytest.raises(helm.HelmError) as err:
        render(values)
    assert message in str(err.value)


# --- what operators rely on ---------------------------------------------------------------------


@chart
@pytest.mark.parametrize("values_file", VALUES, ids=IDS)
def test_pods_are_restricted_and_bounded(values_file):
    objects, _ = render(load_values(values_file))
    for obj, pod in workloads(objects):
        name = obj["metadata"]["name"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod.get("automountServiceAccountToken") is False, name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], name
            for mount in c.get("volumeMounts", []):
                if mount["mountPath"] != "/tmp":
                    assert mount.get("readOnly") is True, f"{name}: {mount}"


@chart
@pytest.mark.parametrize("values_file", VALUES, ids=IDS)
def test_references_resolve(values_file):
    """Every selector matches its pods, every named port exists, every ConfigMap the pods use
    is rendered (Secrets may be existing ones; those must be named in the values)."""
    values = load_values(values_file) or {}
    objects, _ = render(values)
    rendered = {(o["kind"], o["metadata"]["name"]) for o in objects}
    pods = {o["metadata"]["name"]: o["spec"]["template"] for o in find(objects, "Deployment")}
    existing_secrets = set(yaml.safe_dump(values).split()) | {"herald-database"}
    # CloudNativePG makes `<cluster>-app` for the cluster the values name.
    cnpg = (values.get("database") or {}).get("cloudNativePG", {}).get("cluster")
    if cnpg:
        existing_secrets.add(f"{cnpg}-app")

    def matching(selector):
        return [n for n, t in pods.items() if selector.items() <= t["metadata"]["labels"].items()]

    for svc in find(objects, "Service"):
        targets = matching(svc["spec"]["selector"])
        assert len(targets) == 1, svc["metadata"]["name"]
        ports = {p["name"] for p in pods[targets[0]]["spec"]["containers"][0]["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports
    for pdb in find(objects, "PodDisruptionBudget"):
        assert len(matching(pdb["spec"]["selector"]["matchLabels"])) == 1
    for hpa in find(objects, "HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]["name"]
        assert ("Deployment", target) in rendered
        assert "replicas" not in one(objects, "Deployment", target)["spec"]

    for obj, pod in workloads(objects):
        for c in pod["containers"]:
            for src in c.get("envFrom", []):
                if "configMapRef" in src:
                    assert ("ConfigMap", src["configMapRef"]["name"]) in rendered
                else:
                    assert src["secretRef"]["name"] in existing_secrets
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ("Secret", ref["name"]) in rendered or ref["name"] in existing_secrets
        for vol in pod.get("volumes", []):
            if "configMap" in vol:
                name = vol["configMap"]["name"]
                assert ("ConfigMap", name) in rendered or name in existing_secrets
            if "secret" in vol:
                assert vol["secret"]["secretName"] in existing_secrets


@chart
@pytest.mark.parametrize("values_file", VALUES, ids=IDS)
def test_probes_use_the_health_endpoints(values_file):
    values = load_values(values_file) or {}
    tls = values.get("tls", {}).get("enabled", False)
    objects, _ = render(values)
    fullname = values.get("fullnameOverride", "herald")
    config = one(objects, "ConfigMap", f"{fullname}-scheduler")["data"]
    grpc_port = int(config["HERALD_GRPC_ADDR"].rsplit(":", 1)[1])
    http_port = int(config["HERALD_HTTP_ADDR"].rsplit(":", 1)[1])
    scheduler = one(objects, "Deployment", f"{fullname}-scheduler")
    c = scheduler["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": grpc_port, "http": http_port}
    for probe in ("startupProbe", "readinessProbe"):
        if tls:  # kubelet's gRPC probe cannot do TLS
            assert c[probe]["httpGet"]["port"] == "http"
        else:
            assert c[probe]["grpc"] == {"port": grpc_port, "service": ""}
    # Liveness never follows the database: gRPC health is NOT_SERVING while PostgreSQL is
    # unreachable (faults::postgres_restarted_mid_run_turns_health_not_serving_and_everything_recovers),
    # and a probe on it would restart every replica during a failover. /healthz stays 200.
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    if values.get("executor", {}).get("enabled", True):
        executor = one(objects, "Deployment", f"{fullname}-executor")
        e = executor["spec"]["template"]["spec"]["containers"][0]
        econfig = one(objects, "ConfigMap", f"{fullname}-executor")["data"]
        assert e["ports"][0]["containerPort"] == int(econfig["HERALD_HTTP_ADDR"].rsplit(":", 1)[1])
        # Ready only with a lease session: a rollout with a wrong scheduler address, token or CA
        # stops at its first executor instead of replacing every working one.
        assert e["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert e["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert econfig["HERALD_SCHEDULER"].startswith("https://" if tls else "http://")


@chart
def test_a_database_ca_reaches_the_scheduler_and_the_migration_job():
    """With sslmode=verify-full against a database's own CA, the migration Job connects first:
    the scheduler's extra variables and volumes (PGSSLROOTCERT and the CA's Secret) go to it as
    well, or the install fails at its first step."""
    objects, _ = render(load_values(CHART / "ci" / "external-multihost-values.yaml"))
    for kind, name in (("Deployment", "herald-scheduler"), ("Job", "herald-migrate")):
        pod = one(objects, kind, name)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PGSSLROOTCERT"] == "/etc/herald/db-ca/ca.crt", name
        mount = next(m for m in container["volumeMounts"] if m["name"] == "db-ca")
        assert mount["mountPath"] == "/etc/herald/db-ca", name
        volume = next(v for v in pod["volumes"] if v["name"] == "db-ca")
        assert volume["secret"]["secretName"] == "herald-db-ca", name
    executor = one(objects, "Deployment", "herald-executor")["spec"]["template"]["spec"]
    assert all(v["name"] != "db-ca" for v in executor["volumes"])


@chart
def test_a_protected_scheduler_metrics_endpoint_is_scraped_with_a_token():
    """With HERALD_METRICS_AUTH the scheduler's /metrics wants an admin token: the
    ServiceMonitor carries the one serviceMonitor.authorization names, from its Secret."""
    objects, _ = render(load_values(CHART / "ci" / "ha-tls-values.yaml"))
    endpoint = one(objects, "ServiceMonitor", "herald-prod")["spec"]["endpoints"][0]
    assert endpoint["authorization"] == {
        "type": "Bearer", "credentials": {"name": "herald-metrics-token", "key": "token"}}
    plain, _ = render({"serviceMonitor": {"enabled": True}})
    assert "authorization" not in one(plain, "ServiceMonitor", "herald")["spec"]["endpoints"][0]


@chart
def test_notes_warn_while_the_executors_send_with_the_log_sender():
    """The default sender file logs every message and reports it sent: an install that keeps
    it marks real tasks SUCCEEDED without sending them, so the notes say so."""
    _, notes = render()
    assert "routes to the log sender" in notes
    _, notes = render({"executor": {"senders": {"existingSecret": "herald-senders"}}})
    assert "log sender" not in notes
    _, notes = render({"executor": {"senders": {"inline": '[default]\nsender = "webhook"\n'}}})
    assert "log sender" not in notes


@chart
def test_defaults_are_highly_available():
    objects, _ = render()
    scheduler = one(objects, "Deployment", "herald-scheduler")
    assert scheduler["spec"]["replicas"] == 2
    assert scheduler["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spread = scheduler["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread[0]["topologyKey"] == "kubernetes.io/hostname"
    assert one(objects, "PodDisruptionBudget", "herald-scheduler")["spec"]["maxUnavailable"] == 1
    job = one(objects, "Job", "herald-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    # Security features are planned, so off by default.
    env = {e["name"] for e in scheduler["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert not env & {"HERALD_TLS_CERT", "HERALD_TLS_KEY", "HERALD_TLS_CLIENT_CA", "HERALD_AUTH_TOKENS_FILE"}
    assert not find(objects, "NetworkPolicy") and not find(objects, "ServiceMonitor")
    assert not find(objects, "HorizontalPodAutoscaler")


@chart
def test_ha_tls_values_mount_the_security_material():
    values = load_values(CHART / "ci" / "ha-tls-values.yaml")
    objects, _ = render(values)
    scheduler = one(objects, "Deployment", "herald-prod-scheduler")
    pod = scheduler["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["HERALD_TLS_CERT"] == "/etc/herald/tls/tls.crt"
    assert env["HERALD_TLS_KEY"] == "/etc/herald/tls/tls.key"
    assert env["HERALD_TLS_CLIENT_CA"] == "/etc/herald/tls/ca.crt"
    assert env["HERALD_AUTH_TOKENS_FILE"] == "/etc/herald/auth/tokens"
    assert pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
    assert scheduler["spec"]["replicas"] == 3
    assert {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v} == {"herald-scheduler-tls", "herald-tokens"}
    assert len(find(objects, "NetworkPolicy")) == 2
    assert find(objects, "HorizontalPodAutoscaler") and find(objects, "ServiceMonitor")
    rules = find(objects, "PrometheusRule")
    assert rules, "the HA file ships the alert rules"
    alerts = {r["alert"] for g in rules[0]["spec"]["groups"] for r in g["rules"]}
    assert {"HeraldBacklogGrowing", "HeraldTriggerLagHigh"} <= alerts
    # Prometheus's own templates survive Helm untouched.
    assert any("{{ $labels" in str(r.get("annotations")) for g in rules[0]["spec"]["groups"] for r in g["rules"])


@chart
def test_alert_rules_name_only_documented_metrics():
    """Every series an example alert reads is one docs/operations.md lists as exported: a rule
    on a renamed or missing metric never fires and nothing says so."""
    import re

    rules = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    named = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            for name in re.findall(r"\bherald_[a-z_]+", rule["expr"]):
                named.add(re.sub(r"_(bucket|count|sum)$", "", name))
    ops = (harness.REPO / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"^\| `(herald_[a-z_]+)` \|", ops, re.MULTILINE))
    assert named, "no metric found in the rules"
    assert named <= documented, f"rules read undocumented metrics: {sorted(named - documented)}"
    assert "herald_oldest_transaction_seconds" in named


def database_refs(objects):
    """(Secret, key) of DATABASE_URL in every workload that reads it."""
    refs = set()
    for _, pod in workloads(objects):
        for c in pod["containers"]:
            for e in c.get("env", []):
                if e["name"] == "DATABASE_URL":
                    ref = e["valueFrom"]["secretKeyRef"]
                    refs.add((ref["name"], ref["key"]))
    return refs


@chart
def test_cloudnativepg_values_read_the_operators_app_secret():
    """The scheduler and the migration Job read the `uri` of CloudNativePG's `<cluster>-app`
    Secret (which names the `-rw` Service); the chart makes no Secret of its own."""
    objects, notes = render(load_values(CHART / "ci" / "cloudnativepg-values.yaml"))
    assert database_refs(objects) == {("herald-pg-app", "uri")}
    assert not find(objects, "Secret")
    assert find(objects, "Job"), "the migration Job reads the database too"
    assert "herald-pg-rw" in notes


@chart
def test_multihost_values_keep_every_host_in_the_url():
    values = load_values(CHART / "ci" / "external-multihost-values.yaml")
    objects, _ = render(values)
    secret = one(objects, "Secret", "herald-database")
    url = base64.b64decode(secret["data"]["DATABASE_URL"]).decode()
    assert url == values["database"]["url"]
    assert url.count(".db.internal:5432") == 3 and "target_session_attrs=read-write" in url
    assert database_refs(objects) == {("herald-database", "DATABASE_URL")}


# --- smoke: the rendered commands start the real binaries --------------------------------------


def resolve_env(container, objects, secrets, pod_name):
    """The environment a container would get: envFrom ConfigMaps, then env (values, secretKeyRef
    from `secrets` or rendered Secrets, fieldRef metadata.name)."""
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in find(objects, "ConfigMap")}
    rendered_secrets = {
        (o["metadata"]["name"], k): base64.b64decode(v).decode()
        for o in find(objects, "Secret") for k, v in o.get("data", {}).items()
    }
    env = {}
    for src in container.get("envFrom", []):
        env.update(configmaps[src["configMapRef"]["name"]])
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["secretKeyRef"]
            key = (ref["name"], ref["key"])
            env[e["name"]] = secrets[key] if key in secrets else rendered_secrets[key]
        elif e["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[e["name"]] = pod_name
        else:
            raise AssertionError(f"cannot resolve {e}")
    return env


def argv_of(container):
    command = container["command"]
    return [str(harness.binary(Path(command[0]).name)), *command[1:], *container.get("args", [])]


def http_get(addr, path):
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("values_file", VALUES, ids=IDS)
def test_every_rendered_variable_is_one_the_binary_reads(values_file):
    # The ConfigMaps derive each variable's name from its key in `*.config`
    # (herald.configEnv), so a key with no flag behind it would be set and silently ignored.
    values = load_values(values_file) or {}
    objects, _ = render(values)
    extra_env = {e["name"] for c in ("scheduler", "executor") for e in values.get(c, {}).get("extraEnv", [])}
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in find(objects, "ConfigMap")}
    checked = 0
    for _, pod in workloads(objects):
        for container in pod["containers"]:
            # Less what the operator adds by `extraEnv` (RUST_LOG and the like).
            names = {e["name"] for e in container.get("env", [])} - extra_env
            for source in container.get("envFrom", []):
                # A Secret's variables (executor.credentials.asEnv) are the sender file's to name.
                if "configMapRef" in source:
                    names |= set(configmaps[source["configMapRef"]["name"]])
            argv = argv_of(container)
            help_text = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
            read = set(re.findall(r"\[env: ([A-Z0-9_]+)[=\]]", help_text))
            assert names - read == set(), f"{argv[0]} {argv[1:]} does not read these"
            checked += len(names)
    assert checked > 20


@pytest.mark.parametrize("values", [
    {"scheduler": {"config": {"claimBatch": 10000000, "compactMaxMib": 123456789}}},
    {"executor": {"config": {"queues": ["whatsapp", "wecom"], "maxInFlight": 2048}}},
])
@chart
def test_config_values_become_the_variables_the_binaries_parse(values):
    objects, _ = render(values)
    scheduler = one(objects, "ConfigMap", "herald-scheduler")["data"]
    executor = one(objects, "ConfigMap", "herald-executor")["data"]
    for component, data in (("scheduler", scheduler), ("executor", executor)):
        for key, value in values.get(component, {}).get("config", {}).items():
            name = "HERALD_" + re.sub(r"(?<!^)(?=[A-Z])", "_", key).upper()
            # Whole numbers in full (Helm reads them as floats), lists joined by commas.
            expected = ",".join(value) if isinstance(value, list) else str(value)
            assert data[name] == expected, name
    # An empty list is left out, so the executor takes every queue of its sender file.
    if "executor" not in values:
        assert "HERALD_QUEUES" not in executor


def test_smoke_rendered_manifests_start_and_report_serving(database, tmp_path, stubs):
    objects, _ = render()
    secrets = {("herald-database", "DATABASE_URL"): database.url}

    # 1. The pre-install hook: herald-scheduler migrate.
    job = one(objects, "Job", "herald-migrate")["spec"]["template"]["spec"]["containers"][0]
    env = resolve_env(job, objects, secrets, "herald-migrate-x")
    done = subprocess.run(argv_of(job), env=harness.base_env(**env), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    # 2. The scheduler as its Deployment runs it, on loopback ports.
    sched = one(objects, "Deployment", "herald-scheduler")["spec"]["template"]["spec"]["containers"][0]
    env = resolve_env(sched, objects, secrets, "herald-scheduler-abc-1")
    assert env["DATABASE_URL"] == database.url and env["HERALD_SCHEDULER_ID"] == "herald-scheduler-abc-1"
    env.update(HERALD_GRPC_ADDR="127.0.0.1:0", HERALD_HTTP_ADDR="127.0.0.1:0")
    scheduler = harness.Process(argv_of(sched), harness.base_env(**env), tmp_path / "scheduler.log")
    executor = None
    try:
        grpc_addr, http_addr = scheduler.ready["grpc"], scheduler.ready["http"]
        # What the kubelet's gRPC probes call: grpc.health.v1.Health/Check with their service.
        with grpc.insecure_channel(grpc_addr) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for probe in ("startupProbe", "readinessProbe"):
                reply = health.Check(health_pb2.HealthCheckRequest(service=sched[probe]["grpc"]["service"]), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, probe
        # What the liveness probe and the TLS variant's HTTP probes call.
        assert http_get(http_addr, sched["livenessProbe"]["httpGet"]["path"]) == 200
        assert http_get(http_addr, "/healthz") == 200
        assert http_get(http_addr, "/readyz") == 200

        # 3. The executor as its Deployment runs it: its sender file from the rendered ConfigMap.
        exe = one(objects, "Deployment", "herald-executor")["spec"]["template"]["spec"]
        container = exe["containers"][0]
        env = resolve_env(container, objects, secrets, "herald-executor-abc-1")
        config_path = Path(env["HERALD_EXECUTOR_CONFIG"])
        volume = next(v for v in exe["volumes"] if v["name"] == "senders")
        data = one(objects, "ConfigMap", volume["configMap"]["name"])["data"]
        local = tmp_path / config_path.name
        local.write_text(data[config_path.name])
        env.update(
            HERALD_EXECUTOR_CONFIG=str(local),
            HERALD_SCHEDULER=f"http://{grpc_addr}",
            HERALD_HTTP_ADDR="127.0.0.1:0",
        )
        executor = harness.Process(argv_of(container), harness.base_env(**env), tmp_path / "executor.log")
        # Ready once its lease session is open (it starts answering before it has one).
        probe = container["readinessProbe"]["httpGet"]["path"]
        deadline = time.monotonic() + 30
        while http_get(executor.ready["http"], probe) != 200:
            assert time.monotonic() < deadline, f"executor never ready\n{executor.log_tail()}"
            time.sleep(0.1)

        # The pair works: a task created now is sent by the log sender of the rendered config.
        pb = stubs.task_pb2
        with grpc.insecure_channel(grpc_addr) as ch:
            tasks = stubs.task_pb2_grpc.TaskServiceStub(ch)
            task = tasks.CreateTask(pb.CreateTaskRequest(task=pb.TaskSpec(
                queue="default", recipient="+15550001", content=pb.Content(text="smoke")))).task
            deadline = time.monotonic() + 30
            while (state := tasks.GetTask(pb.GetTaskRequest(id=task.id)).state) != pb.TASK_STATE_SUCCEEDED:
                assert time.monotonic() < deadline, f"task still {pb.TaskState.Name(state)}\n{executor.log_tail()}"
                time.sleep(0.1)
            attempts = tasks.ListAttempts(pb.ListAttemptsRequest(task_id=task.id)).attempts
            assert attempts[-1].executor_id == "herald-executor-abc-1"
    finally:
        if executor:
            assert executor.stop() == 0, executor.log_tail()
        assert scheduler.stop() == 0, scheduler.log_tail()


@chart
def test_whatsapp_webhook_values_open_the_port_to_the_ingress_only():
    """With executor.ports.whatsappWebhook set, the port is on the executor pods, its Service and
    its NetworkPolicy (from the configured peers only); without it, none of them mentions it."""
    objects, _ = render(load_values(CHART / "ci" / "whatsapp-webhook-values.yaml"))
    pod = one(objects, "Deployment", "herald-executor")["spec"]["template"]["spec"]
    ports = {p["name"]: p["containerPort"] for p in pod["containers"][0]["ports"]}
    assert ports["whatsapp-hook"] == 8443
    service = one(objects, "Service", "herald-executor")["spec"]["ports"]
    assert {"name": "whatsapp-hook", "port": 8443, "targetPort": "whatsapp-hook",
            "protocol": "TCP", "appProtocol": "http"} in service
    rules = one(objects, "NetworkPolicy", "herald-executor")["spec"]["ingress"]
    hook = [r for r in rules if r["ports"][0]["port"] == "whatsapp-hook"]
    assert len(hook) == 1
    assert hook[0]["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "ingress-nginx"}}}]

    plain, _ = render({"networkPolicy": {"enabled": True}})
    assert "whatsapp-hook" not in json.dumps(plain)
    assert one(plain, "NetworkPolicy", "herald-executor")["spec"]["ingress"] == []
