//! Rich content end to end: every content type per channel goes from CreateTask through the
//! real scheduler and executor to the provider fakes in its documented shape; what a channel
//! cannot send is INVALID_ARGUMENT naming the field; WeCom media links are fetched once and
//! uploaded once however many sends share them; and a link to a private address fails the
//! task PERMANENT without anything being fetched.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use herald_proto::v1::{
    account_service_client::AccountServiceClient, content::Body, interactive::Action, media,
    task_service_client::TaskServiceClient, template_button, template_header, Account,
    AccountLimits, Content, CreateAccountRequest, CreateTaskRequest, Interactive, ListAction,
    ListAttemptsRequest, ListRow, ListSection, Location, Media, MediaKind, News, NewsArticle,
    OutcomeClass, ReplyButton, ReplyButtons, TaskSpec, TaskState, TemplateButton, TemplateContent,
    TemplateHeader, TextCard, TextNoticeCard,
};
use herald_tests::fakes::media::{png, FakeMedia};
use herald_tests::fakes::wecom::FakeWeCom;
use herald_tests::fakes::whatsapp::FakeWhatsApp;
use herald_tests::{
    connect_tasks, task_spec, wait_for_task_state, ExecutorProcess, SchedulerProcess, TestDb,
};
use serde_json::Value;
use tonic::transport::Channel;
use tonic_types::StatusExt;

/// JSON fields a request must carry: (JSON pointer, value).
type Fields = Vec<(&'static str, Value)>;

const WAIT: Duration = Duration::from_secs(30);

fn content(body: Body) -> Content {
    Content {
        body: Some(body),
        link_preview: false,
    }
}

fn media(kind: MediaKind, source: media::Source) -> Media {
    Media {
        kind: kind as i32,
        source: Some(source),
        ..Default::default()
    }
}

fn link(url: &str) -> media::Source {
    media::Source::Link(url.to_owned())
}

async fn create_accounts(url: &str, accounts: &[(&str, &str)]) -> Result<()> {
    let mut client =
        AccountServiceClient::new(Channel::from_shared(url.to_owned())?.connect().await?);
    for (id, kind) in accounts {
        client
            .create_account(CreateAccountRequest {
                account: Some(Account {
                    id: (*id).into(),
                    sender_kind: (*kind).into(),
                    pool: format!("pool-{id}"),
                    limits: Some(AccountLimits {
                        rate_per_second: 100.0,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .await?;
    }
    Ok(())
}

/// Creates a task for `account` sending `content` to `recipient`; returns its id.
async fn send(
    tasks: &mut TaskServiceClient<Channel>,
    account: &str,
    recipient: &str,
    content: Content,
) -> Result<String> {
    let spec = TaskSpec {
        account_id: account.into(),
        content: Some(content),
        max_attempts: Some(1),
        ..task_spec("content", recipient, "unused")
    };
    Ok(tasks
        .create_task(CreateTaskRequest { task: Some(spec) })
        .await?
        .into_inner()
        .task
        .context("task")?
        .id)
}

/// The fake's request whose callback data names `task`.
fn request_of(requests: &[Value], task: &str) -> Result<Value> {
    requests
        .iter()
        .find(|b| {
            b["biz_opaque_callback_data"]
                .as_str()
                .is_some_and(|d| d.starts_with(task))
        })
        .cloned()
        .with_context(|| format!("no request for task {task}"))
}

fn wa_executor_config(fake: &FakeWhatsApp) -> String {
    format!(
        "[accounts.wa-1]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1001\"\n\
         access_token = \"token\"\nbase_url = \"{}\"\n",
        fake.base_url()
    )
}

#[tokio::test]
async fn every_whatsapp_content_type_reaches_the_fake_in_its_documented_shape() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wa-1", "whatsapp_cloud")]).await?;
    let fake = FakeWhatsApp::start("1001", "token").await?;
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(wa_executor_config(&fake))
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&url).await?;

    let image = "https://cdn.example.com/a.jpg";
    let mut preview = content(Body::Text("See https://example.com".into()));
    preview.link_preview = true;
    let button = |id: &str, title: &str| ReplyButton {
        id: id.into(),
        title: title.into(),
    };
    // (name, content, [(JSON pointer into the request, expected value)])
    let cases: Vec<(&str, Content, Fields)> = vec![
        (
            "text with a link preview",
            preview,
            vec![("/type", "text".into()), ("/text/preview_url", true.into())],
        ),
        (
            "image by link with a caption",
            content(Body::Media(Media {
                caption: "Invoice".into(),
                ..media(MediaKind::Image, link(image))
            })),
            vec![
                ("/type", "image".into()),
                ("/image/link", image.into()),
                ("/image/caption", "Invoice".into()),
            ],
        ),
        (
            "document by id with a filename",
            content(Body::Media(Media {
                filename: "q3.pdf".into(),
                ..media(
                    MediaKind::Document,
                    media::Source::MediaId("4490709327384033".into()),
                )
            })),
            vec![
                ("/type", "document".into()),
                ("/document/id", "4490709327384033".into()),
                ("/document/filename", "q3.pdf".into()),
            ],
        ),
        (
            "video",
            content(Body::Media(media(
                MediaKind::Video,
                link("https://cdn.example.com/v.mp4"),
            ))),
            vec![
                ("/type", "video".into()),
                ("/video/link", "https://cdn.example.com/v.mp4".into()),
            ],
        ),
        (
            "audio",
            content(Body::Media(media(
                MediaKind::Audio,
                link("https://cdn.example.com/a.ogg"),
            ))),
            vec![
                ("/type", "audio".into()),
                ("/audio/link", "https://cdn.example.com/a.ogg".into()),
            ],
        ),
        (
            "sticker",
            content(Body::Media(media(
                MediaKind::Sticker,
                media::Source::MediaId("st-1".into()),
            ))),
            vec![("/type", "sticker".into()), ("/sticker/id", "st-1".into())],
        ),
        (
            "location",
            content(Body::Location(Location {
                latitude: 37.48,
                longitude: -122.14,
                name: "HQ".into(),
                address: "1 Hacker Way".into(),
            })),
            vec![
                ("/type", "location".into()),
                ("/location/name", "HQ".into()),
            ],
        ),
        (
            "reply buttons",
            content(Body::Interactive(Interactive {
                header: "Order 123".into(),
                body: "Confirm slot?".into(),
                footer: "Reply within 24h".into(),
                action: Some(Action::Buttons(ReplyButtons {
                    buttons: vec![button("slot_am", "Morning"), button("slot_pm", "Afternoon")],
                })),
            })),
            vec![
                ("/type", "interactive".into()),
                ("/interactive/type", "button".into()),
                ("/interactive/action/buttons/1/reply/id", "slot_pm".into()),
                ("/interactive/header/text", "Order 123".into()),
            ],
        ),
        (
            "list",
            content(Body::Interactive(Interactive {
                body: "Pick one".into(),
                action: Some(Action::List(ListAction {
                    button: "Options".into(),
                    sections: vec![ListSection {
                        title: "Shipping".into(),
                        rows: vec![ListRow {
                            id: "express".into(),
                            title: "Express".into(),
                            description: "Next day".into(),
                        }],
                    }],
                })),
                ..Default::default()
            })),
            vec![
                ("/interactive/type", "list".into()),
                ("/interactive/action/sections/0/rows/0/id", "express".into()),
            ],
        ),
        (
            "template with a document header and two buttons",
            content(Body::Template(TemplateContent {
                template_id: "order_update".into(),
                language: "en_US".into(),
                variables: [("1".to_owned(), "Alice".to_owned())].into_iter().collect(),
                header: Some(TemplateHeader {
                    parameter: Some(template_header::Parameter::Media(Media {
                        filename: "order.pdf".into(),
                        ..media(MediaKind::Document, link("https://cdn.example.com/o.pdf"))
                    })),
                }),
                buttons: vec![
                    TemplateButton {
                        index: 0,
                        parameter: Some(template_button::Parameter::QuickReplyPayload(
                            "stop".into(),
                        )),
                    },
                    TemplateButton {
                        index: 1,
                        parameter: Some(template_button::Parameter::UrlSuffix("o/42".into())),
                    },
                ],
            })),
            vec![
                ("/template/components/0/type", "header".into()),
                (
                    "/template/components/0/parameters/0/document/filename",
                    "order.pdf".into(),
                ),
                ("/template/components/1/parameters/0/text", "Alice".into()),
                ("/template/components/2/sub_type", "quick_reply".into()),
                ("/template/components/2/parameters/0/payload", "stop".into()),
                ("/template/components/3/index", "1".into()),
                ("/template/components/3/parameters/0/text", "o/42".into()),
            ],
        ),
        (
            "template with a text header",
            content(Body::Template(TemplateContent {
                template_id: "hello".into(),
                language: "en".into(),
                header: Some(TemplateHeader {
                    parameter: Some(template_header::Parameter::Text("Ann".into())),
                }),
                ..Default::default()
            })),
            vec![("/template/components/0/parameters/0/text", "Ann".into())],
        ),
    ];

    let mut ids = Vec::new();
    for (name, c, _) in &cases {
        ids.push(
            send(&mut tasks, "wa-1", "16505551234", c.clone())
                .await
                .context(*name)?,
        );
    }
    for ((name, _, _), id) in cases.iter().zip(&ids) {
        wait_for_task_state(&mut tasks, id, TaskState::Succeeded, WAIT)
            .await
            .with_context(|| format!("{name}: {:?}", fake.requests().last()))?;
    }
    let bodies: Vec<Value> = fake.requests().into_iter().map(|r| r.body).collect();
    for ((name, _, expected), id) in cases.iter().zip(&ids) {
        let body = request_of(&bodies, id)?;
        for (pointer, value) in expected {
            ensure!(
                body.pointer(pointer) == Some(value),
                "{name}: {pointer} should be {value}, the request was {body}"
            );
        }
    }
    // A template header's media has no caption; a sticker none either.
    ensure!(fake.requests().iter().all(|r| r.status == 200));
    Ok(())
}

#[tokio::test]
async fn the_whatsapp_fake_refuses_malformed_content_as_meta_does() -> Result<()> {
    // The fake's own rules, driven straight over HTTP: a media object with both id and link
    // (100), a location without latitude (131008), four reply buttons (100).
    let fake = FakeWhatsApp::start("1001", "token").await?;
    let http = reqwest::Client::new();
    let post = |body: Value| {
        http.post(format!("{}/v23.0/1001/messages", fake.base_url()))
            .bearer_auth("token")
            .json(&body)
            .send()
    };
    let base = |kind: &str, object: Value| serde_json::json!({"messaging_product": "whatsapp", "to": "1", "type": kind, kind: object});
    for (body, code) in [
        (
            base(
                "image",
                serde_json::json!({"id": "1", "link": "https://x/a.jpg"}),
            ),
            100,
        ),
        (
            base("location", serde_json::json!({"longitude": 1.0})),
            131008,
        ),
        (
            base(
                "interactive",
                serde_json::json!({"type": "button", "body": {"text": "b"}, "action": {"buttons": [
                    {"type": "reply", "reply": {"id": "1", "title": "1"}},
                    {"type": "reply", "reply": {"id": "2", "title": "2"}},
                    {"type": "reply", "reply": {"id": "3", "title": "3"}},
                    {"type": "reply", "reply": {"id": "4", "title": "4"}}]}}),
            ),
            100,
        ),
        (
            base("sticker", serde_json::json!({"id": "s", "caption": "no"})),
            100,
        ),
    ] {
        let answer: Value = post(body.clone()).await?.json().await?;
        ensure!(answer["error"]["code"] == code, "{body} answered {answer}");
    }
    Ok(())
}

fn wecom_config(wecom: &FakeWeCom, media: Option<&FakeMedia>) -> String {
    let mut config = format!(
        "[accounts.wc-1]\nsender = \"wecom\"\ncorp_id = \"corp\"\ncorp_secret = \"secret\"\n\
         agent_id = 7\nbase_url = \"{0}\"\n\
         [accounts.robot-1]\nsender = \"wecom_robot\"\nwebhook_key = \"robot\"\nbase_url = \"{0}\"\n",
        wecom.base_url()
    );
    if let Some(m) = media {
        config.push_str(&m.media_table());
    }
    config
}

#[tokio::test]
async fn every_wecom_content_type_reaches_the_fake_in_its_documented_shape() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wc-1", "wecom"), ("robot-1", "wecom_robot")]).await?;
    let wecom = FakeWeCom::start("corp", "secret", 7, "robot").await?;
    let host = FakeMedia::start().await?;
    host.put("/a.png", "image/png", png());
    host.put("/q3.pdf", "application/pdf", b"%PDF-1.4 fake".to_vec());
    host.put("/v.mp4", "video/mp4", b"....ftypmp42 fake".to_vec());
    host.put("/v.amr", "audio/amr", b"#!AMR\n fake".to_vec());
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(wecom_config(&wecom, Some(&host)))
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&url).await?;

    let news = Body::News(News {
        articles: vec![NewsArticle {
            title: "Q3".into(),
            description: "Results".into(),
            url: "https://example.com/q3".into(),
            picture_url: "https://example.com/q3.png".into(),
        }],
    });
    // (account, name, content, [(JSON pointer, expected)])
    let cases: Vec<(&str, &str, Content, Fields)> = vec![
        (
            "wc-1",
            "markdown",
            content(Body::Markdown("**hi**".into())),
            vec![("/markdown/content", "**hi**".into())],
        ),
        (
            "wc-1",
            "text card",
            content(Body::TextCard(TextCard {
                title: "Shipped".into(),
                description: "Order 42".into(),
                url: "https://example.com/o/42".into(),
                button_text: "More".into(),
            })),
            vec![
                ("/msgtype", "textcard".into()),
                ("/textcard/btntxt", "More".into()),
            ],
        ),
        (
            "wc-1",
            "news",
            content(news.clone()),
            vec![(
                "/news/articles/0/picurl",
                "https://example.com/q3.png".into(),
            )],
        ),
        (
            "wc-1",
            "text notice card",
            content(Body::TextNotice(TextNoticeCard {
                title: "Build".into(),
                description: "main".into(),
                url: "https://example.com/b/1".into(),
                emphasis: "100".into(),
                emphasis_description: "tests".into(),
                ..Default::default()
            })),
            vec![
                ("/msgtype", "template_card".into()),
                ("/template_card/card_type", "text_notice".into()),
                (
                    "/template_card/card_action/url",
                    "https://example.com/b/1".into(),
                ),
            ],
        ),
        (
            "wc-1",
            "image",
            content(Body::Media(media(
                MediaKind::Image,
                link(&host.url("/a.png")),
            ))),
            vec![("/msgtype", "image".into())],
        ),
        (
            "wc-1",
            "file",
            content(Body::Media(Media {
                filename: "q3.pdf".into(),
                ..media(MediaKind::Document, link(&host.url("/q3.pdf")))
            })),
            vec![("/msgtype", "file".into())],
        ),
        (
            "wc-1",
            "video",
            content(Body::Media(Media {
                title: "Demo".into(),
                ..media(MediaKind::Video, link(&host.url("/v.mp4")))
            })),
            vec![("/video/title", "Demo".into())],
        ),
        (
            "wc-1",
            "voice",
            content(Body::Media(media(
                MediaKind::Audio,
                link(&host.url("/v.amr")),
            ))),
            vec![("/msgtype", "voice".into())],
        ),
        (
            "robot-1",
            "robot markdown",
            content(Body::Markdown("# hi".into())),
            vec![("/markdown/content", "# hi".into())],
        ),
        (
            "robot-1",
            "robot news",
            content(news),
            vec![("/news/articles/0/title", "Q3".into())],
        ),
        (
            "robot-1",
            "robot image",
            content(Body::Media(media(
                MediaKind::Image,
                link(&host.url_by_name("/a.png")),
            ))),
            vec![("/msgtype", "image".into())],
        ),
        (
            "robot-1",
            "robot file",
            content(Body::Media(media(
                MediaKind::Document,
                link(&host.url("/q3.pdf")),
            ))),
            vec![("/msgtype", "file".into())],
        ),
    ];
    for (account, name, c, expected) in &cases {
        let id = send(&mut tasks, account, "ann", c.clone())
            .await
            .context(*name)?;
        wait_for_task_state(&mut tasks, &id, TaskState::Succeeded, WAIT)
            .await
            .with_context(|| {
                format!(
                    "{name}: {:?} {:?}",
                    wecom.sends().last(),
                    wecom.robot_requests().last()
                )
            })?;
        let last = if account.starts_with("robot") {
            wecom.robot_requests().last().map(|r| r.body.clone())
        } else {
            wecom.sends().last().map(|r| r.body.clone())
        }
        .context("no request")?;
        for (pointer, value) in expected {
            ensure!(
                last.pointer(pointer) == Some(value),
                "{name}: {pointer} should be {value}, the request was {last}"
            );
        }
    }
    // The robot's image went inline, its md5 over the PNG's bytes (the fake checked it).
    let robot_image = wecom
        .robot_requests()
        .into_iter()
        .find(|r| r.body["msgtype"] == "image")
        .context("robot image")?;
    ensure!(robot_image.body["image"]["md5"] == herald_tests::fakes::wecom_media::md5_hex(&png()));
    let uploads = wecom.uploads();
    let kinds: Vec<(&str, bool)> = uploads
        .iter()
        .map(|u| (u.media_type.as_str(), u.robot))
        .collect();
    ensure!(
        kinds
            == [
                ("image", false),
                ("file", false),
                ("video", false),
                ("voice", false),
                ("file", true)
            ],
        "{uploads:?}"
    );
    ensure!(uploads[1].filename == "q3.pdf" && uploads[1].content_type == "application/pdf");
    Ok(())
}

#[tokio::test]
async fn sends_of_one_media_url_upload_it_once_concurrent_or_not() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wc-1", "wecom"), ("robot-1", "wecom_robot")]).await?;
    let wecom = FakeWeCom::start("corp", "secret", 7, "robot").await?;
    let host = FakeMedia::start().await?;
    host.put("/shared.png", "image/png", png());
    let image = content(Body::Media(media(
        MediaKind::Image,
        link(&host.url("/shared.png")),
    )));
    let mut tasks = connect_tasks(&url).await?;
    // Created before the executor starts, so they are leased and sent together.
    let mut ids = Vec::new();
    for user in ["u1", "u2", "u3", "u4", "u5"] {
        ids.push(send(&mut tasks, "wc-1", user, image.clone()).await?);
    }
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(wecom_config(&wecom, Some(&host)))
        .spawn()
        .await?;
    for id in &ids {
        wait_for_task_state(&mut tasks, id, TaskState::Succeeded, WAIT).await?;
    }
    ensure!(wecom.uploads().len() == 1, "{:?}", wecom.uploads());
    ensure!(host.hits("/shared.png") == 1);
    // A later send of the same URL uses the cached id.
    let later = send(&mut tasks, "wc-1", "u6", image).await?;
    wait_for_task_state(&mut tasks, &later, TaskState::Succeeded, WAIT).await?;
    ensure!(wecom.uploads().len() == 1 && host.hits("/shared.png") == 1);
    let ids: Vec<Value> = wecom
        .sends()
        .iter()
        .map(|s| s.body["image"]["media_id"].clone())
        .collect();
    ensure!(
        ids.len() == 6 && ids.iter().all(|i| *i == ids[0]),
        "{ids:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_media_id_wecom_no_longer_knows_is_uploaded_again_and_resent_once() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wc-1", "wecom"), ("robot-1", "wecom_robot")]).await?;
    let wecom = FakeWeCom::start("corp", "secret", 7, "robot").await?;
    let host = FakeMedia::start().await?;
    host.put("/expiring.png", "image/png", png());
    let image = content(Body::Media(media(
        MediaKind::Image,
        link(&host.url("/expiring.png")),
    )));
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(wecom_config(&wecom, Some(&host)))
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&url).await?;
    let first = send(&mut tasks, "wc-1", "u1", image.clone()).await?;
    wait_for_task_state(&mut tasks, &first, TaskState::Succeeded, WAIT).await?;
    ensure!(wecom.uploads().len() == 1, "{:?}", wecom.uploads());

    // WeCom drops the id before the executor's cache would: the next send of the same link
    // names it, is refused 40007, and goes again with a fresh upload, in its one attempt.
    wecom.expire_media();
    let second = send(&mut tasks, "wc-1", "u2", image.clone()).await?;
    wait_for_task_state(&mut tasks, &second, TaskState::Succeeded, WAIT).await?;
    let to_u2: Vec<(i64, bool, Value)> = wecom
        .sends()
        .iter()
        .filter(|s| s.body["touser"] == "u2")
        .map(|s| (s.errcode, s.delivered, s.body["image"]["media_id"].clone()))
        .collect();
    ensure!(to_u2.len() == 2, "{to_u2:?}");
    ensure!(to_u2[0].0 == 40007 && !to_u2[0].1, "{to_u2:?}");
    ensure!(to_u2[1].0 == 0 && to_u2[1].1, "{to_u2:?}");
    ensure!(
        to_u2[0].2 != to_u2[1].2,
        "resent with the refused id: {to_u2:?}"
    );
    ensure!(wecom.uploads().len() == 2 && host.hits("/expiring.png") == 2);
    let attempts = tasks
        .list_attempts(ListAttemptsRequest {
            task_id: second.clone(),
        })
        .await?
        .into_inner()
        .attempts;
    ensure!(
        attempts.len() == 1 && attempts[0].outcome() == OutcomeClass::Ok,
        "{attempts:?}"
    );

    // Refused again after the re-upload: PERMANENT, as any 40007, with no third upload.
    wecom.expire_media();
    wecom.respond_next_send(herald_tests::fakes::wecom::Scripted::Errcode(40007));
    let third = send(&mut tasks, "wc-1", "u3", image).await?;
    let failed = wait_for_task_state(&mut tasks, &third, TaskState::Failed, WAIT).await?;
    ensure!(failed.end_code == 40007, "{failed:?}");
    ensure!(
        wecom
            .sends()
            .iter()
            .filter(|s| s.body["touser"] == "u3")
            .count()
            == 2
    );
    ensure!(wecom.uploads().len() == 3, "{:?}", wecom.uploads());
    Ok(())
}

#[tokio::test]
async fn a_media_link_to_a_private_address_fails_permanent_and_fetches_nothing() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wc-1", "wecom"), ("robot-1", "wecom_robot")]).await?;
    let wecom = FakeWeCom::start("corp", "secret", 7, "robot").await?;
    let host = FakeMedia::start().await?;
    host.put("/a.png", "image/png", png());
    // Trusts the host's CA (so TLS is not why it fails) but allows no private network.
    let config = format!(
        "{}[media]\nca_file = \"{}\"\n",
        wecom_config(&wecom, None),
        host.ca_file().display()
    );
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(config)
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&url).await?;
    for (account, link_url) in [
        ("wc-1", host.url("/a.png")),
        ("wc-1", host.url_by_name("/a.png")),
        ("robot-1", host.url_by_name("/a.png")),
        (
            "robot-1",
            "https://169.254.169.254/latest/meta-data".to_owned(),
        ),
    ] {
        let id = send(
            &mut tasks,
            account,
            "ann",
            content(Body::Media(media(MediaKind::Image, link(&link_url)))),
        )
        .await?;
        wait_for_task_state(&mut tasks, &id, TaskState::Failed, WAIT)
            .await
            .context(link_url.clone())?;
        let attempts = tasks
            .list_attempts(ListAttemptsRequest {
                task_id: id.clone(),
            })
            .await?
            .into_inner()
            .attempts;
        let last = attempts.last().context("attempt")?;
        ensure!(
            last.outcome() == OutcomeClass::Permanent,
            "{link_url}: {last:?}"
        );
        ensure!(
            last.error.contains("refused to fetch") && last.error.contains("public"),
            "{link_url}: {}",
            last.error
        );
    }
    ensure!(host.total_hits() == 0, "the guard let a request through");
    ensure!(
        wecom.uploads().is_empty() && wecom.sends().is_empty() && wecom.robot_requests().is_empty()
    );
    Ok(())
}

#[tokio::test]
async fn content_a_channel_cannot_send_is_invalid_argument_naming_the_field() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(
        &url,
        &[
            ("wa-1", "whatsapp_cloud"),
            ("wc-1", "wecom"),
            ("robot-1", "wecom_robot"),
        ],
    )
    .await?;
    let mut tasks = connect_tasks(&url).await?;
    let rows = |n: usize| ListSection {
        title: String::new(),
        rows: (0..n)
            .map(|i| ListRow {
                id: format!("r{i}"),
                title: format!("Row {i}"),
                description: String::new(),
            })
            .collect(),
    };
    let cases: Vec<(&str, Content, &str)> = vec![
        (
            "wc-1",
            content(Body::Location(Location::default())),
            "task.content.location",
        ),
        (
            "wa-1",
            content(Body::Markdown("**x**".into())),
            "task.content.markdown",
        ),
        (
            "wa-1",
            content(Body::Media(media(
                MediaKind::Image,
                link("http://example.com/a.png"),
            ))),
            "task.content.media.link",
        ),
        (
            "robot-1",
            content(Body::Media(media(
                MediaKind::Sticker,
                link("https://example.com/s.webp"),
            ))),
            "task.content.media.kind",
        ),
        (
            "robot-1",
            content(Body::Media(media(
                MediaKind::Image,
                media::Source::MediaId("m1".into()),
            ))),
            "task.content.media.media_id",
        ),
        (
            "wa-1",
            content(Body::Interactive(Interactive {
                body: "Pick".into(),
                action: Some(Action::List(ListAction {
                    button: "Options".into(),
                    sections: vec![rows(11)],
                })),
                ..Default::default()
            })),
            "task.content.interactive.list.sections",
        ),
        (
            "wa-1",
            content(Body::Media(Media {
                caption: "no".into(),
                ..media(MediaKind::Sticker, media::Source::MediaId("s".into()))
            })),
            "task.content.media.caption",
        ),
        (
            "wa-1",
            content(Body::Template(TemplateContent {
                template_id: "t".into(),
                language: "en".into(),
                buttons: vec![TemplateButton {
                    index: 12,
                    parameter: Some(template_button::Parameter::UrlSuffix("x".into())),
                }],
                ..Default::default()
            })),
            "task.content.template.buttons[0].index",
        ),
        (
            "wc-1",
            content(Body::Text("x".repeat(2049))),
            "task.content.text",
        ),
    ];
    for (account, c, field) in cases {
        let status = send(&mut tasks, account, "ann", c)
            .await
            .err()
            .with_context(|| format!("{field}: accepted"))?
            .downcast::<tonic::Status>()
            .map_err(|e| anyhow::anyhow!("{field}: {e}"))?;
        ensure!(
            status.code() == tonic::Code::InvalidArgument,
            "{field}: {status:?}"
        );
        let fields: Vec<String> = status
            .get_details_bad_request()
            .context("bad request details")?
            .field_violations
            .into_iter()
            .map(|v| v.field)
            .collect();
        ensure!(fields == [field], "{field}: {fields:?}");
    }
    let listed = tasks
        .list_tasks(herald_proto::v1::ListTasksRequest::default())
        .await?
        .into_inner()
        .tasks;
    ensure!(listed.is_empty(), "a refused task was written: {listed:?}");
    Ok(())
}

#[tokio::test]
async fn a_stored_provider_template_sends_its_header_and_buttons() -> Result<()> {
    use herald_proto::v1::{
        template, template_service_client::TemplateServiceClient, CreateTemplateRequest,
        ProviderTemplate, RenderContentRequest, SendTestRequest, Template,
    };
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wa-1", "whatsapp_cloud")]).await?;
    let fake = FakeWhatsApp::start("1001", "token").await?;
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(wa_executor_config(&fake))
        .spawn()
        .await?;
    let mut templates =
        TemplateServiceClient::new(Channel::from_shared(url.clone())?.connect().await?);
    let banner = "https://cdn.example.com/banner.png";
    let stored = |header_link: &str| Template {
        id: "wa-promo".into(),
        kind: Some(template::Kind::Provider(ProviderTemplate {
            name: "promo".into(),
            language: "en_US".into(),
            parameters: vec!["name".into()],
            header: Some(TemplateHeader {
                parameter: Some(template_header::Parameter::Media(media(
                    MediaKind::Image,
                    link(header_link),
                ))),
            }),
            buttons: vec![TemplateButton {
                index: 0,
                parameter: Some(template_button::Parameter::QuickReplyPayload(
                    "unsubscribe".into(),
                )),
            }],
        })),
        ..Default::default()
    };
    // A stored header is checked like a task's: an http link is refused, naming the field.
    let refused = templates
        .create_template(CreateTemplateRequest {
            template: Some(stored("http://cdn.example.com/banner.png")),
        })
        .await
        .err()
        .context("an http header link was accepted")?;
    let fields: Vec<String> = refused
        .get_details_bad_request()
        .context("details")?
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect();
    ensure!(
        fields == ["template.provider.header.media.link"],
        "{fields:?}"
    );
    templates
        .create_template(CreateTemplateRequest {
            template: Some(stored(banner)),
        })
        .await?;
    let uses = content(Body::Template(TemplateContent {
        template_id: "wa-promo".into(),
        variables: [("name".to_owned(), "Ann".to_owned())]
            .into_iter()
            .collect(),
        ..Default::default()
    }));
    let rendered = templates
        .render_content(RenderContentRequest {
            content: Some(uses.clone()),
        })
        .await?
        .into_inner()
        .content
        .context("rendered")?;
    let Some(Body::Template(t)) = rendered.body else {
        anyhow::bail!("not a template: {rendered:?}");
    };
    ensure!(
        t.template_id == "promo" && t.header.is_some() && t.buttons.len() == 1,
        "{t:?}"
    );

    let test = templates
        .send_test(SendTestRequest {
            task: Some(TaskSpec {
                account_id: "wa-1".into(),
                content: Some(uses),
                ..task_spec("content", "16505550000", "unused")
            }),
            test_recipient: "16505551234".into(),
        })
        .await?
        .into_inner()
        .task
        .context("task")?;
    let mut tasks = connect_tasks(&url).await?;
    wait_for_task_state(&mut tasks, &test.id, TaskState::Succeeded, WAIT).await?;
    let body = request_of(
        &fake
            .requests()
            .into_iter()
            .map(|r| r.body)
            .collect::<Vec<_>>(),
        &test.id,
    )?;
    let components = &body["template"]["components"];
    ensure!(
        components[0]["parameters"][0]["image"]["link"] == banner,
        "{body}"
    );
    ensure!(components[1]["parameters"][0]["text"] == "Ann", "{body}");
    ensure!(
        components[2]["parameters"][0]["payload"] == "unsubscribe",
        "{body}"
    );
    Ok(())
}

#[tokio::test]
async fn a_redirect_to_a_refused_address_is_not_followed() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wc-1", "wecom"), ("robot-1", "wecom_robot")]).await?;
    let wecom = FakeWeCom::start("corp", "secret", 7, "robot").await?;
    let host = FakeMedia::start().await?;
    host.put("/a.png", "image/png", png());
    // The first hop is allowed (127.0.0.1); the redirect's target (::1) is not.
    host.redirect("/hop.png", &format!("https://[::1]:{}/a.png", host.port()));
    let config = format!(
        "{}[media]\nallowed_networks = [\"127.0.0.1/32\"]\nca_file = \"{}\"\n",
        wecom_config(&wecom, None),
        host.ca_file().display()
    );
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(config)
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&url).await?;
    let id = send(
        &mut tasks,
        "wc-1",
        "ann",
        content(Body::Media(media(
            MediaKind::Image,
            link(&host.url("/hop.png")),
        ))),
    )
    .await?;
    wait_for_task_state(&mut tasks, &id, TaskState::Failed, WAIT).await?;
    let attempts = tasks
        .list_attempts(ListAttemptsRequest { task_id: id })
        .await?
        .into_inner()
        .attempts;
    let last = attempts.last().context("attempt")?;
    ensure!(last.outcome() == OutcomeClass::Permanent, "{last:?}");
    ensure!(last.error.contains("redirect to"), "{}", last.error);
    ensure!(host.hits("/hop.png") == 1 && host.hits("/a.png") == 0);
    ensure!(wecom.uploads().is_empty());
    Ok(())
}
