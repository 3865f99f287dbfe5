//! The webhook sender's signature checked by an independent implementation: the
//! `standardwebhooks` package from PyPI (in the repository's `.venv`, which `script/test`
//! creates from tests/requirements.txt) verifies a request recorded by the harness's
//! WebhookReceiver.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::{request, send, text};
use herald_executor::senders::http::client as http_client;
use herald_executor::senders::webhook::{SigningKey, WebhookSender};
use herald_executor::senders::Sender as _;
use herald_tests::WebhookReceiver;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

const VERIFY: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
secret, path = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    recorded = json.load(f)
body = recorded["body"].encode("utf-8")
Webhook(secret).verify(body, recorded["headers"])
try:
    Webhook(secret).verify(body + b" ", recorded["headers"])
except Exception:
    print("OK")
else:
    print("tampered body verified")
"#;

fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run script/test (it creates .venv and installs tests/requirements.txt, \
         which includes standardwebhooks)",
        python.display()
    );
    python
}

#[tokio::test]
async fn standardwebhooks_verifies_our_signature() {
    let python = python();
    let receiver = WebhookReceiver::start().await.unwrap();
    let key = SigningKey::from_secret(SECRET).unwrap();
    let url = format!("{}/hook", receiver.url()).parse().unwrap();
    let sender = WebhookSender::new(http_client().unwrap(), url, key).boxed();
    send(
        &sender,
        request("task-7", "someone", text("héllo, \"world\"")),
    )
    .await
    .unwrap();
    let recorded = receiver.requests().pop().expect("one request");
    let headers: serde_json::Map<String, serde_json::Value> =
        ["webhook-id", "webhook-timestamp", "webhook-signature"]
            .into_iter()
            .map(|h| (h.to_owned(), recorded.header(h).expect(h).into()))
            .collect();
    let file = std::env::temp_dir().join(format!(
        "herald-webhook-{}-{}.json",
        std::process::id(),
        herald_tests::unique_id("req")
    ));
    std::fs::write(
        &file,
        serde_json::to_vec(
            &serde_json::json!({ "body": recorded.body_text(), "headers": headers }),
        )
        .unwrap(),
    )
    .unwrap();
    let out = tokio::process::Command::new(&python)
        .args(["-c", VERIFY, SECRET])
        .arg(&file)
        .output()
        .await
        .expect("running the venv's python");
    let _ = std::fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim() == "OK",
        "standardwebhooks rejected the signature (is it installed? pip install -r tests/requirements.txt)\nstdout: {stdout}\nstderr: {stderr}"
    );
}
