//! Every WeCom content type in the shape WeCom documents.

use super::*;

/// A scheduler with the WeCom application account `wc-1`, an executor sending it to a fake
/// WeCom, and a media host for its links.
struct AppStack {
    wecom: FakeWeCom,
    host: FakeMedia,
    tasks: TaskServiceClient<Channel>,
    _executor: ExecutorProcess,
    _scheduler: SchedulerProcess,
    _db: TestDb,
}

impl AppStack {
    async fn start() -> Result<Self> {
        let db = TestDb::new().await?;
        let scheduler = SchedulerProcess::spawn(&db).await?;
        let url = scheduler.grpc_url();
        create_accounts(&url, &[("wc-1", "wecom")]).await?;
        let wecom = FakeWeCom::start("corp", "secret", 7, "robot").await?;
        let host = FakeMedia::start().await?;
        let executor = ExecutorProcess::builder(std::slice::from_ref(&url))
            .config_toml(wecom_config(&wecom, Some(&host)))
            .spawn()
            .await?;
        let tasks = connect_tasks(&url).await?;
        Ok(AppStack {
            wecom,
            host,
            tasks,
            _executor: executor,
            _scheduler: scheduler,
            _db: db,
        })
    }
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

/// WeCom may invalidate a token early (providers.md §2.1): an upload refused for its token
/// refreshes it once and uploads again, as a send does. Before, the upload's 40014 took the
/// account offline and the cached token kept failing every media send until it expired.
#[tokio::test]
async fn an_upload_refused_for_its_token_refreshes_it_once_and_the_media_goes() -> Result<()> {
    let stack = AppStack::start().await?;
    let (wecom, host) = (&stack.wecom, &stack.host);
    host.put("/a.png", "image/png", png());
    host.put("/b.png", "image/png", png());
    let mut tasks = stack.tasks.clone();
    let image = |path: &str| content(Body::Media(media(MediaKind::Image, link(&host.url(path)))));
    let first = send(&mut tasks, "wc-1", "ann", image("/a.png")).await?;
    wait_for_task_state(&mut tasks, &first, TaskState::Succeeded, WAIT).await?;
    wecom.invalidate_tokens();
    // Another link: not in the upload cache, so it is uploaded with the invalidated token.
    let second = send(&mut tasks, "wc-1", "ann", image("/b.png")).await?;
    wait_for_task_state(&mut tasks, &second, TaskState::Succeeded, WAIT)
        .await
        .with_context(|| format!("{:?}", wecom.sends().last()))?;
    ensure!(
        wecom.gettoken_calls() == 2,
        "one fetch and one refresh, got {}",
        wecom.gettoken_calls()
    );
    ensure!(wecom.uploads().len() == 2, "{:?}", wecom.uploads());
    Ok(())
}

/// WeCom shows recipients the uploaded file's name: one link sent under two names is uploaded
/// once per name, and a name sent again reuses its upload.
#[tokio::test]
async fn one_link_under_two_file_names_is_two_uploads() -> Result<()> {
    let stack = AppStack::start().await?;
    let (wecom, host) = (&stack.wecom, &stack.host);
    host.put("/invoice", "application/pdf", b"%PDF-1.4 fake".to_vec());
    let mut tasks = stack.tasks.clone();
    for name in ["A-1001.pdf", "A-1002.pdf", "A-1001.pdf"] {
        let mut document = media(MediaKind::Document, link(&host.url("/invoice")));
        document.filename = name.into();
        let id = send(&mut tasks, "wc-1", "ann", content(Body::Media(document))).await?;
        wait_for_task_state(&mut tasks, &id, TaskState::Succeeded, WAIT).await?;
    }
    let names: Vec<String> = wecom.uploads().into_iter().map(|u| u.filename).collect();
    ensure!(names == ["A-1001.pdf", "A-1002.pdf"], "{names:?}");
    Ok(())
}

/// A media host that names no format (S3's default `binary/octet-stream`, a web server without
/// an AMR mapping): the file's first bytes say what it is, and a file that is not what the
/// message needs is still refused.
#[tokio::test]
async fn media_served_without_a_real_type_is_known_by_its_bytes() -> Result<()> {
    let stack = AppStack::start().await?;
    let (wecom, host) = (&stack.wecom, &stack.host);
    host.put("/photo", "application/octet-stream", png());
    host.put(
        "/voice",
        "binary/octet-stream",
        b"#!AMR\n<\x55\x00\x88\xb6\x66\x79\xe1".to_vec(),
    );
    host.put(
        "/notes",
        "application/octet-stream",
        b"plain text, no image".to_vec(),
    );
    let mut tasks = stack.tasks.clone();
    let sent = |kind, path: &str| content(Body::Media(media(kind, link(&host.url(path)))));
    for (kind, path) in [(MediaKind::Image, "/photo"), (MediaKind::Audio, "/voice")] {
        let id = send(&mut tasks, "wc-1", "ann", sent(kind, path)).await?;
        wait_for_task_state(&mut tasks, &id, TaskState::Succeeded, WAIT)
            .await
            .with_context(|| path.to_owned())?;
    }
    let types: Vec<String> = wecom
        .uploads()
        .into_iter()
        .map(|u| u.content_type)
        .collect();
    ensure!(types == ["image/png", "audio/amr"], "{types:?}");
    let id = send(&mut tasks, "wc-1", "ann", sent(MediaKind::Image, "/notes")).await?;
    let failed = wait_for_task_state(&mut tasks, &id, TaskState::Failed, WAIT).await?;
    ensure!(
        failed.last_error.contains("must be one of"),
        "{}",
        failed.last_error
    );
    Ok(())
}
