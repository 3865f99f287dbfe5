{{/* The chart's name, overridable. */}}
{{- define "herald.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: the prefix of every object (the scheduler's is <fullname>-scheduler). */}}
{{- define "herald.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "herald.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "herald.labels" -}}
helm.sh/chart: {{ include "herald.chart" . }}
app.kubernetes.io/name: {{ include "herald.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: herald
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "scheduler"). */}}
{{- define "herald.selectorLabels" -}}
app.kubernetes.io/name: {{ include "herald.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "herald.componentLabels" -}}
{{ include "herald.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "herald.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "herald.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "herald.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The Secret and key holding DATABASE_URL. */}}
{{/* A url in values wins: the chart then manages the Secret. Then a CloudNativePG cluster: */}}
{{/* its application Secret, whose `uri` names the cluster's -rw Service. */}}
{{- define "herald.databaseSecret" -}}
{{- if .Values.database.url -}}
{{- printf "%s-database" (include "herald.fullname" .) -}}
{{- else if (.Values.database.cloudNativePG).cluster -}}
{{- printf "%s-app" .Values.database.cloudNativePG.cluster -}}
{{- else -}}
{{- .Values.database.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "herald.databaseSecretKey" -}}
{{- if .Values.database.url -}}
DATABASE_URL
{{- else if (.Values.database.cloudNativePG).cluster -}}
uri
{{- else -}}
{{- .Values.database.existingSecretKey -}}
{{- end -}}
{{- end -}}

{{- define "herald.databaseEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "herald.databaseSecret" . }}
      key: {{ include "herald.databaseSecretKey" . }}
{{- end -}}

{{- define "herald.executorTokenSecret" -}}
{{- default .Values.auth.existingSecret .Values.auth.executorTokenSecret -}}
{{- end -}}

{{/* HERALD_SCHEDULER for executors. */}}
{{- define "herald.schedulerEndpoints" -}}
{{- if .Values.executor.schedulers -}}
{{- join "," .Values.executor.schedulers -}}
{{- else -}}
{{- printf "%s://%s-scheduler.%s.svc:%d" (ternary "https" "http" .Values.tls.enabled) (include "herald.fullname" .) .Release.Namespace (int .Values.scheduler.ports.grpc) -}}
{{- end -}}
{{- end -}}

{{/* The executor's sender file source: "secret", "configmap" (existing), "inline", or "". */}}
{{- define "herald.sendersSource" -}}
{{- if .Values.executor.senders.existingSecret -}}secret
{{- else if .Values.executor.senders.existingConfigMap -}}configmap
{{- else if .Values.executor.senders.inline -}}inline
{{- end -}}
{{- end -}}

{{/* Fails the render on combinations that cannot work. */}}
{{- define "herald.validate" -}}
{{- if and (not .Values.database.existingSecret) (not .Values.database.url) (not (.Values.database.cloudNativePG).cluster) -}}
{{- fail "database: set database.existingSecret (a Secret with the PostgreSQL URL), database.cloudNativePG.cluster or database.url" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) -}}
{{- fail "tls.enabled needs tls.existingSecret (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- if and .Values.tls.enabled .Values.tls.clientAuth.enabled .Values.executor.enabled (not .Values.tls.clientAuth.executorSecret) -}}
{{- fail "tls.clientAuth.enabled needs tls.clientAuth.executorSecret (the executors' client certificate)" -}}
{{- end -}}
{{- if and .Values.auth.enabled (not .Values.auth.existingSecret) -}}
{{- fail "auth.enabled needs auth.existingSecret (the Secret with the tokens file)" -}}
{{- end -}}
{{- end -}}

{{/*
A component's `config` map as ConfigMap data. Each key becomes the environment twin of the
binary's flag: HERALD_ and the key in upper snake case (claimBatch: HERALD_CLAIM_BATCH). A list
is joined with commas, and an empty one left out so that the binary's default applies. A whole
number is written without an exponent: Helm reads numbers as floats, and 10000000 would
otherwise become 1e+07, which the binary rejects. One rule instead of a line per setting: a new
setting is its flag, its default in values.yaml and its schema entry (test_chart checks every
rendered name against the binary's --help).
*/}}
{{- define "herald.configEnv" -}}
{{- range $key, $value := . }}
{{- if kindIs "slice" $value }}
{{- if $value }}
{{ printf "HERALD_%s" ($key | snakecase | upper) }}: {{ join "," $value | quote }}
{{- end }}
{{- else if and (kindIs "float64" $value) (eq $value (float64 (int64 $value))) }}
{{ printf "HERALD_%s" ($key | snakecase | upper) }}: {{ int64 $value | quote }}
{{- else }}
{{ printf "HERALD_%s" ($key | snakecase | upper) }}: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end -}}
