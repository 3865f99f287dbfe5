//! A stored provider template sends its header and buttons.

use super::*;

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
