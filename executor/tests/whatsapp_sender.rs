//! The whatsapp_cloud sender against the fake Cloud API: request shapes, the wamid, and every
//! row of providers.md §1.5 (by error.code) and §1.5.1 (HTTP status fallback).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{account_sender, request, send, text};
use herald_executor::{BoxSender, Content, OutcomeClass};
use herald_tests::fakes::whatsapp::{FakeWhatsApp, Scripted, ERROR_ROWS};

const TOKEN: &str = "EAAJB-fake-token-s3cr3t";
const PHONE: &str = "106540352242922";

fn config(base_url: &str) -> String {
    format!(
        "[accounts.wa]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"{PHONE}\"\naccess_token = {{ env = \"WA_TOKEN\" }}\nbase_url = \"{base_url}\"\napi_version = \"v23.0\"\n"
    )
}

async fn setup() -> (FakeWhatsApp, BoxSender) {
    let fake = FakeWhatsApp::start(PHONE, TOKEN).await.unwrap();
    let sender = account_sender(&config(&fake.base_url()), &[("WA_TOKEN", TOKEN)], "wa");
    (fake, sender)
}

#[tokio::test]
async fn text_message_shape_and_wamid() {
    let (fake, sender) = setup().await;
    let receipt = send(&sender, request("task-42", "+16505551234", text("Hello")))
        .await
        .unwrap();
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.path, format!("/v23.0/{PHONE}/messages"));
    assert_eq!(
        r.authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(r.body["messaging_product"], "whatsapp");
    assert_eq!(r.body["type"], "text");
    assert_eq!(r.body["to"], "+16505551234");
    assert_eq!(r.body["text"]["body"], "Hello");
    assert_eq!(r.body["biz_opaque_callback_data"], "task-42/1");
    assert_eq!(
        receipt.provider_message_id.as_deref(),
        Some("wamid.fake00000001")
    );
}

#[tokio::test]
async fn template_message_shape() {
    let (fake, sender) = setup().await;
    let variables = [("2", "42.00"), ("1", "Ada"), ("10", "ten")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect::<std::collections::BTreeMap<_, _>>();
    // Keys 1, 2 and 10 leave a gap: refused before sending.
    let err = send(
        &sender,
        request(
            "t-gap",
            "16505551234",
            Content::Template {
                template_id: "order_update".into(),
                language: "en_US".into(),
                variables,
            },
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(err.class, OutcomeClass::Permanent, "{err}");
    assert!(fake.requests().is_empty());

    let variables = [("2", "42.00"), ("1", "Ada")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let receipt = send(
        &sender,
        request(
            "t-tpl",
            "16505551234",
            Content::Template {
                template_id: "order_update".into(),
                language: "en_US".into(),
                variables,
            },
        ),
    )
    .await
    .unwrap();
    assert!(receipt.provider_message_id.is_some());
    let body = &fake.requests()[0].body;
    assert_eq!(body["type"], "template");
    assert_eq!(body["template"]["name"], "order_update");
    assert_eq!(body["template"]["language"]["code"], "en_US");
    let params = &body["template"]["components"][0];
    assert_eq!(params["type"], "body");
    assert_eq!(params["parameters"][0]["text"], "Ada");
    assert_eq!(params["parameters"][1]["text"], "42.00");
    assert!(body.get("text").is_none());

    // No variables: no components at all.
    send(
        &sender,
        request(
            "t-plain",
            "16505551234",
            Content::Template {
                template_id: "hello_world".into(),
                language: "en_US".into(),
                variables: Default::default(),
            },
        ),
    )
    .await
    .unwrap();
    assert!(fake.requests()[1].body["template"]
        .get("components")
        .is_none());
}

#[tokio::test]
async fn too_long_text_is_permanent_before_sending() {
    let (fake, sender) = setup().await;
    let err = send(&sender, request("t", "1650", text(&"x".repeat(4097))))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::Permanent);
    assert!(fake.requests().is_empty());
}

/// The class providers.md §1.5 gives each code, and whether it concerns the recipient only.
fn expected(code: i64) -> (OutcomeClass, bool) {
    use OutcomeClass::*;
    match code {
        4 | 80007 | 130429 | 131048 | 17 | 341 | 613 | 132069 | 133016 | 131057 => {
            (RateLimited, false)
        }
        131056 | 131049 => (RateLimited, true),
        1 | 2 | 131000 | 131016 | 133004 | 132015 => (Transient, false),
        131026 | 131047 | 131050 | 131051 | 131021 | 130472 | 130497 | 100 | 131008 | 131009
        | 131052 | 131053 | 132000 | 132001 | 132005 | 132007 | 132012 | 132016 | 132068 => {
            (Permanent, false)
        }
        33 | 0 | 190 | 3 | 10 | 200..=299 | 368 | 131031 | 131042 | 131045 | 133010 => {
            (AccountUnavailable, false)
        }
        other => panic!("code {other} has no expected class in this test"),
    }
}

/// 131053 (Meta could not fetch the media) is final for media given by id, or on a retry; a
/// link's first failure is tried once more later, since Meta's link fetches fail in bursts.
#[tokio::test]
async fn a_link_meta_could_not_fetch_is_tried_once_more_later() {
    use herald_proto::v1 as pb;
    let (fake, sender) = setup().await;
    let image = |source: pb::media::Source| {
        Content::Rich(pb::Content {
            body: Some(pb::content::Body::Media(pb::Media {
                kind: pb::MediaKind::Image as i32,
                source: Some(source),
                ..Default::default()
            })),
            link_preview: false,
        })
    };
    let link = || image(pb::media::Source::Link("https://example.com/a.png".into()));
    let outcome = |req| async {
        fake.respond_next(Scripted::Code(131053));
        let err = send(&sender, req).await.expect_err("131053 fails the send");
        (err.class, err.retry_after)
    };
    assert_eq!(
        outcome(request("t1", "1650", link())).await,
        (OutcomeClass::Transient, Some(Duration::from_secs(120)))
    );
    let mut retried = request("t2", "1650", link());
    retried.attempts_before = 1;
    assert_eq!(outcome(retried).await, (OutcomeClass::Permanent, None));
    let by_id = image(pb::media::Source::MediaId("4490709327384033".into()));
    assert_eq!(
        outcome(request("t3", "1650", by_id)).await,
        (OutcomeClass::Permanent, None)
    );
}

#[tokio::test]
async fn every_error_code_row_is_classified() {
    let (fake, sender) = setup().await;
    for (i, (code, status, _)) in ERROR_ROWS.iter().enumerate() {
        fake.respond_next(Scripted::Code(*code));
        let err = send(
            &sender,
            request(&format!("t{i}"), "16505551234", text("hi")),
        )
        .await
        .expect_err(&format!("code {code} must fail"));
        let (class, scoped) = expected(*code);
        assert_eq!(err.class, class, "code {code} (HTTP {status}): {err}");
        assert_eq!(err.recipient_scoped, scoped, "code {code}: {err}");
        assert_eq!(
            err.message.starts_with("[recipient] "),
            scoped,
            "code {code}: {err}"
        );
        assert!(err.message.contains(&code.to_string()), "{err}");
        if *code == 131056 {
            assert!(err.retry_after >= Some(Duration::from_secs(6)), "{err:?}");
        }
        // Maintenance pauses the number for a minute instead of spending the task's attempt.
        if *code == 131057 {
            assert_eq!(err.retry_after, Some(Duration::from_secs(60)), "{err:?}");
        }
        // A paused template comes back by itself: its sends wait hours for it, not fail.
        if *code == 132015 {
            assert_eq!(
                err.retry_after,
                Some(Duration::from_secs(3 * 3600)),
                "{err:?}"
            );
        }
    }
    assert_eq!(fake.requests().len(), ERROR_ROWS.len());
}

#[tokio::test]
async fn http_status_fallback_without_an_error_code() {
    let (fake, sender) = setup().await;
    let rows: &[(u16, &str, OutcomeClass)] = &[
        (429, "Too Many Requests", OutcomeClass::RateLimited),
        (408, "Request Timeout", OutcomeClass::Transient),
        (500, "<html>oops</html>", OutcomeClass::Transient),
        (502, "Bad Gateway", OutcomeClass::Transient),
        (503, "", OutcomeClass::Transient),
        (504, "Gateway Timeout", OutcomeClass::Transient),
        (401, "", OutcomeClass::AccountUnavailable),
        (403, "forbidden", OutcomeClass::AccountUnavailable),
        (
            400,
            "{\"error\":{\"message\":\"no code\"}}",
            OutcomeClass::Permanent,
        ),
        (404, "not found", OutcomeClass::Permanent),
    ];
    for (status, body, class) in rows {
        fake.respond_next(Scripted::Raw(*status, (*body).to_owned()));
        let err = send(&sender, request("t", "16505551234", text("hi")))
            .await
            .unwrap_err();
        assert_eq!(err.class, *class, "HTTP {status}: {err}");
        // A gateway's timeout may come after Meta took the message: the outcome is unknown,
        // so the task waits for a status callback before it is sent again.
        assert_eq!(
            err.outcome_unknown,
            matches!(status, 408 | 502 | 504),
            "HTTP {status}: {err:?}"
        );
    }
    // A code the table does not know falls back to the status too.
    fake.respond_next(Scripted::Code(999_999));
    let err = send(&sender, request("t", "16505551234", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::Permanent, "{err}");
}

#[tokio::test]
async fn pair_limit_waits_at_least_six_seconds() {
    let (fake, sender) = setup().await;
    fake.respond_next(Scripted::Code(131056));
    let err = send(&sender, request("t", "1", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.retry_after, Some(Duration::from_secs(6)));
}

#[tokio::test]
async fn network_failure_is_transient_and_token_not_in_errors() {
    // A port nobody listens on: bind, note, close.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let sender = account_sender(
        &config(&format!("http://{addr}")),
        &[("WA_TOKEN", TOKEN)],
        "wa",
    );
    let err = send(&sender, request("t", "1", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::Transient, "{err}");
    assert!(!err.message.contains(TOKEN));

    let (fake, sender) = setup().await;
    fake.respond_next(Scripted::Code(190));
    let err = send(&sender, request("t", "1", text("hi")))
        .await
        .unwrap_err();
    assert!(!err.message.contains(TOKEN));
    send(&sender, request("t", "1", text("hi"))).await.unwrap();
    assert!(!format!("{sender:?}").contains(TOKEN));
}

#[tokio::test]
async fn wrong_token_is_rejected_by_the_fake_and_account_unavailable() {
    let fake = FakeWhatsApp::start(PHONE, TOKEN).await.unwrap();
    let sender = account_sender(&config(&fake.base_url()), &[("WA_TOKEN", "wrong")], "wa");
    let err = send(&sender, request("t", "1", text("hi")))
        .await
        .unwrap_err();
    assert_eq!(err.class, OutcomeClass::AccountUnavailable, "{err}");
    assert_eq!(fake.requests()[0].status, 401);
}
