//! `[accounts.*]` end to end: the config file's errors name their line, and a lease naming a
//! `credentials_ref` goes to that account's sender through the real lease session (against a
//! scripted scheduler), with unknown accounts reported ACCOUNT_UNAVAILABLE and WhatsApp's pair
//! limit reported with rate_limit_scope RECIPIENT.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use herald_executor::{Config, ConfigError, SenderRoutes};
use herald_proto::v1 as pb;
use herald_proto::v1::lease_service_server::{LeaseService, LeaseServiceServer};
use herald_tests::fakes::whatsapp::{FakeWhatsApp, Scripted};
use pb::executor_message::Kind as Out;
use pb::scheduler_message::Kind as In;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

fn line_of(err: &ConfigError) -> usize {
    match err {
        ConfigError::Invalid { line, .. } | ConfigError::Syntax { line, .. } => *line,
        other => panic!("unexpected error {other}"),
    }
}

#[test]
fn bad_account_tables_name_the_line() {
    let cases: &[(&str, usize, &str)] = &[
        (
            "[accounts.wa]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1\"\naccess_token = { env = \"NOPE\" }\n",
            4,
            "NOPE",
        ),
        (
            "[accounts.wa]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1\"\naccess_token = \"t\"\n\ncorp_id = \"x\"\n",
            6,
            "account wa: whatsapp_cloud sender: unknown field `corp_id`, expected one of `phone_number_id`",
        ),
        ("[accounts.x]\n\nsender = \"fax\"\n", 3, "unknown sender \"fax\" (expected one of \"whatsapp_cloud\""),
        (
            "[accounts.w]\nsender = \"wecom\"\ncorp_id = \"c\"\ncorp_secret = \"s\"\nagent_id = 1\nmessage_type = \"video\"\n",
            6,
            "message_type",
        ),
        (
            "[accounts.w]\nsender = \"wecom\"\ncorp_id = \"c\"\ncorp_secret = \"s\"\nagent_id = 1\nduplicate_check_interval = \"5h\"\n",
            6,
            "4h",
        ),
        (
            "[accounts.w]\nsender = \"wecom\"\ncorp_id = \"c\"\ncorp_secret = \"s\"\nagent_id = 1\ncard_button = \"查看更多详情\"\n",
            6,
            "card_button",
        ),
        (
            "[accounts.w]\nsender = \"wecom\"\ncorp_id = \"c\"\ncorp_secret = \"s\"\nagent_id = 1\ncard_url = \"example.com\"\n",
            6,
            "card_url",
        ),
        (
            "[accounts.w]\nsender = \"wecom\"\ncorp_id = \"c\"\ncorp_secret = { file = \"/nonexistent/secret\" }\nagent_id = 1\n",
            4,
            "cannot read secret file",
        ),
        (
            "[accounts.r]\nsender = \"wecom_robot\"\nwebhook_key = \"k\"\nurl = \"https://x/\"\n",
            4,
            "not both",
        ),
        (
            "[accounts.w]\nsender = \"wecom\"\ncorp_id = \"c\"\nagent_id = 1\n",
            1,
            "account w: wecom sender: missing field `corp_secret`",
        ),
        ("[accounts.w]\nsender = \"wecom\"\nagent_id = \n", 3, ""),
        ("[accounts.wa]\nsender = \"whatsapp_cloud\"\ntoken = \"x\"\n", 3, "token"),
    ];
    for (src, line, needle) in cases {
        let err = common::routes(src, &[]).expect_err(src);
        assert_eq!(line_of(&err), *line, "{src}\n→ {err}");
        assert!(
            err.to_string()
                .starts_with(&format!("executor.toml:{line}")),
            "{err}"
        );
        assert!(err.to_string().contains(needle), "{err}");
    }
}

#[test]
fn secrets_stay_out_of_config_errors_and_debug() {
    let src = "[accounts.wa]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1\"\naccess_token = \"EAA-literal-s3cret\"\napi_version = \"23\"\n";
    let err = common::routes(src, &[]).unwrap_err();
    assert!(!err.to_string().contains("s3cret"), "{err}");
    let ok = common::routes(
        "[accounts.wa]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1\"\naccess_token = \"EAA-literal-s3cret\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(ok.accounts(), ["wa"]);
    let debug = format!("{ok:?} {:?}", ok.account("wa").unwrap().sender);
    assert!(!debug.contains("s3cret"), "{debug}");
}

struct Fake {
    sessions: mpsc::UnboundedSender<(Streaming<pb::ExecutorMessage>, Outbox)>,
}

type Outbox = mpsc::UnboundedSender<Result<pb::SchedulerMessage, Status>>;

#[tonic::async_trait]
impl LeaseService for Fake {
    type LeaseStream = UnboundedReceiverStream<Result<pb::SchedulerMessage, Status>>;

    async fn lease(
        &self,
        request: Request<Streaming<pb::ExecutorMessage>>,
    ) -> Result<Response<Self::LeaseStream>, Status> {
        let (out, rx) = mpsc::unbounded_channel();
        self.sessions
            .send((request.into_inner(), out))
            .map_err(|_| Status::unavailable("test over"))?;
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }

    async fn record_provider_events(
        &self,
        _request: Request<pb::RecordProviderEventsRequest>,
    ) -> Result<Response<pb::RecordProviderEventsResponse>, Status> {
        Err(Status::unimplemented(
            "provider events are not part of this fake",
        ))
    }
}

async fn next(inbound: &mut Streaming<pb::ExecutorMessage>) -> Out {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), inbound.message())
            .await
            .expect("no frame within 10 s")
            .expect("stream error")
            .expect("stream closed");
        match frame.kind.expect("empty frame") {
            Out::Heartbeat(_) | Out::Credit(_) => continue,
            kind => return kind,
        }
    }
}

fn lease(task_id: &str, credentials_ref: &str) -> pb::Lease {
    pb::Lease {
        recipient: "16505551234".into(),
        account_id: format!("id-{credentials_ref}"),
        credentials_ref: credentials_ref.into(),
        ..common::text_lease(task_id, "whatever")
    }
}

/// An executor running `routes` against the scripted scheduler, past Hello and Welcome.
struct Session {
    inbound: Streaming<pb::ExecutorMessage>,
    out: Outbox,
    hello: pb::Hello,
}

impl Session {
    async fn start(routes: SenderRoutes) -> Session {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut sessions) = mpsc::unbounded_channel();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(LeaseServiceServer::new(Fake { sessions: tx }))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        let mut config = Config::for_schedulers([format!("http://{addr}")]);
        config.max_in_flight = 4;
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        tokio::spawn(herald_executor::run(
            config,
            routes,
            http,
            std::future::pending(),
        ));

        let (mut inbound, out) = tokio::time::timeout(Duration::from_secs(10), sessions.recv())
            .await
            .expect("executor connects")
            .unwrap();
        let Out::Hello(hello) = next(&mut inbound).await else {
            panic!("first frame is not Hello")
        };
        let session = Session {
            inbound,
            out,
            hello,
        };
        session.send(In::Welcome(pb::Welcome {
            protocol_version: 1,
            heartbeat_interval: Some(prost_types::Duration {
                seconds: 10,
                nanos: 0,
            }),
            lease_ttl: Some(prost_types::Duration {
                seconds: 30,
                nanos: 0,
            }),
            scheduler_id: "fake".into(),
        }));
        session
    }

    fn send(&self, kind: In) {
        self.out
            .send(Ok(pb::SchedulerMessage { kind: Some(kind) }))
            .unwrap()
    }

    /// Grants `lease` and returns the executor's report of it.
    async fn report(&mut self, lease: pb::Lease) -> pb::AttemptResult {
        self.send(In::Leases(pb::LeaseBatch {
            leases: vec![lease],
        }));
        let Out::Report(batch) = next(&mut self.inbound).await else {
            panic!("expected a report")
        };
        let r = batch.results.into_iter().next().unwrap();
        self.send(In::ReportAcks(pb::ReportAckBatch {
            acks: vec![pb::ReportAck {
                task_id: r.task_id.clone(),
                attempt: r.attempt,
                accepted: true,
                state: 0,
                ..Default::default()
            }],
        }));
        r
    }
}

#[tokio::test]
async fn leases_go_to_the_account_named_by_credentials_ref() {
    let wa = FakeWhatsApp::start("1065", "tok").await.unwrap();
    let routes = common::routes(
        &format!(
            "[accounts.wa]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1065\"\naccess_token = \"tok\"\nbase_url = \"{}\"\n",
            wa.base_url()
        ),
        &[],
    )
    .unwrap();
    let mut session = Session::start(routes).await;
    assert_eq!(session.hello.credentials_refs, ["wa"]);
    assert!(
        session.hello.queues.is_empty(),
        "only accounts: every queue"
    );

    let ok = session.report(lease("t-ok", "wa")).await;
    assert_eq!(ok.outcome(), pb::OutcomeClass::Ok, "{ok:?}");
    assert!(ok.provider_message_id.starts_with("wamid."), "{ok:?}");
    assert_eq!(wa.requests()[0].body["biz_opaque_callback_data"], "t-ok/1");

    wa.respond_next(Scripted::Code(131056));
    let pair = session.report(lease("t-pair", "wa")).await;
    assert_eq!(pair.outcome(), pb::OutcomeClass::RateLimited, "{pair:?}");
    assert_eq!(pair.rate_limit_scope(), pb::RateLimitScope::Recipient);
    assert!(pair.error.starts_with("[recipient] "), "{pair:?}");

    wa.respond_next(Scripted::Code(130429));
    let throughput = session.report(lease("t-thr", "wa")).await;
    assert_eq!(throughput.rate_limit_scope(), pb::RateLimitScope::Account);

    let unknown = session.report(lease("t-unknown", "elsewhere")).await;
    assert_eq!(unknown.outcome(), pb::OutcomeClass::AccountUnavailable);
    assert_eq!(
        unknown.error,
        "no credentials for account elsewhere in this executor"
    );
    assert_eq!(wa.requests().len(), 3);
}

/// `[accounts."*"]` (what script/server's executor has): Hello announces no credentials
/// refs, which the scheduler reads as "any account", and a lease for an account without a
/// table of its own is sent by the catch-all's sender, while a named table still wins.
#[tokio::test]
async fn the_catch_all_account_sends_for_any_account_and_announces_none() {
    let wa = FakeWhatsApp::start("1065", "tok").await.unwrap();
    let routes = common::routes(
        &format!(
            "[accounts.\"*\"]\nsender = \"log\"\n\n[accounts.wa]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1065\"\naccess_token = \"tok\"\nbase_url = \"{}\"\n",
            wa.base_url()
        ),
        &[],
    )
    .unwrap();
    let mut session = Session::start(routes).await;
    assert!(
        session.hello.credentials_refs.is_empty(),
        "{:?}",
        session.hello
    );
    assert!(
        session.hello.queues.is_empty(),
        "only accounts: every queue"
    );

    let any = session
        .report(lease("t-any", "wa-created-by-the-api"))
        .await;
    assert_eq!(any.outcome(), pb::OutcomeClass::Ok, "{any:?}");
    assert!(
        any.provider_message_id.is_empty(),
        "the log sender: {any:?}"
    );
    assert!(wa.requests().is_empty());

    let named = session.report(lease("t-named", "wa")).await;
    assert_eq!(named.outcome(), pb::OutcomeClass::Ok, "{named:?}");
    assert!(named.provider_message_id.starts_with("wamid."), "{named:?}");
    assert_eq!(wa.requests().len(), 1);
}
