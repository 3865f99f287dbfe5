//! The wecom and wecom_robot senders against the fake WeCom API: request shapes, duplicate
//! check on retries, token caching, expiry and single-flight refresh, partial failure, the
//! executor-kept per-member limit, and every row of providers.md §2.5 and §2.6.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{account_sender, request, send, text};
use herald_executor::{BoxSender, Content, OutcomeClass};
use herald_tests::fakes::wecom::{FakeWeCom, Scripted, ERROR_ROWS};

const CORP: &str = "ww-corp";
const SECRET: &str = "corp-s3cr3t-value";
const AGENT: i64 = 1000002;
const ROBOT_KEY: &str = "robot-key-s3cr3t";

fn config(base_url: &str, extra: &str) -> String {
    format!(
        "[accounts.app]\nsender = \"wecom\"\ncorp_id = \"{CORP}\"\ncorp_secret = {{ env = \"WECOM_SECRET\" }}\nagent_id = {AGENT}\nbase_url = \"{base_url}\"\nduplicate_check_interval = \"2h\"\n{extra}\n\
         [accounts.robot]\nsender = \"wecom_robot\"\nwebhook_key = {{ env = \"ROBOT_KEY\" }}\nbase_url = \"{base_url}\"\n"
    )
}

const ENV: &[(&str, &str)] = &[("WECOM_SECRET", SECRET), ("ROBOT_KEY", ROBOT_KEY)];

async fn setup_with(extra: &str) -> (FakeWeCom, BoxSender) {
    let fake = FakeWeCom::start(CORP, SECRET, AGENT, ROBOT_KEY)
        .await
        .unwrap();
    let sender = account_sender(&config(&fake.base_url(), extra), ENV, "app");
    (fake, sender)
}

async fn setup() -> (FakeWeCom, BoxSender) {
    setup_with("").await
}

#[tokio::test]
async fn text_message_shape_msgid_and_duplicate_check_on_retries() {
    let (fake, sender) = setup().await;
    let receipt = send(&sender, request("t1", "alice", text("你好")))
        .await
        .unwrap();
    let mut retry = request("t1", "alice", text("你好"));
    retry.attempt = 2;
    retry.attempts_before = 1;
    send(&sender, retry).await.unwrap();
    let sends = fake.sends();
    assert_eq!(sends.len(), 2);
    let first = &sends[0];
    assert_eq!(first.errcode, 0, "{:?}", first.body);
    assert_eq!(first.credential.as_deref(), Some("tok-1"));
    assert_eq!(first.body["touser"], "alice");
    assert_eq!(first.body["msgtype"], "text");
    assert_eq!(first.body["agentid"], AGENT);
    assert_eq!(first.body["text"]["content"], "你好");
    assert!(first.body.get("enable_duplicate_check").is_none());
    assert_eq!(receipt.provider_message_id.as_deref(), Some("msg-2"));
    assert_eq!(receipt.note, None);
    let second = &sends[1];
    assert_eq!(second.body["enable_duplicate_check"], 1);
    assert_eq!(second.body["duplicate_check_interval"], 7200);
}

/// With `duplicate_check = "always"` the first attempt asks for the check too, so its retry
/// after a lost answer is the identical request WeCom matches.
#[tokio::test]
async fn duplicate_check_always_covers_the_first_attempt() {
    let (fake, sender) = setup_with("duplicate_check = \"always\"").await;
    send(&sender, request("t1", "alice", text("hi")))
        .await
        .unwrap();
    let first = &fake.sends()[0];
    assert_eq!(first.body["enable_duplicate_check"], 1);
    assert_eq!(first.body["duplicate_check_interval"], 7200);
}

/// Text asking for a link preview (WhatsApp's `preview_url`) is text as any other here: the
/// account's message type and the robot's mentions still apply.
#[tokio::test]
async fn text_with_a_link_preview_keeps_the_message_type_and_mentions() {
    let previewed = |body: &str| {
        Content::from_proto(Some(herald_proto::v1::Content {
            body: Some(herald_proto::v1::content::Body::Text(body.into())),
            link_preview: true,
        }))
        .unwrap()
    };
    let (fake, sender) = setup_with("message_type = \"markdown\"").await;
    send(
        &sender,
        request("t", "alice", previewed("**see https://x.example**")),
    )
    .await
    .unwrap();
    assert_eq!(fake.sends()[0].body["msgtype"], "markdown");
    assert_eq!(
        fake.sends()[0].body["markdown"]["content"],
        "**see https://x.example**"
    );
    let (fake, sender) = robot().await;
    send(
        &sender,
        request("t", "alice|@all", previewed("deploy done")),
    )
    .await
    .unwrap();
    let r = &fake.robot_requests()[0];
    assert_eq!(r.body["msgtype"], "text");
    assert_eq!(
        r.body["text"]["mentioned_list"],
        serde_json::json!(["alice", "@all"])
    );
}

#[tokio::test]
async fn markdown_and_textcard_shapes() {
    let (fake, sender) = setup_with("message_type = \"markdown\"").await;
    send(&sender, request("t", "alice", text("**hi**")))
        .await
        .unwrap();
    assert_eq!(fake.sends()[0].body["markdown"]["content"], "**hi**");

    let (fake, sender) = setup_with(
        "message_type = \"textcard\"\ncard_url = \"https://example.com/x\"\ncard_button = \"更多\"",
    )
    .await;
    // No title anywhere: refused before sending.
    let err = send(&sender, request("t", "alice", text("body")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::Permanent, "{err}");
    let mut req = request("t", "alice", text("body"));
    req.labels.insert("title".into(), "Order shipped".into());
    send(&sender, req).await.unwrap();
    let card = &fake.sends()[0].body["textcard"];
    assert_eq!(card["title"], "Order shipped");
    assert_eq!(card["description"], "body");
    assert_eq!(card["url"], "https://example.com/x");
    assert_eq!(card["btntxt"], "更多");
    // WeCom cuts a description past 512 bytes without a word: refused before sending instead.
    let mut long = request("t2", "alice", text(&"x".repeat(513)));
    long.labels.insert("title".into(), "Order shipped".into());
    let err = send(&sender, long).await.unwrap_err();
    assert_eq!(err.class, OutcomeClass::Permanent, "{err}");
    assert!(err.message.contains("description"), "{err}");
    assert_eq!(fake.sends().len(), 1);
}

#[tokio::test]
async fn templates_and_oversized_text_are_permanent_before_sending() {
    let (fake, sender) = setup().await;
    let err = send(
        &sender,
        request(
            "t",
            "alice",
            Content::Template {
                template_id: "x".into(),
                language: "zh_CN".into(),
                variables: Default::default(),
            },
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(err.class, OutcomeClass::Permanent);
    assert!(err.message.contains("wecom needs rendered text"), "{err}");
    let err = send(&sender, request("t", "alice", text(&"字".repeat(683))))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::Permanent, "{err}");
    assert!(fake.sends().is_empty());
    assert_eq!(fake.gettoken_calls(), 0);
}

#[tokio::test]
async fn token_is_cached() {
    let (fake, sender) = setup().await;
    for i in 0..5 {
        send(&sender, request(&format!("t{i}"), "alice", text("hi")))
            .await
            .unwrap();
    }
    assert_eq!(fake.gettoken_calls(), 1);
}

#[tokio::test]
async fn a_token_lifetime_past_any_clock_is_capped_not_a_panic() {
    let (fake, sender) = setup().await;
    // Not what WeCom documents (7200), but what a broken gettoken or a proxy could answer:
    // added to the clock unchecked it overflowed and the send panicked.
    fake.set_expires_in(u64::MAX);
    for i in 0..3 {
        send(&sender, request(&format!("t{i}"), "alice", text("hi")))
            .await
            .unwrap();
    }
    assert_eq!(fake.gettoken_calls(), 1);
    assert_eq!(fake.sends().len(), 3);
}

#[tokio::test]
async fn token_past_its_lifetime_is_fetched_again() {
    let (fake, sender) = setup().await;
    // expires_in 0: the token is stale as soon as it is cached.
    fake.set_expires_in(0);
    send(&sender, request("t1", "alice", text("hi")))
        .await
        .unwrap();
    send(&sender, request("t2", "alice", text("hi")))
        .await
        .unwrap();
    assert_eq!(fake.gettoken_calls(), 2);
    let creds: Vec<_> = fake
        .sends()
        .into_iter()
        .map(|s| s.credential.unwrap())
        .collect();
    assert_eq!(creds, ["tok-1", "tok-3"]);
}

#[tokio::test]
async fn expired_or_invalid_token_is_refreshed_once_and_the_send_retried() {
    for (errcode, mark) in [(42001, "expire"), (40014, "invalidate")] {
        let (fake, sender) = setup().await;
        send(&sender, request("t0", "alice", text("hi")))
            .await
            .unwrap();
        if mark == "expire" {
            fake.expire_tokens();
        } else {
            fake.invalidate_tokens();
        }
        let receipt = send(&sender, request("t1", "alice", text("hi")))
            .await
            .unwrap();
        assert!(receipt.provider_message_id.is_some());
        assert_eq!(fake.gettoken_calls(), 2, "errcode {errcode}");
        let sends = fake.sends();
        assert_eq!(sends.len(), 3);
        assert_eq!(sends[1].errcode, errcode);
        assert_eq!(sends[2].errcode, 0);
        assert_ne!(sends[1].credential, sends[2].credential);
    }
}

#[tokio::test]
async fn token_rejected_again_after_refresh_is_account_unavailable() {
    let (fake, sender) = setup().await;
    fake.respond_next_send(Scripted::Errcode(42001));
    fake.respond_next_send(Scripted::Errcode(40014));
    let err = send(&sender, request("t", "alice", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::AccountUnavailable, "{err}");
    assert_eq!(fake.sends().len(), 2, "retried exactly once");
    assert_eq!(fake.gettoken_calls(), 2);
}

#[tokio::test]
async fn failed_refresh_is_account_unavailable() {
    let (fake, sender) = setup().await;
    send(&sender, request("t0", "alice", text("hi")))
        .await
        .unwrap();
    fake.invalidate_tokens();
    fake.fail_next_gettoken(40001);
    let err = send(&sender, request("t1", "alice", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::AccountUnavailable, "{err}");
    assert!(!err.message.contains(SECRET));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_sends_after_invalidation_refresh_once() {
    let (fake, sender) = setup().await;
    send(&sender, request("t0", "u0", text("hi")))
        .await
        .unwrap();
    fake.invalidate_tokens();
    fake.set_gettoken_delay(Duration::from_millis(200));
    let sends: Vec<_> = (1..=20)
        .map(|i| {
            let sender = sender.clone();
            tokio::spawn(async move {
                send(
                    &sender,
                    request(&format!("t{i}"), &format!("u{i}"), text("hi")),
                )
                .await
            })
        })
        .collect();
    for s in sends {
        s.await.unwrap().unwrap();
    }
    assert_eq!(fake.gettoken_calls(), 2, "one initial fetch, one refresh");
}

#[tokio::test]
async fn gettoken_errors_are_classified() {
    for (errcode, class) in [
        (40001, OutcomeClass::AccountUnavailable),
        (40013, OutcomeClass::AccountUnavailable),
        (40091, OutcomeClass::AccountUnavailable),
        (60020, OutcomeClass::AccountUnavailable),
        (45009, OutcomeClass::RateLimited),
        (-1, OutcomeClass::Transient),
    ] {
        let (fake, sender) = setup().await;
        fake.fail_next_gettoken(errcode);
        let err = send(&sender, request("t", "alice", text("hi")))
            .await
            .unwrap_err();
        assert_eq!(err.class, class, "gettoken errcode {errcode}: {err}");
        assert!(fake.sends().is_empty());
    }
    // A wrong secret in the config: the fake's own check answers 40001.
    let fake = FakeWeCom::start(CORP, SECRET, AGENT, ROBOT_KEY)
        .await
        .unwrap();
    let sender = account_sender(
        &config(&fake.base_url(), ""),
        &[("WECOM_SECRET", "wrong"), ("ROBOT_KEY", "k")],
        "app",
    );
    let err = send(&sender, request("t", "alice", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::AccountUnavailable, "{err}");
}

/// The class providers.md §2.5 gives each errcode of `message/send`.
fn expected(errcode: i64) -> OutcomeClass {
    use OutcomeClass::*;
    match errcode {
        -1 => Transient,
        45009 | 45033 | 130101 => RateLimited,
        40001 | 40013 | 40091 | 60020 | 48002 | 48006 | 50003 | 40056 | 45024 | 93000 => {
            AccountUnavailable
        }
        41001 | 81013 | 82001 | 82002 | 82003 | 40003 | 46004 | 60111 | 60011 | 60021 | 40008
        | 44004 | 45002 | 82004 | 40033 | 40035 | 40058 | 40007 | 40004 | 40006 | 45001 | 43004 => {
            Permanent
        }
        other => panic!("errcode {other} has no expected class in this test"),
    }
}

#[tokio::test]
async fn every_errcode_row_is_classified() {
    let (fake, sender) = setup().await;
    let mut tested = 0;
    for (errcode, _) in ERROR_ROWS {
        if matches!(errcode, 40014 | 42001) {
            continue; // refresh and retry: tested above
        }
        fake.respond_next_send(Scripted::Errcode(*errcode));
        // One member per row: the executor's own 30-a-minute limit must not answer first.
        let err = send(&sender, request("t", &format!("user{tested}"), text("hi")))
            .await
            .expect_err(&format!("errcode {errcode} must fail"));
        assert_eq!(err.class, expected(*errcode), "errcode {errcode}: {err}");
        if *errcode == 45009 {
            assert!(err.retry_after >= Some(Duration::from_secs(60)), "{err:?}");
        }
        if *errcode == 130101 {
            assert!(err.retry_after >= Some(Duration::from_secs(600)), "{err:?}");
        }
        tested += 1;
    }
    assert_eq!(
        fake.gettoken_calls(),
        1,
        "no errcode but 40014/42001 refreshes the token"
    );
    assert_eq!(tested, ERROR_ROWS.len() - 2);
}

#[tokio::test]
async fn unknown_errcode_is_transient_once_then_permanent() {
    let (fake, sender) = setup().await;
    fake.respond_next_send(Scripted::Errcode(12345));
    let err = send(&sender, request("t", "alice", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::Transient, "{err}");
    fake.respond_next_send(Scripted::Errcode(12345));
    let mut retry = request("t", "alice", text("hi"));
    retry.attempt = 2;
    retry.attempts_before = 1;
    let err = send(&sender, retry).await.unwrap_err();
    assert_eq!(err.class, OutcomeClass::Permanent, "{err}");
}

#[tokio::test]
async fn http_errors_and_garbage_are_transient() {
    let (fake, sender) = setup().await;
    for (status, body, class) in [
        (502, "Bad Gateway", OutcomeClass::Transient),
        (504, "Gateway Timeout", OutcomeClass::Transient),
        (500, "", OutcomeClass::Transient),
        (429, "", OutcomeClass::RateLimited),
        (200, "<html>not json</html>", OutcomeClass::Transient),
    ] {
        fake.respond_next_send(Scripted::Raw(status, body.into()));
        let err = send(&sender, request("t", "alice", text("hi")))
            .await
            .unwrap_err();
        assert_eq!(err.class, class, "HTTP {status}: {err}");
    }
}

#[tokio::test]
async fn invalid_users_partial_and_total() {
    let (fake, sender) = setup().await;
    fake.set_users(&["alice", "Carol"]);
    let receipt = send(&sender, request("t", "alice|Bob|carol", text("hi")))
        .await
        .unwrap();
    let note = receipt.note.expect("partial failure noted");
    assert!(note.contains("invaliduser: bob"), "{note}");
    assert!(receipt.provider_message_id.is_some());
    let err = send(&sender, request("t", "bob|dave", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::Permanent, "{err}");
    assert!(err.message.contains("81013"), "{err}");
    // A member without a licence is accepted and listed, never delivered: with nobody else
    // asked, nothing went out.
    fake.set_unlicensed(&["carol"]);
    let err = send(&sender, request("t2", "Carol", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::Permanent, "{err}");
    assert!(err.message.contains("unlicenseduser: carol"), "{err}");
    let receipt = send(&sender, request("t3", "alice|carol", text("hi")))
        .await
        .unwrap();
    let note = receipt.note.expect("partial failure noted");
    assert!(note.contains("unlicenseduser: carol"), "{note}");
}

#[tokio::test]
async fn per_member_limit_is_kept_by_the_executor() {
    let (fake, sender) = setup().await;
    for i in 0..30 {
        send(&sender, request(&format!("t{i}"), "alice", text("hi")))
            .await
            .unwrap();
    }
    let err = send(&sender, request("t30", "Alice", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::RateLimited, "{err}");
    // Alice's limit, not the app's: other members are sent to at once.
    assert!(err.recipient_scoped, "{err:?}");
    let wait = err.retry_after.expect("retry_after until the window frees");
    assert!(
        wait > Duration::from_secs(55) && wait <= Duration::from_secs(60),
        "{wait:?}"
    );
    // A message to alice and bob is refused as a whole; bob alone is fine.
    let err = send(&sender, request("t31", "bob|alice", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::RateLimited);
    send(&sender, request("t32", "bob", text("hi")))
        .await
        .unwrap();
    assert_eq!(fake.sends().len(), 31, "nothing sent over the limit");
}

#[tokio::test]
async fn secrets_never_in_errors_or_debug() {
    let (fake, sender) = setup().await;
    send(&sender, request("t", "alice", text("hi")))
        .await
        .unwrap();
    fake.expire_tokens();
    send(&sender, request("t", "alice", text("hi")))
        .await
        .unwrap();
    // Transport errors carry no URL (it holds the token or the robot key).
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let dead = account_sender(&config(&format!("http://{addr}"), ""), ENV, "app");
    let err = send(&dead, request("t", "alice", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::Transient, "{err}");
    assert!(!err.message.contains(SECRET), "{err}");
    let dead_robot = account_sender(&config(&format!("http://{addr}"), ""), ENV, "robot");
    let err = send(&dead_robot, request("t", "", text("hi")))
        .await
        .unwrap_err();
    assert!(!err.message.contains(ROBOT_KEY), "{err}");
    for s in [&sender, &dead_robot] {
        let debug = format!("{s:?}");
        assert!(
            !debug.contains(SECRET) && !debug.contains(ROBOT_KEY),
            "{debug}"
        );
    }
}

async fn robot() -> (FakeWeCom, BoxSender) {
    let fake = FakeWeCom::start(CORP, SECRET, AGENT, ROBOT_KEY)
        .await
        .unwrap();
    let sender = account_sender(&config(&fake.base_url(), ""), ENV, "robot");
    (fake, sender)
}

#[tokio::test]
async fn robot_text_shape_and_rows() {
    let (fake, sender) = robot().await;
    let receipt = send(&sender, request("t", "alice|@all", text("deploy done")))
        .await
        .unwrap();
    assert_eq!(receipt.provider_message_id, None);
    let r = &fake.robot_requests()[0];
    assert_eq!(r.credential.as_deref(), Some(ROBOT_KEY));
    assert_eq!(r.body["msgtype"], "text");
    assert_eq!(r.body["text"]["content"], "deploy done");
    assert_eq!(
        r.body["text"]["mentioned_list"],
        serde_json::json!(["alice", "@all"])
    );
    for (answer, class) in [
        (Scripted::Errcode(45009), OutcomeClass::RateLimited),
        (Scripted::Errcode(-1), OutcomeClass::Transient),
        (Scripted::Errcode(44004), OutcomeClass::Permanent),
        (Scripted::Errcode(93000), OutcomeClass::AccountUnavailable),
        (
            Scripted::Raw(502, "Bad Gateway".into()),
            OutcomeClass::Transient,
        ),
    ] {
        fake.respond_next_robot(answer.clone());
        let err = send(&sender, request("t", "", text("x")))
            .await
            .unwrap_err();
        assert_eq!(err.class, class, "{answer:?}: {err}");
        if class == OutcomeClass::RateLimited {
            assert!(err.retry_after >= Some(Duration::from_secs(60)));
        }
    }
    // A wrong key: the fake answers 93000 on its own.
    let wrong = account_sender(
        &config(&fake.base_url(), ""),
        &[("WECOM_SECRET", SECRET), ("ROBOT_KEY", "stale-key")],
        "robot",
    );
    let err = send(&wrong, request("t", "", text("x"))).await.unwrap_err();
    assert_eq!(err.class, OutcomeClass::AccountUnavailable, "{err}");
}

#[tokio::test]
async fn robot_keeps_twenty_a_minute() {
    let (fake, sender) = robot().await;
    for i in 0..20 {
        send(&sender, request(&format!("t{i}"), "", text("x")))
            .await
            .unwrap();
    }
    let err = send(&sender, request("t20", "", text("x")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::RateLimited, "{err}");
    assert_eq!(fake.robot_requests().len(), 20);
}

/// Two executors sending through one robot each keep their own twenty a minute, so WeCom
/// answers 130101 and throttles the robot for about ten minutes: RATE_LIMITED, retried no
/// sooner than that (it was an unknown code: retried after a second, then PERMANENT).
#[tokio::test]
async fn a_robot_over_its_limit_across_executors_waits_out_wecoms_throttle() {
    let (fake, first) = robot().await;
    let second = account_sender(&config(&fake.base_url(), ""), ENV, "robot");
    for i in 0..10 {
        for sender in [&first, &second] {
            send(sender, request(&format!("t{i}"), "", text("x")))
                .await
                .unwrap();
        }
    }
    let err = send(&second, request("t20", "", text("x")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::RateLimited, "{err}");
    assert_eq!(err.code, Some(130101), "{err:?}");
    assert!(err.retry_after >= Some(Duration::from_secs(600)), "{err:?}");
}
