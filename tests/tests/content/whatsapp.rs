//! Every WhatsApp content type in the shape Meta documents, and the fake refusing malformed
//! content as Meta does.

use super::*;

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
