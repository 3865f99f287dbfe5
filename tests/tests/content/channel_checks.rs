//! What a channel cannot send is INVALID_ARGUMENT naming the field, and creates nothing.

use super::*;

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
        // Named or gappy keys Meta would refuse (132000) at send time, refused at once.
        (
            "wa-1",
            content(Body::Template(TemplateContent {
                template_id: "t".into(),
                language: "en".into(),
                variables: [("name".to_string(), "Ann".to_string())].into(),
                ..Default::default()
            })),
            "task.content.template.variables",
        ),
        (
            "wa-1",
            content(Body::Template(TemplateContent {
                template_id: "t".into(),
                language: "en".into(),
                variables: [("1", "a"), ("3", "c")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
                ..Default::default()
            })),
            "task.content.template.variables",
        ),
        (
            "wc-1",
            content(Body::Text("x".repeat(2049))),
            "task.content.text",
        ),
    ];
    for (account, c, field) in cases {
        let fields = refused_fields(send(&mut tasks, account, "ann", c).await)
            .with_context(|| field.to_owned())?;
        ensure!(fields == [field], "{field}: {fields:?}");
    }
    let listed = tasks
        .list_tasks(herald_proto::v1::ListTasksRequest::default())
        .await?
        .into_inner()
        .tasks;
    ensure!(listed.is_empty(), "a refused task was written: {listed:?}");
    // A WeCom media id lasts 3 days: a task due later than that would fail when sent (40007),
    // and herald cannot upload a file it only has the id of. A link is uploaded near the send.
    use herald_tests::TaskSpecExt as _;
    let four_days = Duration::from_secs(4 * 86_400);
    let later = |source| TaskSpec {
        account_id: "wc-1".into(),
        content: Some(content(Body::Media(media(MediaKind::Image, source)))),
        ..task_spec("content", "ann", "unused").with_delay(four_days)
    };
    let refused = create_task(&mut tasks, later(media::Source::MediaId("m1".into())))
        .await
        .map(|t| t.id);
    let fields = refused_fields(refused).context("a media id due after its lifetime")?;
    ensure!(fields == ["task.content.media.media_id"], "{fields:?}");
    let by_link = create_task(&mut tasks, later(link("https://example.com/a.png"))).await?;
    tasks
        .cancel_task(herald_proto::v1::CancelTaskRequest { id: by_link.id })
        .await?;
    Ok(())
}

/// An edit's content is checked against the task's target as a create's is: a location edited
/// into a task pinned to a WeCom account, or into one through a WeCom pool, is refused naming
/// the field, and the task keeps its content (it was stored, and failed when sent).
#[tokio::test]
async fn an_edit_to_content_the_target_cannot_send_is_refused() -> Result<()> {
    use herald_proto::v1::{GetTaskRequest, UpdateTaskRequest};
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    create_accounts(&url, &[("wc-1", "wecom")]).await?;
    let mut tasks = connect_tasks(&url).await?;
    let pinned = send(&mut tasks, "wc-1", "ann", content(Body::Text("hi".into()))).await?;
    let pooled = create_task(
        &mut tasks,
        TaskSpec {
            pool: "pool-wc-1".into(),
            ..task_spec("content", "bob", "hi")
        },
    )
    .await?
    .id;
    for id in [pinned, pooled] {
        let status = tasks
            .update_task(UpdateTaskRequest {
                id: id.clone(),
                task: Some(TaskSpec {
                    content: Some(content(Body::Location(Location::default()))),
                    ..Default::default()
                }),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec!["content".into()],
                }),
            })
            .await
            .err()
            .context("a location for WeCom was accepted")?;
        ensure!(status.code() == tonic::Code::InvalidArgument, "{status:?}");
        let fields: Vec<String> = status
            .get_details_bad_request()
            .context("bad request details")?
            .field_violations
            .into_iter()
            .map(|v| v.field)
            .collect();
        ensure!(fields == ["task.content.location"], "{fields:?}");
        let kept = tasks
            .get_task(GetTaskRequest { id })
            .await?
            .into_inner()
            .content;
        ensure!(
            kept == Some(content(Body::Text("hi".into()))),
            "the refused edit changed the task: {kept:?}"
        );
    }
    Ok(())
}

/// The fields an INVALID_ARGUMENT answer to a create names; an error if it was accepted or
/// refused otherwise.
fn refused_fields(created: Result<String>) -> Result<Vec<String>> {
    let status = created
        .err()
        .context("accepted")?
        .downcast::<tonic::Status>()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(status.code() == tonic::Code::InvalidArgument, "{status:?}");
    Ok(status
        .get_details_bad_request()
        .context("bad request details")?
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect())
}
