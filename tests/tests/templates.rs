//! Stored templates: rendered into the task when it is created (what is stored is what will be
//! sent), a missing variable refused at creation, provider templates mapped to positional
//! parameters, previews, test sends that leave the real recipients alone, and a batch rendered
//! too large to answer whole answered without its contents.

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
            ..Default::default()
        })),
        ..Default::default()
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
            ..Default::default()
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
                ..Default::default()
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

    // A bad test recipient is named as the request's field, not the task's.
    let bad = tpl
        .send_test(SendTestRequest {
            task: Some(real.clone()),
            test_recipient: "r".repeat(300),
        })
        .await
        .err()
        .context("a 300-character test recipient was sent to")?;
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(
        bad.message().contains("test_recipient") && !bad.message().contains("task.recipient"),
        "{bad:?}"
    );
    let test = tpl
        .send_test(SendTestRequest {
            task: Some(real.clone()),
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
    let real_task = tasks
        .get_task(GetTaskRequest { id: real_id })
        .await?
        .into_inner();
    assert_eq!(real_task.state(), TaskState::Scheduled);

    // A spec due at a local time long past, inside a send window and with a duplicate window
    // goes out now all the same, and a second test of it too.
    let local = TaskSpec {
        when: None,
        local_time: "2020-01-01T09:00".into(),
        local_time_zone: "Asia/Tokyo".into(),
        duplicate_window: Some(prost_types::Duration {
            seconds: 3600,
            nanos: 0,
        }),
        ..real
    };
    for _ in 0..2 {
        let test = tpl
            .send_test(SendTestRequest {
                task: Some(local.clone()),
                test_recipient: "+15559999".into(),
            })
            .await?
            .into_inner()
            .task
            .context("task")?;
        wait_for_task_state(
            &mut tasks,
            &test.id,
            TaskState::Succeeded,
            Duration::from_secs(30),
        )
        .await?;
    }
    assert_eq!(receiver.requests().len(), 3);
    Ok(())
}

/// The first task a schedule's run created, once there is one (polled: the materialiser's run
/// is a database state, with no event to await).
async fn first_run_task(db: &TestDb, schedule_id: &str) -> Result<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let conn = db.connect().await?;
    loop {
        let row = conn
            .query_opt(
                "SELECT id::text AS id FROM herald.tasks WHERE schedule_id = $1
                 ORDER BY fire_time LIMIT 1",
                &[&schedule_id],
            )
            .await?;
        if let Some(row) = row {
            return Ok(row.try_get("id")?);
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("schedule {schedule_id} created no task");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Regression (#14): the schedule materialiser created tasks without the task domain, so a
/// schedule whose content names a stored template sent the reference itself: WeCom refused every
/// run as PERMANENT and WhatsApp looked up a provider template of herald's template name. Runs are
/// now rendered like any task: the WeCom app gets the text, WhatsApp the approved template with
/// its parameters.
#[tokio::test]
async fn a_schedules_stored_template_is_rendered_at_every_run() -> Result<()> {
    use herald_proto::v1::{
        account_service_client::AccountServiceClient,
        schedule_service_client::ScheduleServiceClient, Account, AccountLimits,
        CreateAccountRequest, CreateScheduleRequest, ScheduleSpec,
    };
    use herald_tests::fakes::wecom::FakeWeCom;
    use herald_tests::fakes::whatsapp::FakeWhatsApp;

    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    let channel = Channel::from_shared(url.clone())?.connect().await?;
    let mut accounts = AccountServiceClient::new(channel.clone());
    for (id, kind, pool) in [("wc-1", "wecom", "wc"), ("wa-1", "whatsapp_cloud", "wa")] {
        accounts
            .create_account(CreateAccountRequest {
                account: Some(Account {
                    id: id.into(),
                    sender_kind: kind.into(),
                    pool: pool.into(),
                    limits: Some(AccountLimits {
                        rate_per_second: 50.0,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .await?;
    }
    let wecom = FakeWeCom::start("corp", "secret", 7, "robot").await?;
    let whatsapp = FakeWhatsApp::start("1001", "token").await?;
    let _executor = ExecutorProcess::builder(std::slice::from_ref(&url))
        .config_toml(format!(
            "[accounts.wc-1]\nsender = \"wecom\"\ncorp_id = \"corp\"\ncorp_secret = \"secret\"\n\
             agent_id = 7\nbase_url = \"{}\"\n\
             [accounts.wa-1]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1001\"\n\
             access_token = \"token\"\nbase_url = \"{}\"\n",
            wecom.base_url(),
            whatsapp.base_url()
        ))
        .spawn()
        .await?;

    let mut stored = templates(&url).await?;
    stored
        .create_template(CreateTemplateRequest {
            template: Some(text_template("morning", "Good morning {{ name }}")),
        })
        .await?;
    stored
        .create_template(CreateTemplateRequest {
            template: Some(Template {
                id: "wa-order".into(),
                kind: Some(template::Kind::Provider(ProviderTemplate {
                    name: "order_update".into(),
                    language: "en_US".into(),
                    parameters: vec!["name".into()],
                    ..Default::default()
                })),
                ..Default::default()
            }),
        })
        .await?;
    let mut schedules = ScheduleServiceClient::new(channel);
    for (id, pool, recipient, content) in [
        (
            "wc-morning",
            "wc",
            "ann",
            uses("morning", &[("name", "Ann")]),
        ),
        (
            "wa-orders",
            "wa",
            "16505551234",
            uses("wa-order", &[("name", "Bo")]),
        ),
    ] {
        schedules
            .create_schedule(CreateScheduleRequest {
                schedule: Some(ScheduleSpec {
                    id: id.into(),
                    cron: "*/2 * * * * *".into(),
                    queue: "reports".into(),
                    recipients: vec![recipient.into()],
                    content: Some(content),
                    pool: pool.into(),
                    ..Default::default()
                }),
            })
            .await?;
    }

    let mut tasks = connect_tasks(&url).await?;
    for schedule in ["wc-morning", "wa-orders"] {
        let id = first_run_task(&db, schedule).await?;
        wait_for_task_state(
            &mut tasks,
            &id,
            TaskState::Succeeded,
            Duration::from_secs(30),
        )
        .await?;
    }
    let sent = wecom.sends();
    assert_eq!(
        sent[0].body["text"]["content"], "Good morning Ann",
        "{:?}",
        sent[0].body
    );
    let sent = whatsapp.requests();
    let template = &sent[0].body["template"];
    assert_eq!(template["name"], "order_update", "{:?}", sent[0].body);
    assert_eq!(template["language"]["code"], "en_US");
    assert_eq!(
        template["components"][0]["parameters"][0]["text"], "Bo",
        "{:?}",
        sent[0].body
    );
    Ok(())
}

#[tokio::test]
async fn a_batch_rendered_too_large_to_answer_whole_is_answered_without_its_contents() -> Result<()>
{
    // 1,000 tasks of a stored template of 5 KB: a small request whose answer, with each task's
    // rendered content, would be over 5 MB, more than the 4 MiB a gRPC client decodes.
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tpl = templates(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let body = format!("{} {{{{ name }}}}", "x".repeat(5_000));
    tpl.create_template(CreateTemplateRequest {
        template: Some(text_template("long", &body)),
    })
    .await?;
    let batch = || CreateTasksRequest {
        tasks: (0..1_000)
            .map(|i| TaskSpec {
                idempotency_key: format!("long-{i}"),
                ..with_content(uses("long", &[("name", &format!("n{i}"))]))
            })
            .collect(),
        ..Default::default()
    };
    let answer = tasks
        .create_tasks(batch())
        .await
        .context("an answer the client can decode")?
        .into_inner();
    assert!(answer.content_omitted, "the answer says what it left out");
    assert_eq!(answer.results.len(), 1_000);
    assert!(answer.results.iter().all(|r| r
        .task
        .as_ref()
        .is_some_and(|t| !t.id.is_empty() && t.content.is_none())));
    let first = answer.results[0].task.clone().context("task")?;
    let stored = tasks
        .get_task(GetTaskRequest { id: first.id })
        .await?
        .into_inner();
    assert_eq!(
        stored.content.and_then(|c| c.body),
        Some(content::Body::Text(format!("{} n0", "x".repeat(5_000)))),
        "the task itself keeps its whole content"
    );

    // Sent again with the same keys: the same tasks, answered the same way.
    let again = tasks.create_tasks(batch()).await?.into_inner();
    assert!(again.content_omitted && again.results.iter().all(|r| r.existing));
    let ids = |a: &herald_proto::v1::CreateTasksResponse| -> Vec<String> {
        a.results
            .iter()
            .filter_map(|r| r.task.as_ref().map(|t| t.id.clone()))
            .collect()
    };
    assert_eq!(ids(&again), ids(&answer));

    // A batch that fits is answered whole.
    let small = tasks
        .create_tasks(CreateTasksRequest {
            tasks: vec![with_content(uses("long", &[("name", "one")]))],
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(!small.content_omitted);
    assert!(small.results[0]
        .task
        .as_ref()
        .is_some_and(|t| t.content.is_some()));
    Ok(())
}

/// A stored template a schedule or an unfinished campaign still renders is not deleted: their
/// later tasks would carry the bare reference, which a sender takes for a provider template of
/// that name (found in an operator's test: the run's task was "sent"). Once nothing renders
/// it, it is deleted.
#[tokio::test]
async fn a_template_in_use_is_not_deleted() -> Result<()> {
    use herald_proto::v1::{
        campaign_service_client::CampaignServiceClient,
        schedule_service_client::ScheduleServiceClient, CampaignSpec, CancelCampaignRequest,
        CreateCampaignRequest, CreateScheduleRequest, DeleteScheduleRequest, DeleteTemplateRequest,
        GetTemplateRequest, ScheduleSpec,
    };

    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    let channel = Channel::from_shared(url.clone())?.connect().await?;
    let mut stored = templates(&url).await?;
    stored
        .create_template(CreateTemplateRequest {
            template: Some(text_template("birthday", "Happy birthday {{ name }}")),
        })
        .await?;
    let mut schedules = ScheduleServiceClient::new(channel.clone());
    schedules
        .create_schedule(CreateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "birthdays".into(),
                cron: "0 9 * * *".into(),
                queue: "greetings".into(),
                recipients: vec!["ann".into()],
                content: Some(uses("birthday", &[("name", "Ann")])),
                ..Default::default()
            }),
        })
        .await?;
    let mut campaigns = CampaignServiceClient::new(channel);
    let campaign = campaigns
        .create_campaign(CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                name: "june".into(),
                queue: "greetings".into(),
                content: Some(uses("birthday", &[("name", "you")])),
                ..Default::default()
            }),
            recipients: vec![],
            ..Default::default()
        })
        .await?
        .into_inner();
    let delete = |mut stored: TemplateServiceClient<Channel>| async move {
        stored
            .delete_template(DeleteTemplateRequest {
                id: "birthday".into(),
            })
            .await
    };

    let refused = delete(stored.clone())
        .await
        .err()
        .context("a template in use was deleted")?;
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("schedule birthdays")
            && refused
                .message()
                .contains(&format!("campaign {}", campaign.id)),
        "{refused:?}"
    );
    stored
        .get_template(GetTemplateRequest {
            id: "birthday".into(),
        })
        .await
        .context("the template is still there")?;

    // A cancelled campaign adds no one, and a deleted schedule runs no more.
    campaigns
        .cancel_campaign(CancelCampaignRequest {
            id: campaign.id.clone(),
        })
        .await?;
    let refused = delete(stored.clone())
        .await
        .err()
        .context("the schedule still renders it")?;
    assert!(!refused.message().contains("campaign"), "{refused:?}");
    schedules
        .delete_schedule(DeleteScheduleRequest {
            id: "birthdays".into(),
        })
        .await?;
    delete(stored.clone()).await?;
    Ok(())
}

/// A keyed create retried after its template changed answers with the task the first request
/// made, as any retry does, instead of refusing the request for the template it no longer
/// fits: refused, the caller could not tell whether its task exists.
#[tokio::test]
async fn a_keyed_create_retried_after_its_template_changed_finds_its_task() -> Result<()> {
    use herald_proto::v1::UpdateTemplateRequest;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tpl = templates(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    tpl.create_template(CreateTemplateRequest {
        template: Some(text_template("greet", "Hi {{ name }}.")),
    })
    .await?;
    let request = || CreateTaskRequest {
        task: Some(TaskSpec {
            idempotency_key: "greet-ann".into(),
            ..with_content(uses("greet", &[("name", "Ann")]))
        }),
    };
    let first = tasks.create_task(request()).await?.into_inner();
    assert!(!first.existing);
    tpl.update_template(UpdateTemplateRequest {
        template: Some(text_template("greet", "Hi {{ name }}, order {{ order }}.")),
    })
    .await?;
    let again = tasks.create_task(request()).await?.into_inner();
    assert!(again.existing, "{again:?}");
    assert_eq!(
        again.task.map(|t| t.id),
        first.task.map(|t| t.id),
        "the retry made another task"
    );
    // A new key checks the spec as ever.
    let status = tasks
        .create_task(CreateTaskRequest {
            task: Some(TaskSpec {
                idempotency_key: "greet-bo".into(),
                ..with_content(uses("greet", &[("name", "Bo")]))
            }),
        })
        .await
        .err()
        .context("a spec missing a variable was taken")?;
    assert_eq!(status.code(), Code::InvalidArgument);
    Ok(())
}

/// ListTemplates pages by id, and a page holds fewer than asked when its templates would not
/// fit in what a client accepts: 55 templates of 60 KB are more than 3 MiB, and every one is
/// still listed once across the pages.
#[tokio::test]
async fn list_templates_pages_and_keeps_each_page_within_what_a_client_accepts() -> Result<()> {
    use herald_proto::v1::ListTemplatesRequest;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tpl = templates(&scheduler.grpc_url()).await?;
    let body = "x".repeat(60_000);
    for n in 0..55 {
        tpl.create_template(CreateTemplateRequest {
            template: Some(text_template(&format!("t{n:02}"), &body)),
        })
        .await?;
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = tpl
            .list_templates(ListTemplatesRequest {
                page_size: 0,
                page_token: token,
            })
            .await?
            .into_inner();
        pages += 1;
        seen.extend(page.templates.into_iter().map(|t| t.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let want: Vec<String> = (0..55).map(|n| format!("t{n:02}")).collect();
    assert_eq!(seen, want);
    assert!(pages > 1, "55 templates of 60 KB fit in one answer");
    let small = tpl
        .list_templates(ListTemplatesRequest {
            page_size: 2,
            page_token: String::new(),
        })
        .await?
        .into_inner();
    assert_eq!(small.templates.len(), 2);
    let bad = tpl
        .list_templates(ListTemplatesRequest {
            page_size: 0,
            page_token: "not a token!".into(),
        })
        .await
        .err()
        .context("a bad token was taken")?;
    assert_eq!(bad.code(), Code::InvalidArgument);
    Ok(())
}
