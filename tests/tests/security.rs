//! Security (issue #10): TLS and mutual TLS, tokens with roles over every RPC, namespaces
//! bound to tokens, the per-token rate, limits, start-up refusals, the HTTP listener's admin
//! check, and secrets kept out of logs and answers. Real binaries, real TLS over loopback.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::{Buf, BufMut, Bytes};
use herald_proto::v1::executor_message::Kind as Out;
use herald_proto::v1::lease_service_client::LeaseServiceClient;
use herald_proto::v1::schedule_service_client::ScheduleServiceClient;
use herald_proto::v1::task_service_client::TaskServiceClient;
use herald_proto::v1::{
    self as pb, CancelTaskRequest, CreateTaskRequest, CreateTasksRequest, GetTaskRequest,
    ListTasksRequest, OutcomeClass, TaskState,
};
use herald_tests::lease::{result, ScriptedExecutor};
use herald_tests::security::{authorize, write_tokens_file, TestPki, TestToken, TokensFile};
use herald_tests::{
    task_spec, ExecutorProcess, Response as HookResponse, SchedulerProcess, TestDb, WebhookReceiver,
};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

const WAIT: Duration = Duration::from_secs(30);

/// Which role each herald service requires: the policy this test holds the server to. A new
/// service must be added here, or the matrix test fails.
fn required_role(service: &str) -> Option<&'static str> {
    match service {
        "TaskService" | "TemplateService" | "ScheduleService" | "CampaignService"
        | "SuppressionService" | "AudienceService" => Some("client"),
        "LeaseService" => Some("executor"),
        "AccountService" | "StatsService" => Some("admin"),
        _ => None,
    }
}

/// Every `/herald.v1.<Service>/<Method>` path, from the descriptor set the server is built from.
fn every_rpc() -> Result<Vec<(String, String)>> {
    let set = prost_types::FileDescriptorSet::decode(herald_proto::FILE_DESCRIPTOR_SET)?;
    let mut rpcs = Vec::new();
    for file in set.file {
        if file.package() != "herald.v1" {
            continue;
        }
        for service in &file.service {
            for method in &service.method {
                rpcs.push((service.name().to_owned(), method.name().to_owned()));
            }
        }
    }
    Ok(rpcs)
}

/// Passes message bytes through unchanged, so any RPC can be called without its types.
#[derive(Clone, Copy, Default)]
struct RawCodec;
struct RawEncoder;
struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// Calls `path` with one empty message as `token`, and returns the status code it ends with.
async fn call_raw(channel: Channel, path: &str, token: Option<&TestToken>) -> Result<Code> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.context("channel not ready")?;
    let mut request = tonic::Request::new(tokio_stream::iter(vec![Bytes::new()]));
    authorize(&mut request, token, None);
    let path = http::uri::PathAndQuery::try_from(path)?;
    let code = match grpc.streaming(request, path, RawCodec).await {
        Err(status) => status.code(),
        Ok(response) => {
            let mut stream = response.into_inner();
            match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
                Ok(Err(status)) => status.code(),
                Ok(Ok(_)) | Err(_) => Code::Ok,
            }
        }
    };
    Ok(code)
}

async fn plain_channel(scheduler: &SchedulerProcess) -> Result<Channel> {
    Ok(Channel::from_shared(scheduler.grpc_url())?
        .connect()
        .await?)
}

/// A scheduler that requires the tokens in `file` (no anonymous access), over plaintext.
fn scheduler_with_tokens(db: &TestDb, file: &TokensFile) -> herald_tests::SchedulerBuilder {
    SchedulerProcess::builder(db)
        .env("HERALD_ALLOW_ANONYMOUS", "false")
        .env("HERALD_AUTH_TOKENS_FILE", &file.path)
}

#[tokio::test]
async fn every_rpc_needs_a_token_with_its_role() -> Result<()> {
    let db = TestDb::new().await?;
    let client = TestToken::new("app", &["client"], &["default"]);
    let executor = TestToken::new("worker", &["executor"], &["default"]);
    let admin = TestToken::new("ops", &["admin"], &["default"]);
    let file = write_tokens_file(&[client.clone(), executor.clone(), admin.clone()])?;
    let scheduler = scheduler_with_tokens(&db, &file).spawn().await?;
    let channel = plain_channel(&scheduler).await?;

    let rpcs = every_rpc()?;
    assert!(
        rpcs.len() > 30,
        "the descriptor set lists {} RPCs",
        rpcs.len()
    );
    let mut checked = 0;
    for (service, method) in &rpcs {
        let role = required_role(service)
            .with_context(|| format!("{service} is not in the test's role table"))?;
        let path = format!("/herald.v1.{service}/{method}");
        let anonymous = call_raw(channel.clone(), &path, None).await?;
        assert_eq!(anonymous, Code::Unauthenticated, "{path} without a token");
        let stranger = TestToken::new("stranger", &["admin"], &["default"]);
        let unknown = call_raw(channel.clone(), &path, Some(&stranger)).await?;
        assert_eq!(
            unknown,
            Code::Unauthenticated,
            "{path} with an unknown token"
        );
        for token in [&client, &executor, &admin] {
            let code = call_raw(channel.clone(), &path, Some(token)).await?;
            if token.roles[0] == role {
                assert!(
                    !matches!(code, Code::Unauthenticated | Code::PermissionDenied),
                    "{path} as {}: {code:?}",
                    token.name
                );
            } else {
                assert_eq!(code, Code::PermissionDenied, "{path} as {}", token.name);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, rpcs.len() * 3);

    // Probes and tools reach health without a token.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let reply = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    assert_eq!(reply.into_inner().status, 1, "SERVING");
    Ok(())
}

#[tokio::test]
async fn tls_is_served_and_the_lease_stream_requires_a_client_certificate() -> Result<()> {
    let db = TestDb::new().await?;
    let pki = TestPki::generate()?;
    let client = TestToken::new("app", &["client"], &["default"]);
    let executor = TestToken::new("worker", &["executor"], &["default"]);
    let file = write_tokens_file(&[client.clone(), executor.clone()])?;
    let scheduler = scheduler_with_tokens(&db, &file)
        .env("HERALD_ALLOW_PLAINTEXT", "false")
        .env("HERALD_TLS_CERT", &pki.server_cert)
        .env("HERALD_TLS_KEY", &pki.server_key)
        .env("HERALD_TLS_CLIENT_CA", &pki.ca)
        .spawn()
        .await?;
    let addr = scheduler.grpc_addr().to_owned();

    // A plaintext client gets nowhere.
    let plain = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await;
    if let Ok(channel) = plain {
        let mut tasks = TaskServiceClient::new(channel);
        let refused = tasks
            .get_task(client.request(GetTaskRequest { id: "x".into() }, None))
            .await;
        assert!(refused.is_err(), "plaintext call answered: {refused:?}");
    }

    // An application without a client certificate uses the client API over TLS.
    let app_channel = pki.channel(&addr, false).await?;
    let mut tasks = TaskServiceClient::new(app_channel.clone());
    let task = tasks
        .create_task(client.request(
            CreateTaskRequest {
                task: Some(task_spec("tls", "+15550100", "over TLS")),
            },
            None,
        ))
        .await?
        .into_inner()
        .task
        .context("no task")?;

    // The lease stream: without a client certificate, refused even with the executor token.
    let refused = ScriptedExecutor::connect_with(
        LeaseServiceClient::new(app_channel.clone()),
        &[("authorization", &executor.bearer())],
        "no-cert",
        &[],
        1,
    )
    .await;
    let message = format!(
        "{:#}",
        refused.err().context("lease without a certificate")?
    );
    assert!(message.contains("client certificate"), "{message}");
    // With a certificate but a client token: wrong role.
    let cert_channel = pki.channel(&addr, true).await?;
    let wrong_role = ScriptedExecutor::connect_with(
        LeaseServiceClient::new(cert_channel),
        &[("authorization", &client.bearer())],
        "wrong-role",
        &[],
        1,
    )
    .await;
    let message = format!(
        "{:#}",
        wrong_role.err().context("lease with a client token")?
    );
    assert!(
        message.contains("PermissionDenied") || message.contains("lacks the executor role"),
        "{message}"
    );

    // The executor binary over mutual TLS with its token file sends the task.
    let token_path =
        std::env::temp_dir().join(format!("herald-token-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&token_path, format!("{}\n", executor.token))?;
    let worker = ExecutorProcess::builder(&[format!("https://{addr}")])
        .env("HERALD_ALLOW_PLAINTEXT", "false")
        .env("HERALD_TLS_CA", &pki.ca)
        .env("HERALD_TLS_CERT", &pki.client_cert)
        .env("HERALD_TLS_KEY", &pki.client_key)
        .env("HERALD_AUTH_TOKEN_FILE", &token_path)
        .spawn()
        .await?;
    let mut authed = AuthedTasks {
        inner: tasks,
        token: client.clone(),
    };
    authed
        .wait_for_state(&task.id, TaskState::Succeeded)
        .await
        .with_context(|| worker.stderr_tail())?;
    let _ = std::fs::remove_file(&token_path);
    Ok(())
}

/// A TaskService client that adds its token to every call.
struct AuthedTasks {
    inner: TaskServiceClient<Channel>,
    token: TestToken,
}

impl AuthedTasks {
    async fn wait_for_state(&mut self, id: &str, state: TaskState) -> Result<pb::Task> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let task = self
                .inner
                .get_task(self.token.request(GetTaskRequest { id: id.into() }, None))
                .await?
                .into_inner();
            if task.state == state as i32 {
                return Ok(task);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("task {id} still {:?}", TaskState::try_from(task.state));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

#[tokio::test]
async fn insecure_configurations_are_refused_at_start() -> Result<()> {
    let db = TestDb::new().await?;
    let no_tls = SchedulerProcess::builder(&db)
        .env("HERALD_ALLOW_PLAINTEXT", "false")
        .spawn()
        .await;
    let message = format!("{:#}", no_tls.err().context("started without TLS")?);
    assert!(
        message.contains("refusing to serve gRPC without TLS"),
        "{message}"
    );

    let no_tokens = SchedulerProcess::builder(&db)
        .env("HERALD_ALLOW_ANONYMOUS", "false")
        .spawn()
        .await;
    let message = format!("{:#}", no_tokens.err().context("started without tokens")?);
    assert!(
        message.contains("refusing to serve without authentication"),
        "{message}"
    );

    // A token in clear where its hash belongs is refused, and the token is not echoed.
    let clear = std::env::temp_dir().join(format!(
        "herald-clear-{}.toml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &clear,
        "[[token]]\nname = \"app\"\nsha256 = \"hrld_plain_secret_value\"\nroles = [\"client\"]\nnamespaces = [\"default\"]\n",
    )?;
    let cleartext = SchedulerProcess::builder(&db)
        .env("HERALD_ALLOW_ANONYMOUS", "false")
        .env("HERALD_AUTH_TOKENS_FILE", &clear)
        .spawn()
        .await;
    let message = format!(
        "{:#}",
        cleartext.err().context("started with a clear token")?
    );
    assert!(message.contains("64 hex digits"), "{message}");
    assert!(!message.contains("hrld_plain_secret_value"), "{message}");
    let _ = std::fs::remove_file(&clear);

    // The executor will not send a token over plaintext unless told it may.
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .env("HERALD_ALLOW_PLAINTEXT", "false")
        .spawn()
        .await?;
    let status = executor.wait().await?;
    assert!(!status.success());
    assert!(
        executor
            .stderr_all()
            .contains("refusing plaintext endpoint"),
        "{}",
        executor.stderr_tail()
    );
    Ok(())
}

#[tokio::test]
async fn namespaces_cannot_see_cancel_or_lease_each_others_work() -> Result<()> {
    let db = TestDb::new().await?;
    let shop = TestToken::new("shop-app", &["client"], &["shop"]);
    let bank = TestToken::new("bank-app", &["client"], &["bank"]);
    let both = TestToken::new("ops-app", &["client"], &["shop", "bank"]);
    let shop_worker = TestToken::new("shop-worker", &["executor"], &["shop"]);
    let bank_worker = TestToken::new("bank-worker", &["executor"], &["bank"]);
    let file = write_tokens_file(&[
        shop.clone(),
        bank.clone(),
        both.clone(),
        shop_worker.clone(),
        bank_worker.clone(),
    ])?;
    let scheduler = scheduler_with_tokens(&db, &file).spawn().await?;
    let channel = plain_channel(&scheduler).await?;
    let mut tasks = TaskServiceClient::new(channel.clone());
    let create = |token: &TestToken, recipient: &str| {
        token.request(
            CreateTaskRequest {
                task: Some(task_spec("ns", recipient, "hello")),
            },
            None,
        )
    };
    let shop_task = tasks
        .create_task(create(&shop, "+15550201"))
        .await?
        .into_inner()
        .task
        .context("no task")?;
    let bank_task = tasks
        .create_task(create(&bank, "+15550202"))
        .await?
        .into_inner()
        .task
        .context("no task")?;

    // The bank cannot see, list or cancel the shop's task.
    let seen = tasks
        .get_task(bank.request(
            GetTaskRequest {
                id: shop_task.id.clone(),
            },
            None,
        ))
        .await;
    assert_eq!(seen.err().map(|s| s.code()), Some(Code::NotFound));
    let cancelled = tasks
        .cancel_task(bank.request(
            CancelTaskRequest {
                id: shop_task.id.clone(),
            },
            None,
        ))
        .await;
    assert_eq!(cancelled.err().map(|s| s.code()), Some(Code::NotFound));
    let listed = tasks
        .list_tasks(bank.request(ListTasksRequest::default(), None))
        .await?
        .into_inner()
        .tasks;
    assert_eq!(
        listed.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        vec![bank_task.id.as_str()]
    );
    // Naming a namespace the token lacks is refused; one it has is honoured.
    let foreign = tasks
        .list_tasks(shop.request(ListTasksRequest::default(), Some("bank")))
        .await;
    assert_eq!(
        foreign.err().map(|s| s.code()),
        Some(Code::PermissionDenied)
    );
    let in_bank = tasks
        .get_task(both.request(
            GetTaskRequest {
                id: bank_task.id.clone(),
            },
            Some("bank"),
        ))
        .await?;
    assert_eq!(in_bank.into_inner().id, bank_task.id);
    let in_shop_default = tasks
        .get_task(both.request(
            GetTaskRequest {
                id: bank_task.id.clone(),
            },
            None,
        ))
        .await;
    assert_eq!(
        in_shop_default.err().map(|s| s.code()),
        Some(Code::NotFound)
    );

    // Each executor is leased only its own namespace's task.
    let mut bank_exec = ScriptedExecutor::connect_with(
        LeaseServiceClient::new(channel.clone()),
        &[("authorization", &bank_worker.bearer())],
        "worker-1",
        &[],
        10,
    )
    .await?;
    let bank_leases = bank_exec.leases(1).await?;
    assert_eq!(bank_leases[0].task_id, bank_task.id);
    // Same executor id in the other namespace: ids are per namespace.
    let mut shop_exec = ScriptedExecutor::connect_with(
        LeaseServiceClient::new(channel.clone()),
        &[("authorization", &shop_worker.bearer())],
        "worker-1",
        &[],
        10,
    )
    .await?;
    let shop_leases = shop_exec.leases(1).await?;
    assert_eq!(shop_leases[0].task_id, shop_task.id);

    // The bank's executor cannot complete, extend or release the shop's lease.
    let acks = bank_exec
        .report(vec![result(&shop_leases[0], OutcomeClass::Ok)])
        .await?;
    assert_eq!(acks.len(), 1);
    assert!(!acks[0].accepted, "a foreign report was accepted");
    let extended = bank_exec.extend(&[&shop_leases[0]]).await?;
    assert!(extended.extended.is_empty() && extended.lost.len() == 1);
    bank_exec
        .send(Out::Release(pb::Release {
            leases: vec![herald_tests::lease::lease_ref(&shop_leases[0])],
        }))
        .await?;
    // A report on the bank stream after the release frame: once it is acknowledged, the
    // release has been handled too (frames are handled in order).
    let own = bank_exec
        .report(vec![result(&bank_leases[0], OutcomeClass::Ok)])
        .await?;
    assert!(own[0].accepted);
    let still = tasks
        .get_task(shop.request(
            GetTaskRequest {
                id: shop_task.id.clone(),
            },
            None,
        ))
        .await?
        .into_inner();
    assert_eq!(
        still.state,
        TaskState::Leased as i32,
        "the shop's lease was touched"
    );
    let acks = shop_exec
        .report(vec![result(&shop_leases[0], OutcomeClass::Ok)])
        .await?;
    assert!(acks[0].accepted);
    Ok(())
}

#[tokio::test]
async fn a_flooding_token_is_throttled_and_others_keep_being_served() -> Result<()> {
    let db = TestDb::new().await?;
    let flood = TestToken::new("flood", &["client"], &["default"]).with_rate(5, 5);
    let calm = TestToken::new("calm", &["client"], &["default"]);
    let file = write_tokens_file(&[flood.clone(), calm.clone()])?;
    let scheduler = scheduler_with_tokens(&db, &file).spawn().await?;
    let channel = plain_channel(&scheduler).await?;

    let mut calls = Vec::new();
    for i in 0..200 {
        let mut client = TaskServiceClient::new(channel.clone());
        let token = if i % 10 == 0 {
            calm.clone()
        } else {
            flood.clone()
        };
        calls.push(tokio::spawn(async move {
            let answer = client
                .list_tasks(token.request(ListTasksRequest::default(), None))
                .await;
            (
                token.name.clone(),
                answer.err().map(|s| (s.code(), s.message().to_owned())),
            )
        }));
    }
    let mut exhausted = 0;
    let mut calm_served = 0;
    for call in calls {
        let (name, error) = call.await?;
        match (name.as_str(), error) {
            ("calm", None) => calm_served += 1,
            ("calm", Some(e)) => bail!("the calm token was refused: {e:?}"),
            (_, Some((Code::ResourceExhausted, message))) => {
                assert!(message.contains("flood"), "{message}");
                exhausted += 1;
            }
            (_, Some(e)) => bail!("unexpected refusal: {e:?}"),
            (_, None) => {}
        }
    }
    assert_eq!(calm_served, 20);
    assert!(exhausted > 0, "the flooding token was never throttled");
    Ok(())
}

/// A client stream spends the token's rate per message, as the same batches sent as unary calls
/// would: over the rate it is slowed rather than failed (every batch is imported), and the
/// token has no room left afterwards. Counted once per stream, a token limited to a request a
/// second could push any number of 1,000-contact batches through one import.
#[tokio::test]
async fn a_client_stream_spends_the_tokens_rate_per_message() -> Result<()> {
    use herald_proto::v1::audience_service_client::AudienceServiceClient;
    use herald_proto::v1::{Audience, Contact, CreateAudienceRequest, ImportContactsRequest};
    const BATCHES: usize = 5;
    let db = TestDb::new().await?;
    let importer = TestToken::new("importer", &["client"], &["default"]).with_rate(1, 2);
    let setup = TestToken::new("setup", &["client"], &["default"]);
    let file = write_tokens_file(&[importer.clone(), setup.clone()])?;
    let scheduler = scheduler_with_tokens(&db, &file).spawn().await?;
    let channel = plain_channel(&scheduler).await?;
    let mut audiences = AudienceServiceClient::new(channel.clone());
    audiences
        .create_audience(setup.request(
            CreateAudienceRequest {
                audience: Some(Audience {
                    id: "paced".into(),
                    channel: pb::AudienceChannel::Wecom as i32,
                    ..Default::default()
                }),
            },
            None,
        ))
        .await?;
    let batches: Vec<ImportContactsRequest> = (0..BATCHES)
        .map(|i| ImportContactsRequest {
            audience_id: if i == 0 {
                "paced".into()
            } else {
                String::new()
            },
            contacts: vec![Contact {
                recipient: format!("member{i}"),
                ..Default::default()
            }],
        })
        .collect();
    let mut progress = audiences
        .import_contacts(importer.request(tokio_stream::iter(batches), None))
        .await?
        .into_inner();
    let mut last = None;
    while let Some(p) = progress.message().await? {
        last = Some(p);
    }
    let last = last.context("no progress")?;
    assert_eq!(
        (last.done, last.created),
        (true, BATCHES as i64),
        "{last:?}"
    );
    let after = TaskServiceClient::new(channel)
        .list_tasks(importer.request(ListTasksRequest::default(), None))
        .await
        .err()
        .context("the token had room left after a stream of five messages at one a second")?;
    assert_eq!(after.code(), Code::ResourceExhausted, "{after:?}");
    assert!(after.message().contains("importer"), "{}", after.message());
    Ok(())
}

#[tokio::test]
async fn oversized_messages_big_batches_and_busy_schedules_are_refused() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_MAX_MESSAGE_BYTES", "4096")
        .env("HERALD_MIN_SCHEDULE_PERIOD", "1m")
        .spawn()
        .await?;
    let channel = plain_channel(&scheduler).await?;
    let mut tasks = TaskServiceClient::new(channel.clone());

    let big = tasks
        .create_task(CreateTaskRequest {
            task: Some(task_spec("limits", "+15550301", &"x".repeat(8_000))),
        })
        .await;
    let status = big.err().context("an 8 KB message was accepted")?;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");

    let batch = tasks
        .create_tasks(CreateTasksRequest {
            tasks: vec![task_spec("limits", "+1", "x"); 1001],
            ..Default::default()
        })
        .await;
    // 1001 small specs fit in 4 KB? No: refused either as too large or as too many, never
    // accepted.
    let status = batch.err().context("a 1001-task batch was accepted")?;
    assert!(
        matches!(
            status.code(),
            Code::InvalidArgument | Code::ResourceExhausted
        ),
        "{status:?}"
    );

    let listed = tasks
        .list_tasks(ListTasksRequest::default())
        .await?
        .into_inner();
    assert!(listed.tasks.is_empty(), "a refused request wrote tasks");

    let mut schedules = ScheduleServiceClient::new(channel);
    let busy = schedules
        .create_schedule(pb::CreateScheduleRequest {
            schedule: Some(pb::ScheduleSpec {
                id: "every-ten-seconds".into(),
                cron: "*/10 * * * * *".into(),
                queue: "limits".into(),
                recipients: vec!["+15550302".into()],
                content: Some(pb::Content {
                    body: Some(pb::content::Body::Text("tick".into())),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await;
    let status = busy.err().context("a 10 s schedule was accepted")?;
    assert_eq!(status.code(), Code::InvalidArgument);
    let details =
        tonic_types::StatusExt::get_details_bad_request(&status).context("no field details")?;
    assert!(
        details
            .field_violations
            .iter()
            .any(|f| f.field == "schedule.cron" && f.description.contains("minimum period")),
        "{details:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_dashboard_requires_an_admin_token_and_metrics_can() -> Result<()> {
    let db = TestDb::new().await?;
    let admin = TestToken::new("ops", &["admin"], &["default"]);
    let everywhere = TestToken::new("scraper", &["admin"], &["*"]);
    let client = TestToken::new("app", &["client"], &["default"]);
    let file = write_tokens_file(&[admin.clone(), everywhere.clone(), client.clone()])?;
    let scheduler = scheduler_with_tokens(&db, &file)
        .env("HERALD_METRICS_AUTH", "true")
        .spawn()
        .await?;
    let http = reqwest::Client::new();
    let base = scheduler.http_url();
    for path in ["/healthz", "/readyz"] {
        let r = http.get(format!("{base}{path}")).send().await?;
        assert_eq!(r.status(), 200, "{path} is for probes");
    }
    for path in ["/dashboard/", "/dashboard/api/overview", "/metrics"] {
        let none = http.get(format!("{base}{path}")).send().await?;
        assert_eq!(none.status(), 401, "{path} without a token");
        assert!(none.headers().contains_key("www-authenticate"));
        let wrong = http
            .get(format!("{base}{path}"))
            .bearer_auth(&client.token)
            .send()
            .await?;
        assert_eq!(wrong.status(), 403, "{path} with a client token");
        // The metrics span every namespace: an admin of some may not read them.
        let admin = if path == "/metrics" {
            let bound = http
                .get(format!("{base}{path}"))
                .bearer_auth(&admin.token)
                .send()
                .await?;
            assert_eq!(bound.status(), 403, "{path} with a namespaced admin token");
            &everywhere
        } else {
            &admin
        };
        let bearer = http
            .get(format!("{base}{path}"))
            .bearer_auth(&admin.token)
            .send()
            .await?;
        assert_eq!(bearer.status(), 200, "{path} with the admin token");
        let basic = http
            .get(format!("{base}{path}"))
            .basic_auth("operator", Some(&admin.token))
            .send()
            .await?;
        assert_eq!(basic.status(), 200, "{path} with Basic auth");
    }
    // The HTTP listener binds namespaces by the same rule as the gRPC layer.
    for (namespace, status) in [("elsewhere", 403), ("Not A Name", 400), ("default", 200)] {
        let r = http
            .get(format!("{base}/dashboard/api/overview"))
            .bearer_auth(&admin.token)
            .header("x-herald-namespace", namespace)
            .send()
            .await?;
        assert_eq!(r.status(), status, "namespace {namespace:?}");
    }
    Ok(())
}

#[tokio::test]
async fn tokens_and_provider_secrets_never_reach_logs_or_answers() -> Result<()> {
    let db = TestDb::new().await?;
    let client = TestToken::new("app", &["client"], &["default"]);
    let worker = TestToken::new("worker", &["executor"], &["default"]);
    let file = write_tokens_file(&[client.clone(), worker.clone()])?;
    let scheduler = scheduler_with_tokens(&db, &file)
        .env("RUST_LOG", "debug")
        .spawn()
        .await?;
    let receiver = WebhookReceiver::start().await?;
    // First delivery fails, so retries and errors are logged too.
    receiver.respond_with(vec![HookResponse::status(500)]);
    let signing_secret = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LW9mLXRoaXJ0eS10d28hIQ==";
    let executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml(format!(
            "[queues.secret]\nsender = \"webhook\"\nurl = \"{}/hook\"\nsecret = \"{signing_secret}\"\n",
            receiver.url()
        ))
        .env("HERALD_AUTH_TOKEN", &worker.token)
        .env("RUST_LOG", "debug")
        .spawn()
        .await?;
    let channel = plain_channel(&scheduler).await?;
    let mut tasks = TaskServiceClient::new(channel.clone());
    let mut answers = Vec::new();
    let mut spec = task_spec("secret", "+15550401", "hello");
    spec.retry_policy = Some(pb::RetryPolicy {
        strategy: Some(pb::retry_policy::Strategy::Delays(pb::FixedDelays {
            delays: vec![prost_types::Duration {
                seconds: 0,
                nanos: 10_000_000,
            }],
        })),
    });
    let task = tasks
        .create_task(client.request(CreateTaskRequest { task: Some(spec) }, None))
        .await?
        .into_inner()
        .task
        .context("no task")?;
    answers.push(format!("{task:?}"));
    let mut authed = AuthedTasks {
        inner: tasks.clone(),
        token: client.clone(),
    };
    let done = authed
        .wait_for_state(&task.id, TaskState::Succeeded)
        .await?;
    answers.push(format!("{done:?}"));
    // Refusals: a wrong token, a token of the wrong role, a malformed header.
    for (token, label) in [(&worker, "wrong role"), (&client, "right")] {
        let answer = tasks
            .list_tasks(token.request(ListTasksRequest::default(), None))
            .await;
        answers.push(format!("{label}: {answer:?}"));
    }
    let mut bogus = tonic::Request::new(ListTasksRequest::default());
    bogus
        .metadata_mut()
        .insert("authorization", format!("Token {}", client.token).parse()?);
    answers.push(format!("{:?}", tasks.list_tasks(bogus).await));
    let mut misspelt = tonic::Request::new(GetTaskRequest {
        id: task.id.clone(),
    });
    misspelt.metadata_mut().insert(
        "authorization",
        format!("Bearer {}x", client.token).parse()?,
    );
    answers.push(format!("{:?}", tasks.get_task(misspelt).await));

    let mut logs = BTreeMap::new();
    logs.insert("scheduler", scheduler.stderr_all());
    logs.insert("executor", executor.stderr_all());
    assert!(
        logs["executor"].contains(&task.id),
        "the executor logged nothing about the task"
    );
    let secrets = [
        client.token.as_str(),
        worker.token.as_str(),
        signing_secret,
        "c2VjcmV0LXNpZ25pbmcta2V5LW9mLXRoaXJ0eS10d28hIQ",
    ];
    for secret in secrets {
        for (name, log) in &logs {
            assert!(!log.contains(secret), "the {name} log holds a secret");
        }
        for answer in &answers {
            assert!(
                !answer.contains(secret),
                "an answer holds a secret: {answer}"
            );
        }
    }
    // The hook got the signature, never the key.
    let requests = receiver.requests();
    assert!(requests
        .iter()
        .all(|r| !format!("{r:?}").contains("c2VjcmV0")));
    Ok(())
}

#[tokio::test]
async fn the_token_command_prints_a_token_whose_entry_the_scheduler_accepts() -> Result<()> {
    let out = std::process::Command::new(herald_tests::herald_binary("herald-scheduler")?)
        .args([
            "token",
            "--name",
            "shop",
            "--roles",
            "client",
            "--namespaces",
            "shop",
        ])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let (token, entry) = text.split_once('\n').context("no token line")?;
    assert!(
        token.starts_with("hrld_") && !entry.contains(token),
        "{text}"
    );
    let file =
        std::env::temp_dir().join(format!("herald-cli-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, entry)?;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_ALLOW_ANONYMOUS", "false")
        .env("HERALD_AUTH_TOKENS_FILE", &file)
        .spawn()
        .await?;
    let mut tasks = TaskServiceClient::new(plain_channel(&scheduler).await?);
    let mut request = tonic::Request::new(ListTasksRequest::default());
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    tasks.list_tasks(request).await?;
    let _ = std::fs::remove_file(&file);
    Ok(())
}

/// The scheduler speaks TLS to PostgreSQL as `DATABASE_URL`'s `sslmode` asks: `verify-full`
/// against a CA named by `PGSSLROOTCERT`, and `require` without a check. Every session it opens
/// is encrypted. Before, every connection was plaintext whatever the URL said, `require` could
/// not connect and `verify-full` was refused as an invalid URL.
#[tokio::test]
async fn the_database_connection_is_encrypted_as_sslmode_asks() -> Result<()> {
    let (cluster, ca) = herald_tests::PgCluster::start_with_tls().await?;
    let placeholder = TestDb::new().await?;
    let conn = cluster.connect().await?;
    for (mode, roots) in [("verify-full", Some(&ca)), ("require", None)] {
        let mut builder = SchedulerProcess::builder(&placeholder)
            .env("DATABASE_URL", format!("{}?sslmode={mode}", cluster.url()));
        if let Some(roots) = roots {
            builder = builder.env("PGSSLROOTCERT", roots);
        }
        let scheduler = builder.spawn().await?;
        let mut tasks = herald_tests::connect_tasks(&scheduler.grpc_url()).await?;
        herald_tests::create_task(&mut tasks, task_spec("q", "+15550101", "hi")).await?;
        let row = conn
            .query_one(
                "SELECT count(*) FILTER (WHERE s.ssl) AS encrypted, count(*) AS sessions
                 FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                 WHERE a.datname = 'herald' AND a.backend_type = 'client backend'
                   AND a.pid <> pg_backend_pid()",
                &[],
            )
            .await?;
        let (encrypted, sessions): (i64, i64) = (row.get("encrypted"), row.get("sessions"));
        if sessions == 0 || encrypted != sessions {
            bail!("sslmode={mode}: {encrypted} of {sessions} sessions encrypted");
        }
        drop(scheduler);
        // The next mode's sessions only.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = 'herald' AND backend_type = 'client backend'
               AND pid <> pg_backend_pid()",
            &[],
        )
        .await?;
    }
    Ok(())
}
