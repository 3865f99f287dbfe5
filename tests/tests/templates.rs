//! Stored templates: rendered into the task when it is created (what is stored is what will be
//! sent), a missing variable refused at creation, provider templates mapped to positional
//! parameters, previews, and test sends that leave the real recipients alone.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use herald_proto::v1::{
    content, template, template_service_client::TemplateServiceClient, Content, CreateTaskRequest,
    CreateTasksRequest, CreateTemplateRequest, GetTaskRequest, ProviderTemplate,
    RenderContentRequest, SendTestRequest, TaskSpec, TaskState, Template, TemplateContent,
    TextTemplate,
};
use herald_tests::{
    connect_tasks, task_spec, wait_for_task_state, ExecutorProcess, SchedulerProcess, TestDb,
    WebhookReceiver,
};
use tonic::transport::Channel;
use tonic::Code;
use tonic_types::StatusExt;

fn text_template(id: &str, body: &str) -> Template {
    Template {
        id: id.into(),
        kind: Some(template::Kind::Text(TextTemplate { body: body.into() })),
        ..Default::default()
    }
}

fn uses(id: &str, vars: &[(&str, &str)]) -> Content {
    Content {
        body: Some(content::Body::Template(TemplateContent {
            template_id: id.into(),
            language: String::new(),
            variables: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        })),
    }
}

fn with_content(content: Content) -> TaskSpec {
    TaskSpec {
        content: Some(content),
        ..task_spec("default", "+15550001", "unused")
    }
}

async fn templates(url: &str) -> Result<TemplateServiceClient<Channel>> {
    Ok(TemplateServiceClient::new(
        Channel::from_shared(url.to_owned())?.connect().await?,
    ))
}

#[tokio::test]
async fn a_task_stores_its_rendered_text_and_a_missing_variable_is_refused() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tpl = templates(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    let stored = tpl
        .create_template(CreateTemplateRequest {
            template: Some(text_template(
                "order-shipped",
                "Hi {{ name }}, order {{ order }} has shipped.",
            )),
        })
        .await?
        .into_inner();
    assert_eq!(stored.variables, vec!["name", "order"]);

    let task = tasks
        .create_task(CreateTaskRequest {
            task: Some(with_content(uses(
                "order-shipped",
                &[("name", "Ann"), ("order", "A-17")],
            ))),
        })
        .await?
        .into_inner()
        .task
        .context("task")?;
    assert_eq!(
        task.content.and_then(|c| c.body),
        Some(content::Body::Text(
            "Hi Ann, order A-17 has shipped.".into()
        ))
    );

    // A missing variable: INVALID_ARGUMENT naming the field, and nothing written.
    let conn = db.connect().await?;
    let before: i64 = conn
        .query_one("SELECT count(*) FROM herald.tasks", &[])
        .await?
        .get(0);
    let status = tasks
        .create_tasks(CreateTasksRequest {
            tasks: vec![
                with_content(uses("order-shipped", &[("name", "Bo"), ("order", "B-1")])),
                with_content(uses("order-shipped", &[("name", "Cy")])),
            ],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let fields: Vec<String> = status
        .get_details_bad_request()
        .context("field details")?
        .field_violations
        .iter()
        .map(|f| f.field.clone())
        .collect();
    assert_eq!(fields, vec!["tasks[1].content.template.variables"]);
    assert!(
        status.message().contains("\"order\""),
        "{}",
        status.message()
    );
    let after: i64 = conn
        .query_one("SELECT count(*) FROM herald.tasks", &[])
        .await?
        .get(0);
    assert_eq!(before, after);

    // A body that does not parse is refused when stored.
    let status = tpl
        .create_template(CreateTemplateRequest {
            template: Some(text_template("broken", "Hi {{ name")),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("template.text.body"));
    Ok(())
}

#[tokio::test]
async fn provider_templates_map_variables_to_positional_parameters() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tpl = templates(&scheduler.grpc_url()).await?;
    tpl.create_template(CreateTemplateRequest {
        template: Some(Template {
            id: "wa-order".into(),
            kind: Some(template::Kind::Provider(ProviderTemplate {
                name: "order_update".into(),
                language: "en_US".into(),
                parameters: vec!["name".into(), "order".into()],
            })),
            ..Default::default()
        }),
    })
    .await?;
    let preview = tpl
        .render_content(RenderContentRequest {
            content: Some(uses("wa-order", &[("order", "A-1"), ("name", "Ann")])),
        })
        .await?
        .into_inner()
        .content
        .context("content")?;
    let Some(content::Body::Template(t)) = preview.body else {
        anyhow::bail!("expected a provider template, got {preview:?}");
    };
    assert_eq!(
        (t.template_id.as_str(), t.language.as_str()),
        ("order_update", "en_US")
    );
    assert_eq!(
        t.variables.into_iter().collect::<Vec<_>>(),
        vec![
            ("1".to_string(), "Ann".to_string()),
            ("2".to_string(), "A-1".to_string())
        ]
    );
    // A template the scheduler does not store passes through as the provider's own.
    let raw = uses("approved_elsewhere", &[("1", "x")]);
    let same = tpl
        .render_content(RenderContentRequest {
            content: Some(raw.clone()),
        })
        .await?
        .into_inner()
        .content;
    assert_eq!(same, Some(raw));
    Ok(())
}

#[tokio::test]
async fn a_test_send_goes_to_the_test_recipient_only() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    let _executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml(format!(
            "[queues.default]\nsender = \"webhook\"\nurl = \"{}/hook\"\nsecret = \"whsec_c2VjcmV0\"\n",
            receiver.url()
        ))
        .spawn()
        .await?;
    let mut tpl = templates(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    tpl.create_template(CreateTemplateRequest {
        template: Some(text_template("promo", "Sale for {{ name }}!")),
    })
    .await?;
    // A real task, due tomorrow, untouched by the test.
    let mut real = with_content(uses("promo", &[("name", "Customer")]));
    real.when = Some(herald_proto::v1::task_spec::When::Delay(
        prost_types::Duration {
            seconds: 86_400,
            nanos: 0,
        },
    ));
    let real_id = tasks
        .create_task(CreateTaskRequest {
            task: Some(real.clone()),
        })
        .await?
        .into_inner()
        .task
        .context("task")?
        .id;

    let test = tpl
        .send_test(SendTestRequest {
            task: Some(real),
            test_recipient: "+15559999".into(),
        })
        .await?
        .into_inner()
        .task
        .context("task")?;
    assert_eq!(test.recipient, "+15559999");
    assert_eq!(
        test.labels.get("herald.test").map(String::as_str),
        Some("true")
    );
    wait_for_task_state(
        &mut tasks,
        &test.id,
        TaskState::Succeeded,
        Duration::from_secs(30),
    )
    .await?;
    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    let body: serde_json::Value = serde_json::from_slice(&requests[0].body)?;
    assert_eq!(body["recipient"], "+15559999");
    assert_eq!(body["content"]["text"], "Sale for Customer!");
    let real = tasks
        .get_task(GetTaskRequest { id: real_id })
        .await?
        .into_inner();
    assert_eq!(real.state(), TaskState::Scheduled);
    Ok(())
}
