//! A fake WeCom API: `GET /cgi-bin/gettoken`, `POST /cgi-bin/message/send?access_token=…` and
//! the group robot's `POST /cgi-bin/webhook/send?key=…` (providers.md §2), with the media
//! uploads and rich message types of [`super::wecom_media`]. Every answer is HTTP 200 with
//! `errcode`, as WeCom does, unless scripted otherwise.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::{Multipart, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use super::lock;
use super::wecom_media::{MediaStore, Upload};

/// Every errcode of providers.md §2.5 with an errmsg like WeCom's (unverified texts are made
/// up; senders must branch on errcode only).
pub const ERROR_ROWS: &[(i64, &str)] = &[
    (-1, "system busy"),
    (40014, "invalid access_token"),
    (42001, "access_token expired"),
    (41001, "access_token missing"),
    (40001, "invalid credential"),
    (40013, "invalid corpid"),
    (40091, "secret is invalid"),
    (45009, "api freq out of limit, hint: [1651125626252370061579454], from ip: 127.0.0.1, more info at https://open.work.weixin.qq.com/devtool/query?e=45009"),
    (45033, "api concurrent out of limit"),
    (60020, "not allow to access from your ip"),
    (48002, "api forbidden"),
    (48006, "api forbidden for app unused"),
    (50003, "application is disabled"),
    (40056, "invalid agentid"),
    (81013, "user & party & tag all invalid"),
    (82001, "All touser & toparty & totag invalid"),
    (82002, "invalid party list size"),
    (82003, "invalid tag list size"),
    (40003, "invalid userid"),
    (46004, "user no exist"),
    (60111, "userid not found"),
    (60011, "no privilege to access/modify contact/party/agent"),
    (60021, "userid not in app visible range"),
    (40008, "invalid message type"),
    (44004, "empty content"),
    (45002, "content size out of limit"),
    (82004, "invalid message content"),
    (40033, "invalid charset"),
    (40035, "invalid parameter"),
    (40058, "invalid parameter"),
    (40007, "invalid media_id"),
    (40004, "invalid media type"),
    (40006, "invalid file size"),
    (45001, "media size out of limit"),
    (43004, "user not bind to wechat"),
    (45024, "account number out of limit"),
    (93000, "invalid webhook url"),
    (130101, "send too fast, exceed 20 times per minute"),
];

/// A group robot's limit: 20 messages a minute (providers.md §2.6); past it WeCom answers
/// 130101 (providers-media.md §2.3).
const ROBOT_PER_MINUTE: usize = 20;

fn errmsg(code: i64) -> &'static str {
    ERROR_ROWS
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, m)| *m)
        .unwrap_or("unknown error")
}

fn err(code: i64) -> Value {
    json!({ "errcode": code, "errmsg": errmsg(code) })
}

/// One scripted answer of `message/send` or the robot webhook.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// HTTP 200 with this errcode and its errmsg.
    Errcode(i64),
    /// Any status and body.
    Raw(u16, String),
}

/// A `message/send` or robot request as the fake saw it.
#[derive(Debug, Clone)]
pub struct WeComRequest {
    /// The `access_token` (application) or `key` (robot) query parameter.
    pub credential: Option<String>,
    /// The body, parsed (Null when not JSON).
    pub body: Value,
    /// The errcode answered (0 = accepted).
    pub errcode: i64,
    /// Whether the message reached users: false when rejected, or dropped by the duplicate
    /// check (an identical request within the interval with `enable_duplicate_check: 1`).
    pub delivered: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum TokenState {
    Valid,
    Expired,
    Invalidated,
}

struct Shared {
    corp_id: String,
    corp_secret: String,
    agent_id: i64,
    robot_key: String,
    /// Userids that exist (lower-case); None: every userid exists.
    users: Mutex<Option<BTreeSet<String>>>,
    /// Userids without an interoperability licence (lower-case): accepted, listed in
    /// `unlicenseduser`, not delivered.
    unlicensed: Mutex<BTreeSet<String>>,
    expires_in: Mutex<u64>,
    gettoken_delay: Mutex<Option<Duration>>,
    gettoken_script: Mutex<VecDeque<i64>>,
    tokens: Mutex<HashMap<String, TokenState>>,
    gettoken_calls: AtomicU64,
    next: AtomicU64,
    send_script: Mutex<VecDeque<Scripted>>,
    robot_script: Mutex<VecDeque<Scripted>>,
    sends: Mutex<Vec<WeComRequest>>,
    robot: Mutex<Vec<WeComRequest>>,
    /// When each robot key's messages of the last minute were accepted.
    robot_minute: Mutex<HashMap<String, VecDeque<std::time::Instant>>>,
    delivered_bodies: Mutex<Vec<Value>>,
    media: MediaStore,
}

/// The fake server. Stops when dropped.
pub struct FakeWeCom {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl FakeWeCom {
    /// Starts a fake for one corp and app, plus one robot with `robot_key`.
    pub async fn start(
        corp_id: &str,
        corp_secret: &str,
        agent_id: i64,
        robot_key: &str,
    ) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fake WeCom API")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            corp_id: corp_id.to_owned(),
            corp_secret: corp_secret.to_owned(),
            agent_id,
            robot_key: robot_key.to_owned(),
            users: Mutex::new(None),
            unlicensed: Mutex::new(BTreeSet::new()),
            expires_in: Mutex::new(7200),
            gettoken_delay: Mutex::new(None),
            gettoken_script: Mutex::new(VecDeque::new()),
            tokens: Mutex::new(HashMap::new()),
            gettoken_calls: AtomicU64::new(0),
            next: AtomicU64::new(1),
            send_script: Mutex::new(VecDeque::new()),
            robot_script: Mutex::new(VecDeque::new()),
            sends: Mutex::new(Vec::new()),
            robot: Mutex::new(Vec::new()),
            robot_minute: Mutex::new(HashMap::new()),
            delivered_bodies: Mutex::new(Vec::new()),
            media: MediaStore::default(),
        });
        let app = axum::Router::new()
            .route("/cgi-bin/gettoken", get(gettoken))
            .route("/cgi-bin/message/send", post(send))
            .route("/cgi-bin/webhook/send", post(robot))
            .route("/cgi-bin/media/upload", post(app_upload))
            .route("/cgi-bin/webhook/upload_media", post(robot_upload))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeWeCom {
            addr,
            shared,
            server,
        })
    }

    /// `http://127.0.0.1:PORT`, the sender's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Only these userids exist; others come back in `invaliduser` (81013 when all do).
    pub fn set_users(&self, users: &[&str]) {
        *lock(&self.shared.users) = Some(users.iter().map(|u| u.to_lowercase()).collect());
    }

    /// These userids have no licence: WeCom answers errcode 0 and lists them in
    /// `unlicenseduser` (providers.md §2.5).
    pub fn set_unlicensed(&self, users: &[&str]) {
        *lock(&self.shared.unlicensed) = users.iter().map(|u| u.to_lowercase()).collect();
    }

    /// The `expires_in` of tokens issued from now on.
    pub fn set_expires_in(&self, secs: u64) {
        *lock(&self.shared.expires_in) = secs;
    }

    /// `gettoken` answers only after `delay` (to let concurrent sends pile up on a refresh).
    pub fn set_gettoken_delay(&self, delay: Duration) {
        *lock(&self.shared.gettoken_delay) = Some(delay);
    }

    /// The next `gettoken` answers this errcode.
    pub fn fail_next_gettoken(&self, errcode: i64) {
        lock(&self.shared.gettoken_script).push_back(errcode);
    }

    /// Every token issued so far now answers 42001 (expired).
    pub fn expire_tokens(&self) {
        self.mark_tokens(TokenState::Expired);
    }

    /// Every token issued so far now answers 40014 (invalid), as when WeCom revokes early.
    pub fn invalidate_tokens(&self) {
        self.mark_tokens(TokenState::Invalidated);
    }

    fn mark_tokens(&self, state: TokenState) {
        for s in lock(&self.shared.tokens).values_mut() {
            *s = state;
        }
    }

    /// How many times `gettoken` was called.
    pub fn gettoken_calls(&self) -> u64 {
        self.shared.gettoken_calls.load(Ordering::SeqCst)
    }

    /// The next valid `message/send` answers `answer`.
    pub fn respond_next_send(&self, answer: Scripted) {
        lock(&self.shared.send_script).push_back(answer);
    }

    /// The next valid robot request answers `answer`.
    pub fn respond_next_robot(&self, answer: Scripted) {
        lock(&self.shared.robot_script).push_back(answer);
    }

    /// Every `message/send` request so far.
    pub fn sends(&self) -> Vec<WeComRequest> {
        lock(&self.shared.sends).clone()
    }

    /// Every robot request so far.
    pub fn robot_requests(&self) -> Vec<WeComRequest> {
        lock(&self.shared.robot).clone()
    }

    /// Every accepted media upload so far (application and robot).
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.media.uploads()
    }

    /// Every media id issued so far expires now: a send naming one is answered 40007, as
    /// when an id outlives its 3 days or WeCom drops it early.
    pub fn expire_media(&self) {
        self.shared.media.expire_all();
    }
}

impl Drop for FakeWeCom {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn gettoken(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    shared.gettoken_calls.fetch_add(1, Ordering::SeqCst);
    let delay = *lock(&shared.gettoken_delay);
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    if let Some(code) = lock(&shared.gettoken_script).pop_front() {
        return axum::Json(err(code)).into_response();
    }
    if q.get("corpid") != Some(&shared.corp_id) {
        return axum::Json(err(40013)).into_response();
    }
    if q.get("corpsecret") != Some(&shared.corp_secret) {
        return axum::Json(err(40001)).into_response();
    }
    let token = format!("tok-{}", shared.next.fetch_add(1, Ordering::SeqCst));
    lock(&shared.tokens).insert(token.clone(), TokenState::Valid);
    let expires_in = *lock(&shared.expires_in);
    axum::Json(
        json!({ "errcode": 0, "errmsg": "ok", "access_token": token, "expires_in": expires_in }),
    )
    .into_response()
}

/// Checks a text or markdown payload: present, non-empty, at most `max` bytes.
fn check_content(body: &Value, kind: &str, max: usize) -> Result<(), i64> {
    let Some(content) = body[kind]["content"].as_str() else {
        return Err(41003); // missing content
    };
    if content.is_empty() {
        return Err(44004);
    }
    if content.len() > max {
        return Err(45002);
    }
    Ok(())
}

fn check_send(shared: &Shared, body: &Value) -> Result<(), i64> {
    let Some(obj) = body.as_object() else {
        return Err(40058);
    };
    match obj.get("agentid").and_then(Value::as_i64) {
        Some(a) if a == shared.agent_id => {}
        _ => return Err(40056),
    }
    let to_any = ["touser", "toparty", "totag"].iter().any(|k| {
        obj.get(*k)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    });
    if !to_any {
        return Err(82001);
    }
    if let Some(users) = obj.get("touser").and_then(Value::as_str) {
        if users.split('|').count() > 1000 {
            return Err(40058);
        }
    }
    for flag in ["safe", "enable_id_trans", "enable_duplicate_check"] {
        if obj
            .get(flag)
            .is_some_and(|v| !matches!(v.as_i64(), Some(0 | 1)))
        {
            return Err(40058);
        }
    }
    if let Some(i) = obj.get("duplicate_check_interval") {
        if !i.as_i64().is_some_and(|i| (1..=14400).contains(&i)) {
            return Err(40058);
        }
    }
    match obj.get("msgtype").and_then(Value::as_str) {
        Some("text") => check_content(body, "text", 2048),
        Some("markdown") => check_content(body, "markdown", 2048),
        Some("textcard") => {
            let card = &body["textcard"];
            let ok = ["title", "description", "url"]
                .iter()
                .all(|k| card[*k].as_str().is_some_and(|s| !s.is_empty()));
            let url_ok = card["url"]
                .as_str()
                .is_some_and(|u| u.starts_with("http://") || u.starts_with("https://"));
            if ok && url_ok {
                Ok(())
            } else {
                Err(40058)
            }
        }
        Some(other) => shared.media.check_app(other, body).unwrap_or(Err(40008)),
        None => Err(40008),
    }
}

/// The token of `q`'s `access_token`: None when valid, else the errcode WeCom answers.
fn token_error(shared: &Shared, q: &HashMap<String, String>) -> Option<i64> {
    let state = match q.get("access_token").map(String::as_str) {
        None | Some("") => return Some(41001),
        Some(t) => lock(&shared.tokens).get(t).copied(),
    };
    match state {
        Some(TokenState::Valid) => None,
        Some(TokenState::Expired) => Some(42001),
        Some(TokenState::Invalidated) | None => Some(40014),
    }
}

async fn app_upload(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
    form: Multipart,
) -> Response {
    if let Some(code) = token_error(&shared, &q) {
        return axum::Json(err(code)).into_response();
    }
    let media_type = q.get("type").cloned().unwrap_or_default();
    axum::Json(shared.media.upload(&media_type, false, form).await).into_response()
}

async fn robot_upload(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
    form: Multipart,
) -> Response {
    if q.get("key") != Some(&shared.robot_key) {
        return axum::Json(err(93000)).into_response();
    }
    let media_type = q.get("type").cloned().unwrap_or_default();
    axum::Json(shared.media.upload(&media_type, true, form).await).into_response()
}

async fn send(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
    raw: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let token = q.get("access_token").cloned();
    let mut delivered = false;
    let answer: Result<Value, (u16, String)> = (|| {
        let state = match token.as_deref() {
            None | Some("") => return Ok(err(41001)),
            Some(t) => lock(&shared.tokens).get(t).copied(),
        };
        match state {
            Some(TokenState::Valid) => {}
            Some(TokenState::Expired) => return Ok(err(42001)),
            Some(TokenState::Invalidated) | None => return Ok(err(40014)),
        }
        if let Err(code) = check_send(&shared, &body) {
            return Ok(err(code));
        }
        if let Some(scripted) = lock(&shared.send_script).pop_front() {
            return match scripted {
                Scripted::Errcode(code) => Ok(err(code)),
                Scripted::Raw(status, text) => Err((status, text)),
            };
        }
        let asked: Vec<String> = body["touser"]
            .as_str()
            .unwrap_or_default()
            .split('|')
            .filter(|u| !u.is_empty())
            .map(str::to_lowercase)
            .collect();
        let invalid: Vec<String> = match &*lock(&shared.users) {
            None => Vec::new(),
            Some(known) => asked
                .iter()
                .filter(|u| *u != "@all" && !known.contains(*u))
                .cloned()
                .collect(),
        };
        if !asked.is_empty() && invalid.len() == asked.len() {
            return Ok(err(81013));
        }
        let unlicensed: Vec<String> = {
            let listed = lock(&shared.unlicensed);
            asked
                .iter()
                .filter(|u| listed.contains(*u))
                .cloned()
                .collect()
        };
        // Duplicate check: an identical request within the interval is accepted, not delivered.
        let mut seen = lock(&shared.delivered_bodies);
        let duplicate = body["enable_duplicate_check"].as_i64() == Some(1) && seen.contains(&body);
        delivered = !duplicate;
        if !duplicate {
            seen.push(body.clone());
        }
        let n = shared.next.fetch_add(1, Ordering::SeqCst);
        Ok(json!({
            "errcode": 0, "errmsg": "ok",
            "invaliduser": invalid.join("|"), "invalidparty": "", "invalidtag": "",
            "unlicenseduser": unlicensed.join("|"),
            "msgid": format!("msg-{n}")
        }))
    })();
    let (status, response, errcode) = match answer {
        Ok(v) => {
            let code = v["errcode"].as_i64().unwrap_or(-1);
            (200, axum::Json(v).into_response(), code)
        }
        Err((status, text)) => (status, text.into_response(), -1),
    };
    lock(&shared.sends).push(WeComRequest {
        credential: token,
        body,
        errcode,
        delivered: delivered && errcode == 0,
    });
    let mut response = response;
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
}

async fn robot(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
    raw: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let key = q.get("key").cloned();
    let answer: Result<Value, (u16, String)> = (|| {
        if key.as_deref() != Some(shared.robot_key.as_str()) {
            return Ok(err(93000));
        }
        let checked = match body["msgtype"].as_str() {
            Some("text") => check_content(&body, "text", 2048).and_then(|()| {
                match body["text"].get("mentioned_list") {
                    Some(list) if !list.is_array() => Err(40058),
                    _ => Ok(()),
                }
            }),
            Some("markdown") => check_content(&body, "markdown", 4096),
            Some(other) => shared.media.check_robot(other, &body).unwrap_or(Err(40008)),
            None => Err(40008),
        };
        if let Err(code) = checked {
            return Ok(err(code));
        }
        if let Some(scripted) = lock(&shared.robot_script).pop_front() {
            return match scripted {
                Scripted::Errcode(code) => Ok(err(code)),
                Scripted::Raw(status, text) => Err((status, text)),
            };
        }
        // Counted across every sender of the key, as WeCom does: each executor's own limiter
        // keeps only its own sends under it.
        let mut minute = lock(&shared.robot_minute);
        let sent = minute.entry(shared.robot_key.clone()).or_default();
        let now = std::time::Instant::now();
        while sent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
        {
            sent.pop_front();
        }
        if sent.len() >= ROBOT_PER_MINUTE {
            return Ok(err(130101));
        }
        sent.push_back(now);
        Ok(json!({ "errcode": 0, "errmsg": "ok" }))
    })();
    let (status, mut response, errcode) = match answer {
        Ok(v) => {
            let code = v["errcode"].as_i64().unwrap_or(-1);
            (200, axum::Json(v).into_response(), code)
        }
        Err((status, text)) => (status, text.into_response(), -1),
    };
    lock(&shared.robot).push(WeComRequest {
        credential: key,
        body,
        errcode,
        delivered: errcode == 0,
    });
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
}
