//! Secrets never reach the logs: every sender's flows (success, provider errors, token
//! refresh, transport failures) logged at TRACE, including reqwest's and hyper's own events,
//! and the output searched for each secret. One test per binary, with a global subscriber,
//! so no other test's thread can hide callsites from it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::{account_sender, request, send, text};
use herald_tests::fakes::{wecom, whatsapp};

struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const WA_TOKEN: &str = "EAAJB-log-test-token";
const CORP_SECRET: &str = "corp-log-test-secret";
const ROBOT_KEY: &str = "robot-log-test-key";

#[tokio::test]
async fn no_secret_is_ever_logged() {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let sink = buf.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || Writer(sink.clone()))
        .with_ansi(false)
        .init();

    let wa = whatsapp::FakeWhatsApp::start("1065", WA_TOKEN)
        .await
        .unwrap();
    let wc = wecom::FakeWeCom::start("corp", CORP_SECRET, 7, ROBOT_KEY)
        .await
        .unwrap();
    let config = format!(
        "[accounts.wa]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1065\"\naccess_token = {{ env = \"WA\" }}\nbase_url = \"{wa}\"\n\
         [accounts.app]\nsender = \"wecom\"\ncorp_id = \"corp\"\ncorp_secret = {{ env = \"WC\" }}\nagent_id = 7\nbase_url = \"{wc}\"\n\
         [accounts.robot]\nsender = \"wecom_robot\"\nwebhook_key = {{ env = \"RK\" }}\nbase_url = \"{wc}\"\n",
        wa = wa.base_url(),
        wc = wc.base_url()
    );
    let env = [("WA", WA_TOKEN), ("WC", CORP_SECRET), ("RK", ROBOT_KEY)];
    let routes = common::routes(&config, &env).unwrap();
    tracing::info!(routes = ?routes, "loaded");
    let wa_sender = account_sender(&config, &env, "wa");
    let app = account_sender(&config, &env, "app");
    let robot = account_sender(&config, &env, "robot");

    send(&wa_sender, request("t1", "1650", text("hi")))
        .await
        .unwrap();
    wa.respond_next(whatsapp::Scripted::Code(190));
    send(&wa_sender, request("t2", "1650", text("hi")))
        .await
        .unwrap_err();
    send(&app, request("t3", "alice", text("hi")))
        .await
        .unwrap();
    wc.expire_tokens();
    send(&app, request("t4", "alice", text("hi")))
        .await
        .unwrap();
    wc.respond_next_send(wecom::Scripted::Errcode(60020));
    send(&app, request("t5", "alice", text("hi")))
        .await
        .unwrap_err();
    send(&robot, request("t6", "", text("hi"))).await.unwrap();
    drop(wc);
    // The fake is gone: transport errors (whose URLs hold the token or the key) get logged.
    let _ = send(&robot, request("t7", "", text("hi"))).await;

    let out = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
    assert!(
        out.contains("whatsapp_send") && out.contains("wecom_send"),
        "{out}"
    );
    for secret in [WA_TOKEN, CORP_SECRET, ROBOT_KEY, "tok-1", "tok-2"] {
        assert!(!out.contains(secret), "{secret} in the logs:\n{out}");
    }
}
