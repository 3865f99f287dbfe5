//! A fake WhatsApp Cloud API: `POST /{version}/{phone_number_id}/messages` with
//! `Authorization: Bearer <token>`, answering `{"messaging_product","contacts","messages":[{"id":
//! "wamid…"}]}` or Graph's error envelope (providers.md §1.2–§1.5, §1.8). Every content type
//! herald sends is accepted with its documented shape, and malformed ones are refused as Meta
//! does ([`super::whatsapp_content`]).
//!
//! Like Meta, it can then POST status webhooks signed with the app secret
//! (`X-Hub-Signature-256`, providers.md §1.7) to a configured URL: per recipient, a
//! [`CallbackPlan`] of statuses (delivered, read, read without delivered, duplicates, a late
//! `failed` with a chosen code), posted after the answer or before it (a status that beats the
//! send's own report), with or without the callback data. A webhook answered with anything but
//! 200 is kept and posted again by [`FakeWhatsApp::redeliver`], as Meta retries.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use super::{lock, whatsapp_content};

/// Every error code of providers.md §1.5 with the HTTP status the table gives it (400 where
/// the table says "n/a") and its title.
pub const ERROR_ROWS: &[(i64, u16, &str)] = &[
    (4, 400, "API Too Many Calls"),
    (80007, 400, "Rate limit issues"),
    (130429, 400, "Rate limit hit"),
    (131048, 400, "Spam rate limit hit"),
    (
        131056,
        400,
        "(Business Account, Consumer Account) pair rate limit hit",
    ),
    (
        131049,
        400,
        "This message was not delivered to maintain healthy ecosystem engagement.",
    ),
    (17, 400, "User request limit reached"),
    (341, 400, "Application limit reached"),
    (613, 400, "Calls to this api have exceeded the rate limit."),
    (1, 400, "An unknown error occurred"),
    (2, 503, "Service temporarily unavailable"),
    (131000, 500, "Something went wrong"),
    (131016, 503, "Service unavailable"),
    (133004, 503, "Server temporarily unavailable"),
    (131057, 500, "Account in maintenance mode"),
    (131026, 400, "Message undeliverable"),
    (131047, 400, "Re-engagement message"),
    (131050, 400, "User stopped marketing messages"),
    (131051, 400, "Unsupported message type"),
    (131021, 400, "Recipient cannot be sender"),
    (130472, 400, "User's number is part of an experiment"),
    (
        130497,
        403,
        "Business account is restricted from messaging users in this country",
    ),
    (100, 400, "Invalid parameter"),
    (33, 400, "Parameter value is not valid"),
    (131008, 400, "Required parameter is missing"),
    (131009, 400, "Parameter value is not valid"),
    (131052, 400, "Media download error"),
    (131053, 400, "Media upload error"),
    (
        132000,
        400,
        "Number of parameters does not match the expected number of params",
    ),
    (
        132001,
        404,
        "Template name does not exist in the translation",
    ),
    (132005, 400, "Translated text too long"),
    (132007, 400, "Format character policy violated"),
    (
        132012,
        400,
        "Parameter format does not match format in the created template",
    ),
    (132015, 400, "Template is paused"),
    (132016, 400, "Template is disabled"),
    (132068, 400, "Flow is in blocked state"),
    (132069, 400, "Flow is in throttled state"),
    (0, 401, "AuthException"),
    (190, 401, "Access token has expired"),
    (3, 500, "API Method"),
    (10, 403, "Permission denied"),
    (200, 403, "API Permission"),
    (299, 403, "API Permission"),
    (368, 403, "Temporarily blocked for policies violations"),
    (131031, 403, "Account has been locked"),
    (131042, 400, "Business eligibility payment issue"),
    (131045, 400, "Incorrect certificate"),
    (133010, 400, "Phone number not registered"),
    (
        133016,
        400,
        "Account register deregister rate limit exceeded",
    ),
];

/// Graph's error envelope for `code` with `message`.
pub fn error_body(code: i64, message: &str) -> Value {
    json!({ "error": {
        "message": format!("(#{code}) {message}"),
        "type": "OAuthException",
        "code": code,
        "error_data": { "messaging_product": "whatsapp", "details": message },
        "fbtrace_id": "AbCfake"
    }})
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// The row of [`ERROR_ROWS`] for this code (its HTTP status and Graph's envelope).
    Code(i64),
    /// Any status and body, e.g. a proxy's HTML page.
    Raw(u16, String),
}

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct WaRequest {
    /// The request path.
    pub path: String,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The body, parsed (Null when it was not JSON).
    pub body: Value,
    /// What the fake answered.
    pub status: u16,
}

struct Shared {
    phone_number_id: String,
    token: String,
    script: Mutex<VecDeque<Scripted>>,
    requests: Mutex<Vec<WaRequest>>,
    next_id: AtomicU64,
    callbacks: Mutex<Option<CallbackTarget>>,
    plans: Mutex<std::collections::HashMap<String, CallbackPlan>>,
    /// Plans for the next messages accepted for a recipient, one message each, before its
    /// standing plan.
    once_plans: Mutex<std::collections::HashMap<String, VecDeque<CallbackPlan>>>,
    /// Every status webhook posted, with the answer (0: no answer).
    posted: Mutex<Vec<(u16, Value)>>,
    /// Bodies answered with anything but 200, for [`FakeWhatsApp::redeliver`].
    undelivered: Mutex<Vec<Value>>,
    /// What happens to answers after the request is recorded: held (an executor killed while
    /// waiting never learns that its message was accepted) or lost on the way.
    hold: tokio::sync::watch::Sender<Answering>,
    /// Answers sent so far (held ones count once they are sent).
    answered: AtomicU64,
    http: reqwest::Client,
}

/// What the fake does with an accepted request's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answering {
    /// Answers at once.
    Now,
    /// Waits until told to answer or to lose it.
    Held,
    /// Starts a 200 answer and breaks the connection before its body is whole: the message was
    /// accepted, and the sender cannot know it.
    Lost,
}

/// Where status webhooks go and the secret that signs them.
#[derive(Debug, Clone)]
struct CallbackTarget {
    url: String,
    app_secret: String,
}

/// One status webhook of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Callback {
    /// `sent`.
    Sent,
    /// `delivered`.
    Delivered,
    /// `read`.
    Read,
    /// `failed` with this error code.
    Failed(i64),
}

/// The status webhooks the fake posts for each message accepted for one recipient.
#[derive(Debug, Clone)]
pub struct CallbackPlan {
    /// The statuses, one webhook each, posted in this order.
    pub statuses: Vec<Callback>,
    /// Post them (and wait for the answers) before answering the send, so they reach herald
    /// before the send's own report.
    pub before_response: bool,
    /// Echo the send's `biz_opaque_callback_data` (Meta does); false leaves only the wamid.
    pub with_callback_data: bool,
}

impl CallbackPlan {
    /// `statuses` after the answer, with the callback data.
    pub fn after(statuses: &[Callback]) -> Self {
        CallbackPlan {
            statuses: statuses.to_vec(),
            before_response: false,
            with_callback_data: true,
        }
    }
}

/// `sha256=<hex HMAC-SHA256(secret, body)>`, the `X-Hub-Signature-256` of a webhook body.
pub fn hub_signature(secret: &str, body: &[u8]) -> String {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// A webhook body holding one change of `field` for the WABA `waba_id`.
pub fn webhook_body(waba_id: &str, field: &str, value: Value) -> Value {
    json!({"object": "whatsapp_business_account", "entry": [{
        "id": waba_id, "time": 1750000000,
        "changes": [{ "field": field, "value": value }]
    }]})
}

/// The `messages` value of one status of message `wamid` sent from `phone_number_id`.
pub fn status_value(
    phone_number_id: &str,
    wamid: &str,
    status: Callback,
    recipient: &str,
    callback_data: Option<&str>,
) -> Value {
    let mut s = json!({
        "id": wamid, "timestamp": "1750000000", "recipient_id": recipient,
        "status": match status {
            Callback::Sent => "sent",
            Callback::Delivered => "delivered",
            Callback::Read => "read",
            Callback::Failed(_) => "failed",
        },
        "pricing": {"billable": true, "pricing_model": "PMP", "category": "utility", "type": "regular"}
    });
    if let Callback::Failed(code) = status {
        let title = ERROR_ROWS
            .iter()
            .find(|(c, _, _)| *c == code)
            .map_or("Unknown error", |r| r.2);
        s["errors"] = json!([{ "code": code, "title": title, "message": title,
            "error_data": { "details": format!("{title} (fake)") } }]);
    }
    if let Some(data) = callback_data {
        s["biz_opaque_callback_data"] = json!(data);
    }
    json!({
        "messaging_product": "whatsapp",
        "metadata": { "display_phone_number": "15550783881", "phone_number_id": phone_number_id },
        "statuses": [s]
    })
}

/// The fake server. Stops when dropped.
pub struct FakeWhatsApp {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl FakeWhatsApp {
    /// Starts a fake serving one phone number id, accepting one bearer token.
    pub async fn start(phone_number_id: &str, token: &str) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fake WhatsApp API")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            phone_number_id: phone_number_id.to_owned(),
            token: token.to_owned(),
            script: Mutex::new(VecDeque::new()),
            requests: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            callbacks: Mutex::new(None),
            plans: Mutex::new(std::collections::HashMap::new()),
            once_plans: Mutex::new(std::collections::HashMap::new()),
            posted: Mutex::new(Vec::new()),
            undelivered: Mutex::new(Vec::new()),
            hold: tokio::sync::watch::channel(Answering::Now).0,
            answered: AtomicU64::new(0),
            http: reqwest::Client::new(),
        });
        let app = axum::Router::new()
            .route("/{version}/{phone}/messages", post(messages))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeWhatsApp {
            addr,
            shared,
            server,
        })
    }

    /// `http://127.0.0.1:PORT`, the sender's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next valid request is answered with `answer` instead of success.
    pub fn respond_next(&self, answer: Scripted) {
        lock(&self.shared.script).push_back(answer);
    }

    /// From now on, every request is recorded (and accepted, with its planned webhooks) but
    /// its answer is held until [`Self::release_answers`].
    pub fn hold_answers(&self) {
        self.shared.hold.send_replace(Answering::Held);
    }

    /// Sends the held answers and stops holding.
    pub fn release_answers(&self) {
        self.shared.hold.send_replace(Answering::Now);
    }

    /// From now on (held answers too), every request is recorded and accepted with its planned
    /// webhooks, but its answer breaks off: a 200 whose body never arrives whole, as when the
    /// connection drops after Meta took the message.
    pub fn lose_answers(&self) {
        self.shared.hold.send_replace(Answering::Lost);
    }

    /// How many answers were sent so far (held answers count once released).
    pub fn answered(&self) -> u64 {
        self.shared.answered.load(Ordering::SeqCst)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<WaRequest> {
        lock(&self.shared.requests).clone()
    }

    /// Posts status webhooks to `url`, signed with `app_secret`.
    pub fn send_callbacks_to(&self, url: &str, app_secret: &str) {
        *lock(&self.shared.callbacks) = Some(CallbackTarget {
            url: url.to_owned(),
            app_secret: app_secret.to_owned(),
        });
    }

    /// Every message accepted for `recipient` from now on is followed by `plan`'s webhooks.
    pub fn plan_callbacks(&self, recipient: &str, plan: CallbackPlan) {
        lock(&self.shared.plans).insert(recipient.to_owned(), plan);
    }

    /// Only the next message accepted for `recipient` is followed by `plan`'s webhooks (plans
    /// queued this way go one message each, in order); later ones by the standing plan of
    /// [`Self::plan_callbacks`], if any. For a message that fails and the one sent after it.
    pub fn plan_callbacks_once(&self, recipient: &str, plan: CallbackPlan) {
        lock(&self.shared.once_plans)
            .entry(recipient.to_owned())
            .or_default()
            .push_back(plan);
    }

    /// Every status webhook posted so far, with the answer it got (0: none).
    pub fn posted(&self) -> Vec<(u16, Value)> {
        lock(&self.shared.posted).clone()
    }

    /// Waits until `n` status webhooks have been answered, or fails after `timeout`.
    pub async fn wait_posted(&self, n: usize, timeout: std::time::Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let posted = self.posted().len();
            if posted >= n {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("{posted} of {n} status webhooks answered after {timeout:?}");
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Signs and posts `body` to the webhook URL as Meta would; returns the HTTP status. A
    /// body not answered 200 is kept for [`Self::redeliver`].
    pub async fn post_webhook(&self, body: &Value) -> Result<u16> {
        post_signed(&self.shared, body).await
    }

    /// Posts again every webhook that was not answered 200 (Meta retries for 7 days); returns
    /// the answers. Those still refused are kept.
    pub async fn redeliver(&self) -> Result<Vec<u16>> {
        let pending = std::mem::take(&mut *lock(&self.shared.undelivered));
        let mut answers = Vec::new();
        for body in pending {
            answers.push(post_signed(&self.shared, &body).await?);
        }
        Ok(answers)
    }
}

/// Signs and posts one webhook body; records it and keeps it for redelivery unless it got 200.
async fn post_signed(shared: &Shared, body: &Value) -> Result<u16> {
    let Some(target) = lock(&shared.callbacks).clone() else {
        bail!("no callback URL configured (send_callbacks_to)");
    };
    let bytes = serde_json::to_vec(body)?;
    let answer = shared
        .http
        .post(&target.url)
        .header("content-type", "application/json")
        .header(
            "x-hub-signature-256",
            hub_signature(&target.app_secret, &bytes),
        )
        .body(bytes)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0);
    if answer != 200 {
        lock(&shared.undelivered).push(body.clone());
    }
    lock(&shared.posted).push((answer, body.clone()));
    Ok(answer)
}

/// Posts `plan`'s webhooks for message `wamid` to `to`, in order.
async fn post_plan(
    shared: Arc<Shared>,
    plan: CallbackPlan,
    wamid: String,
    to: String,
    data: Option<String>,
) {
    for status in &plan.statuses {
        let data = data.as_deref().filter(|_| plan.with_callback_data);
        let value = status_value(&shared.phone_number_id, &wamid, *status, &to, data);
        let body = webhook_body("waba-fake", "messages", value);
        if let Err(e) = post_signed(&shared, &body).await {
            eprintln!("fake whatsapp: cannot post a status webhook: {e}");
        }
    }
}

impl Drop for FakeWhatsApp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn error(status: u16, code: i64, message: &str) -> (u16, Value) {
    (status, error_body(code, message))
}

async fn messages(
    State(shared): State<Arc<Shared>>,
    Path((version, phone)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let authorization = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (status, answer) = answer(
        &shared,
        &version,
        &phone,
        authorization.as_deref(),
        &headers,
        &parsed,
    );
    // An accepted message whose recipient has a plan: its status webhooks.
    if let (200, Answer::Json(v)) = (status, &answer) {
        let to = parsed["to"].as_str().unwrap_or_default().to_owned();
        let once = lock(&shared.once_plans)
            .get_mut(&to)
            .and_then(VecDeque::pop_front);
        let plan = once.or_else(|| lock(&shared.plans).get(&to).cloned());
        if let (Some(plan), Some(wamid)) = (plan, v["messages"][0]["id"].as_str()) {
            let data = parsed["biz_opaque_callback_data"]
                .as_str()
                .map(str::to_owned);
            let posting = post_plan(shared.clone(), plan.clone(), wamid.to_owned(), to, data);
            if plan.before_response {
                posting.await;
            } else {
                tokio::spawn(posting);
            }
        }
    }
    lock(&shared.requests).push(WaRequest {
        path: format!("/{version}/{phone}/messages"),
        authorization,
        body: parsed,
        status,
    });
    // Held answers wait here, after the request was recorded and accepted.
    let mut hold = shared.hold.subscribe();
    let answering = hold
        .wait_for(|answering| *answering != Answering::Held)
        .await
        .map(|answering| *answering)
        .unwrap_or(Answering::Now);
    if answering == Answering::Lost {
        return broken_answer();
    }
    shared.answered.fetch_add(1, Ordering::SeqCst);
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match answer {
        Answer::Json(v) => (status, axum::Json(v)).into_response(),
        Answer::Raw(text) => (status, text).into_response(),
    }
}

/// A 200 whose chunked body fails after its first bytes: hyper then closes the connection
/// without the body's end, and the client's read of the body fails.
fn broken_answer() -> Response {
    let chunks = tokio_stream::iter([
        Ok(Bytes::from_static(b"{\"messaging_product\":")),
        Err(std::io::Error::other("the fake drops the answer")),
    ]);
    (StatusCode::OK, axum::body::Body::from_stream(chunks)).into_response()
}

enum Answer {
    Json(Value),
    Raw(String),
}

fn answer(
    shared: &Shared,
    version: &str,
    phone: &str,
    authorization: Option<&str>,
    headers: &HeaderMap,
    body: &Value,
) -> (u16, Answer) {
    let checked = check(shared, version, phone, authorization, headers, body);
    if let Err((status, v)) = checked {
        return (status, Answer::Json(v));
    }
    if let Some(scripted) = lock(&shared.script).pop_front() {
        return match scripted {
            Scripted::Raw(status, text) => (status, Answer::Raw(text)),
            Scripted::Code(code) => {
                let (status, title) = ERROR_ROWS
                    .iter()
                    .find(|(c, _, _)| *c == code)
                    .map(|(_, s, t)| (*s, *t))
                    .unwrap_or((400, "Unknown error"));
                (status, Answer::Json(error_body(code, title)))
            }
        };
    }
    let n = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let to = body["to"].as_str().unwrap_or_default();
    (
        200,
        Answer::Json(json!({
            "messaging_product": "whatsapp",
            "contacts": [{ "input": to, "wa_id": to.trim_start_matches('+') }],
            "messages": [{ "id": format!("wamid.fake{n:08}"), "message_status": "accepted" }]
        })),
    )
}

/// Rejects what the real API would: auth first, then the phone number id, then the body.
fn check(
    shared: &Shared,
    version: &str,
    phone: &str,
    authorization: Option<&str>,
    headers: &HeaderMap,
    body: &Value,
) -> Result<(), (u16, Value)> {
    let token = authorization.and_then(|a| a.strip_prefix("Bearer "));
    if token != Some(shared.token.as_str()) {
        return Err(error(
            401,
            190,
            "Invalid OAuth access token - Cannot parse access token",
        ));
    }
    if !version.starts_with('v') {
        return Err(error(400, 100, "Unknown path components"));
    }
    if phone != shared.phone_number_id {
        return Err(error(
            400,
            100,
            "Unsupported post request. Object does not exist",
        ));
    }
    let json_type = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_type {
        return Err(error(400, 100, "Content-Type must be application/json"));
    }
    let Some(obj) = body.as_object() else {
        return Err(error(400, 100, "The request body is not a JSON object"));
    };
    const TOP: &[&str] = &[
        "messaging_product",
        "recipient_type",
        "to",
        "type",
        "context",
        "biz_opaque_callback_data",
    ];
    let known = |k: &str| TOP.contains(&k) || whatsapp_content::TYPES.contains(&k);
    if let Some(unknown) = obj.keys().find(|k| !known(k)) {
        return Err(error(
            400,
            100,
            &format!("Param {unknown} is not a valid parameter"),
        ));
    }
    if obj.get("messaging_product").and_then(Value::as_str) != Some("whatsapp") {
        return Err(error(
            400,
            100,
            "The parameter messaging_product is required and must be whatsapp",
        ));
    }
    if let Some(rt) = obj.get("recipient_type") {
        if !matches!(rt.as_str(), Some("individual" | "group")) {
            return Err(error(
                400,
                100,
                "Param recipient_type must be individual or group",
            ));
        }
    }
    match obj.get("to").and_then(Value::as_str) {
        Some(to) if !to.is_empty() => {}
        _ => return Err(error(400, 131008, "The parameter to is required")),
    }
    if let Some(data) = obj.get("biz_opaque_callback_data") {
        match data.as_str() {
            Some(s) if s.chars().count() <= 512 => {}
            _ => {
                return Err(error(
                    400,
                    100,
                    "biz_opaque_callback_data must be a string of at most 512 characters",
                ))
            }
        }
    }
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("text");
    // The object named by `type` must be there, and no other message object.
    for other in whatsapp_content::TYPES.iter().copied() {
        if other != kind && obj.contains_key(other) {
            return Err(error(
                400,
                100,
                &format!("Param {other} does not match type {kind}"),
            ));
        }
    }
    match kind {
        "text" => {
            let text = obj
                .get("text")
                .ok_or_else(|| error(400, 131008, "The parameter text is required"))?;
            let Some(b) = text.get("body").and_then(Value::as_str) else {
                return Err(error(400, 131008, "The parameter text['body'] is required"));
            };
            if b.is_empty() || b.chars().count() > 4096 {
                return Err(error(
                    400,
                    100,
                    "Param text['body'] must be 1 to 4096 characters",
                ));
            }
            if text.get("preview_url").is_some_and(|p| !p.is_boolean()) {
                return Err(error(
                    400,
                    100,
                    "Param text['preview_url'] must be a boolean",
                ));
            }
        }
        "template" => {
            let t = obj
                .get("template")
                .ok_or_else(|| error(400, 131008, "The parameter template is required"))?;
            if t.get("name")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                return Err(error(
                    400,
                    131008,
                    "The parameter template['name'] is required",
                ));
            }
            if t["language"]["code"].as_str().is_none_or(str::is_empty) {
                return Err(error(
                    400,
                    131008,
                    "The parameter template['language']['code'] is required",
                ));
            }
            if let Some(components) = t.get("components") {
                let Some(components) = components.as_array() else {
                    return Err(error(
                        400,
                        100,
                        "Param template['components'] must be an array",
                    ));
                };
                whatsapp_content::template_components(components)
                    .map_err(|(status, code, message)| error(status, code, &message))?;
            }
        }
        kind if whatsapp_content::TYPES.contains(&kind) => {
            whatsapp_content::check(kind, obj)
                .map_err(|(status, code, message)| error(status, code, &message))?;
        }
        other => {
            return Err(error(
                400,
                131051,
                &format!("Unsupported message type {other}"),
            ))
        }
    }
    Ok(())
}
