//! Schedules that fan out per recipient, on the real binary with the test clock: a birthday
//! schedule messages exactly the contacts whose birthday is the fire date in their own zone
//! (across a day boundary), each with their own rendered text, and a fire run again creates
//! nothing new; a per-salesperson report renders each recipient's figures from a local
//! variables source, signed, and a catch-up fire asks the source for the missed period; a
//! source that fails twice is asked again until it answers.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use chrono::{DateTime, Utc};
use herald_proto::v1::{
    audience_service_client::AudienceServiceClient, campaign_service_client::CampaignServiceClient,
    content, retry_policy, schedule_service_client::ScheduleServiceClient,
    task_service_client::TaskServiceClient, template,
    template_service_client::TemplateServiceClient, AddContactRequest, Audience, AudienceChannel,
    AudienceTarget, BulkAction, Campaign, CampaignSpec, Contact, Content, CreateAudienceRequest,
    CreateCampaignRequest, CreateScheduleRequest, CreateTaskRequest, CreateTemplateRequest,
    DeleteAudienceRequest, FixedDelays, GetCampaignRequest, GetScheduleRequest,
    ImportContactsCsvRequest, ListScheduleRunsRequest, ListTasksRequest, MisfirePolicy,
    OverlapPolicy, PreviewFireTimesRequest, RetryPolicy, RunKind, ScheduleRun, ScheduleSpec,
    StartBulkOperationRequest, TaskFilter, TaskSpec, Template, TemplateContent, TextTemplate,
    VariablesSource,
};
use herald_tests::{until, Response, SchedulerProcess, TestDb, WebhookReceiver};
use tonic::transport::Channel;

/// The signing secret the scheduler is given for variables sources.
const SECRET: &str = "whsec_c2VjcmV0LWZvci12YXJpYWJsZXMtc291cmNl";

/// Sets the database clock to `at` and waits until the scheduler's own clock follows (its
/// next fire time of `cron` after "now" is `expect`).
async fn set_clock(
    db: &TestDb,
    s: &SchedulerProcess,
    at: DateTime<Utc>,
    cron: &str,
    expect: DateTime<Utc>,
) -> Result<()> {
    db.connect()
        .await?
        .execute(
            "SELECT herald.set_test_clock($1::timestamptz - now())",
            &[&at],
        )
        .await?;
    let schedules = ScheduleServiceClient::connect(s.grpc_url()).await?;
    until("the scheduler's clock to follow the test clock", || {
        let mut schedules = schedules.clone();
        async move {
            let next = schedules
                .preview_fire_times(PreviewFireTimesRequest {
                    cron: cron.into(),
                    time_zone: "UTC".into(),
                    count: 1,
                    ..Default::default()
                })
                .await?
                .into_inner()
                .fire_times;
            Ok(next.first().map(|t| t.seconds) == Some(expect.timestamp()))
        }
    })
    .await
}

fn at(s: &str) -> Result<DateTime<Utc>> {
    Ok(DateTime::parse_from_rfc3339(s)?.with_timezone(&Utc))
}

/// Sets the clock three seconds before `fire` (an 08:00 UTC fire time of the daily
/// schedules here) and returns it.
async fn three_seconds_before(
    db: &TestDb,
    s: &SchedulerProcess,
    fire: &str,
) -> Result<DateTime<Utc>> {
    let fire = at(fire)?;
    set_clock(
        db,
        s,
        fire - chrono::Duration::seconds(3),
        "0 8 * * *",
        fire,
    )
    .await?;
    Ok(fire)
}

async fn text_template(s: &SchedulerProcess, id: &str, body: &str) -> Result<()> {
    TemplateServiceClient::connect(s.grpc_url())
        .await?
        .create_template(CreateTemplateRequest {
            template: Some(Template {
                id: id.into(),
                kind: Some(template::Kind::Text(TextTemplate { body: body.into() })),
                ..Default::default()
            }),
        })
        .await?;
    Ok(())
}

fn uses(id: &str, vars: &[(&str, &str)]) -> Content {
    Content {
        body: Some(content::Body::Template(TemplateContent {
            template_id: id.into(),
            language: String::new(),
            variables: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

async fn audience(
    s: &SchedulerProcess,
    id: &str,
    contacts: Vec<Contact>,
) -> Result<AudienceServiceClient<Channel>> {
    let mut c = AudienceServiceClient::connect(s.grpc_url()).await?;
    c.create_audience(CreateAudienceRequest {
        audience: Some(Audience {
            id: id.into(),
            channel: AudienceChannel::Wecom as i32,
            default_time_zone: "Europe/Berlin".into(),
            date_attributes: vec!["birthday".into()],
            ..Default::default()
        }),
    })
    .await?;
    for contact in contacts {
        c.add_contact(AddContactRequest {
            audience_id: id.into(),
            contact: Some(contact),
        })
        .await?;
    }
    Ok(c)
}

fn contact(recipient: &str, name: &str, zone: &str, tags: &[&str], birthday: &str) -> Contact {
    Contact {
        recipient: recipient.into(),
        name: name.into(),
        time_zone: zone.into(),
        tags: tags.iter().map(|t| t.to_string()).collect(),
        attributes: if birthday.is_empty() {
            BTreeMap::new()
        } else {
            [("birthday".to_string(), birthday.to_string())].into()
        },
        ..Default::default()
    }
}

/// The tasks of `queue`: recipient → text.
async fn texts(s: &SchedulerProcess, queue: &str) -> Result<BTreeMap<String, String>> {
    let mut tasks = TaskServiceClient::connect(s.grpc_url()).await?;
    let listed = tasks
        .list_tasks(ListTasksRequest {
            queue: queue.into(),
            page_size: 1000,
            ..Default::default()
        })
        .await?
        .into_inner()
        .tasks;
    listed
        .into_iter()
        .map(|t| {
            let text = match t.content.and_then(|c| c.body) {
                Some(content::Body::Text(text)) => text,
                other => anyhow::bail!("task content is not text: {other:?}"),
            };
            Ok((t.recipient, text))
        })
        .collect()
}

/// Whether every fan-out of `schedule` is finished.
/// A scheduler whose variables sources trust `source`'s CA, signed with [`SECRET`]; with
/// `allow_loopback` they may reach 127.0.0.1 (where the https receiver listens), without it
/// only public addresses, as in production.
async fn sourcing_scheduler(
    db: &TestDb,
    source: &WebhookReceiver,
    allow_loopback: bool,
) -> Result<SchedulerProcess> {
    let ca = source.ca_file().context("the source must serve https")?;
    let mut builder = SchedulerProcess::builder(db)
        .env("HERALD_VARIABLES_SOURCE_SECRET", SECRET)
        .env("HERALD_VARIABLES_SOURCE_CA_FILE", ca.display().to_string());
    if allow_loopback {
        builder = builder.env("HERALD_VARIABLES_SOURCE_ALLOWED_NETWORKS", "127.0.0.1/32");
    }
    builder.spawn().await
}

/// The runs of `schedule`, newest first.
async fn runs(s: &SchedulerProcess, schedule: &str) -> Result<Vec<ScheduleRun>> {
    Ok(ScheduleServiceClient::connect(s.grpc_url())
        .await?
        .list_schedule_runs(ListScheduleRunsRequest {
            id: schedule.into(),
            page_size: 100,
            ..Default::default()
        })
        .await?
        .into_inner()
        .runs)
}

async fn fanned_out(db: &TestDb, schedule: &str, runs: i64) -> Result<bool> {
    let row = db
        .connect()
        .await?
        .query_one(
            "SELECT count(*) FILTER (WHERE done) AS done, count(*) AS all
             FROM herald.fanouts WHERE schedule_id = $1",
            &[&schedule],
        )
        .await?;
    let (done, all): (i64, i64) = (row.get("done"), row.get("all"));
    Ok(done == all && all >= runs)
}

#[tokio::test]
async fn a_birthday_schedule_greets_todays_birthdays_in_their_own_zones_once() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    // The fire: 23:30 UTC on 7 March, already 8 March in Tokyo and Berlin.
    let fire = at("2026-03-07T23:30:00Z")?;
    audience(
        &s,
        "staff",
        vec![
            contact("utc7", "Uma", "UTC", &["staff"], "1990-03-07"),
            contact("tokyo8", "Taro", "Asia/Tokyo", &["staff"], "03-08"),
            contact("tokyo7", "Tomo", "Asia/Tokyo", &["staff"], "1985-03-07"),
            contact("la7", "Lou", "America/Los_Angeles", &["staff"], "03-07"),
            // No zone of their own: the audience's Europe/Berlin.
            contact("berlin8", "Bea", "", &["staff"], "1979-03-08"),
            contact("berlin7", "Ben", "", &["staff"], "03-07"),
            contact("nobirthday", "Nia", "UTC", &["staff"], ""),
            contact("contractor7", "Cal", "UTC", &["contractor"], "03-07"),
        ],
    )
    .await?;
    text_template(
        &s,
        "birthday",
        "Happy birthday {{ name }} ({{ fire_date }} in {{ time_zone }}), from {{ team }}!",
    )
    .await?;
    set_clock(
        &db,
        &s,
        fire - chrono::Duration::seconds(3),
        "30 23 * * *",
        fire,
    )
    .await?;
    let mut schedules = ScheduleServiceClient::connect(s.grpc_url()).await?;
    schedules
        .create_schedule(CreateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "birthdays".into(),
                cron: "30 23 * * *".into(),
                time_zone: "UTC".into(),
                queue: "greetings".into(),
                audience: Some(AudienceTarget {
                    audience_id: "staff".into(),
                    tags: vec!["staff".into()],
                    date_attribute: "birthday".into(),
                }),
                content: Some(uses("birthday", &[("team", "HR")])),
                ..Default::default()
            }),
        })
        .await?;
    until("the birthday run to fan out", || {
        fanned_out(&db, "birthdays", 1)
    })
    .await?;
    let expected: BTreeMap<String, String> = [
        ("utc7", "Happy birthday Uma (2026-03-07 in UTC), from HR!"),
        (
            "tokyo8",
            "Happy birthday Taro (2026-03-08 in Asia/Tokyo), from HR!",
        ),
        (
            "la7",
            "Happy birthday Lou (2026-03-07 in America/Los_Angeles), from HR!",
        ),
        (
            "berlin8",
            "Happy birthday Bea (2026-03-08 in Europe/Berlin), from HR!",
        ),
    ]
    .into_iter()
    .map(|(r, t)| (r.to_string(), t.to_string()))
    .collect();
    assert_eq!(texts(&s, "greetings").await?, expected);

    // The same fire time fired again (its run lost, the cursor moved back, as a crash between
    // the tasks and the cursor could leave it): each contact's task exists once.
    let conn = db.connect().await?;
    conn.batch_execute(
        "DELETE FROM herald.schedule_runs WHERE schedule_id = 'birthdays';
         UPDATE herald.schedules SET next_fire_at = '2026-03-07T23:30:00Z'
         WHERE id = 'birthdays';
         NOTIFY herald_schedules;",
    )
    .await?;
    until("the run fired again to fan out", || async {
        let runs: i64 = conn
            .query_one(
                "SELECT count(*) FROM herald.schedule_runs WHERE schedule_id = 'birthdays'",
                &[],
            )
            .await?
            .get(0);
        Ok(runs == 1 && fanned_out(&db, "birthdays", 1).await?)
    })
    .await?;
    assert_eq!(texts(&s, "greetings").await?, expected);
    let again: i32 = conn
        .query_one(
            "SELECT task_count FROM herald.schedule_runs WHERE schedule_id = 'birthdays'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(again, 0, "the second fire created tasks");
    // Each task remembers the audience it was made for (TaskFilter.audience_id).
    let untagged: i64 = conn
        .query_one(
            "SELECT count(*) FROM herald.task_records
             WHERE schedule_id = 'birthdays' AND audience_id IS DISTINCT FROM 'staff'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(untagged, 0);
    Ok(())
}

#[tokio::test]
async fn a_sales_report_renders_each_persons_figures_and_a_catch_up_asks_for_the_missed_day(
) -> Result<()> {
    let db = TestDb::new().await?;
    let source = WebhookReceiver::start_https().await?;
    let spawn = || sourcing_scheduler(&db, &source, true);
    let mut s = spawn().await?;
    audience(
        &s,
        "sales",
        vec![
            contact("ann", "Ann", "", &[], ""),
            contact("bob", "Bob", "", &[], ""),
            contact("carl", "Carl", "", &[], ""),
        ],
    )
    .await?;
    text_template(
        &s,
        "report",
        "{{ name }}: {{ total }} EUR, {{ period_start }} to {{ period_end }}\
         {% if catch_up == 'true' %} (late){% endif %}",
    )
    .await?;
    // The source knows Ann's and Bob's figures; Carl sold nothing and gets no report.
    source.set_default(
        Response::ok()
            .body(r#"{"recipients": {"ann": {"total": 1200}, "bob": {"total": "800.50"}}}"#),
    );
    three_seconds_before(&db, &s, "2026-05-04T08:00:00Z").await?;
    ScheduleServiceClient::connect(s.grpc_url())
        .await?
        .create_schedule(CreateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "daily-sales".into(),
                cron: "0 8 * * *".into(),
                time_zone: "UTC".into(),
                queue: "reports".into(),
                misfire: MisfirePolicy::FireOnceNow as i32,
                audience: Some(AudienceTarget {
                    audience_id: "sales".into(),
                    ..Default::default()
                }),
                variables_source: Some(VariablesSource {
                    url: format!("{}/figures", source.url()),
                    timeout: None,
                }),
                content: Some(uses("report", &[])),
                ..Default::default()
            }),
        })
        .await?;
    until("the report run to fan out", || {
        fanned_out(&db, "daily-sales", 1)
    })
    .await?;
    let texts_now = texts(&s, "reports").await?;
    assert_eq!(
        texts_now,
        [
            (
                "ann".to_string(),
                "Ann: 1200 EUR, 2026-05-03T08:00:00.000Z to 2026-05-04T08:00:00.000Z".to_string()
            ),
            (
                "bob".to_string(),
                "Bob: 800.50 EUR, 2026-05-03T08:00:00.000Z to 2026-05-04T08:00:00.000Z".to_string()
            ),
        ]
        .into()
    );
    let requests = source.requests();
    assert_eq!(requests.len(), 1);
    let first = &requests[0];
    let body: serde_json::Value = serde_json::from_slice(&first.body)?;
    assert_eq!(body["period_start"], "2026-05-03T08:00:00.000Z");
    assert_eq!(body["period_end"], "2026-05-04T08:00:00.000Z");
    assert_eq!(body["catch_up"], false);
    let asked: Vec<&str> = body["recipients"]
        .as_array()
        .context("no recipients")?
        .iter()
        .filter_map(|r| r["recipient"].as_str())
        .collect();
    assert_eq!(asked, vec!["ann", "bob", "carl"]);
    verify_signature(first)?;

    // The scheduler is down over the next day's 08:00 and back at 10:00: the catch-up run asks
    // for the missed period, and its messages say so.
    s.kill()?;
    s.wait().await?;
    db.connect()
        .await?
        .execute(
            "SELECT herald.set_test_clock('2026-05-05T10:00:00Z'::timestamptz - now())",
            &[],
        )
        .await?;
    source.set_default(Response::ok().body(
        r#"{"recipients": {"ann": {"total": 300}, "bob": {"total": 0}, "carl": {"total": 50}}}"#,
    ));
    let s = spawn().await?;
    until("the catch-up run to fan out", || {
        fanned_out(&db, "daily-sales", 2)
    })
    .await?;
    let requests = source.requests();
    assert_eq!(requests.len(), 2);
    let body: serde_json::Value = serde_json::from_slice(&requests[1].body)?;
    assert_eq!(body["catch_up"], true);
    assert_eq!(body["period_start"], "2026-05-04T08:00:00.000Z");
    assert_eq!(body["period_end"], "2026-05-05T08:00:00.000Z");
    let all = texts(&s, "reports").await?;
    // Carl had no figures the first day: his only report is the catch-up's.
    assert_eq!(
        all.get("carl").map(String::as_str),
        Some("Carl: 50 EUR, 2026-05-04T08:00:00.000Z to 2026-05-05T08:00:00.000Z (late)")
    );
    Ok(())
}

/// A daily 8:00 UTC schedule `id` (its queue too) to `audience`, asking `source` for the
/// variables of template `template`.
fn sourced(id: &str, audience: &str, source: &WebhookReceiver, template: &str) -> ScheduleSpec {
    ScheduleSpec {
        id: id.into(),
        cron: "0 8 * * *".into(),
        time_zone: "UTC".into(),
        queue: id.into(),
        audience: Some(AudienceTarget {
            audience_id: audience.into(),
            ..Default::default()
        }),
        variables_source: Some(VariablesSource {
            url: format!("{}/v", source.url()),
            timeout: None,
        }),
        content: Some(uses(template, &[])),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_source_that_fails_twice_is_asked_again_until_it_answers() -> Result<()> {
    let db = TestDb::new().await?;
    let source = WebhookReceiver::start_https().await?;
    let s = sourcing_scheduler(&db, &source, true).await?;
    audience(&s, "team", vec![contact("ann", "Ann", "", &[], "")]).await?;
    text_template(&s, "note", "{{ name }}: {{ figure }}").await?;
    source.respond_with(vec![Response::status(503), Response::status(500)]);
    source.set_default(Response::ok().body(r#"{"recipients": {"ann": {"figure": 7}}}"#));
    three_seconds_before(&db, &s, "2026-05-04T08:00:00Z").await?;
    ScheduleServiceClient::connect(s.grpc_url())
        .await?
        .create_schedule(CreateScheduleRequest {
            schedule: Some(sourced("notes", "team", &source, "note")),
        })
        .await?;
    until("the run to fan out", || fanned_out(&db, "notes", 1)).await?;
    assert_eq!(source.requests().len(), 3);
    // Every try of the page carries the same webhook-id, so the source can tell repeats.
    let ids: Vec<Option<String>> = source
        .requests()
        .iter()
        .map(|r| r.header("webhook-id").map(str::to_owned))
        .collect();
    ensure!(
        ids.iter().all(|i| i.is_some() && *i == ids[0]),
        "ids differ: {ids:?}"
    );
    assert_eq!(
        texts(&s, "notes").await?,
        [("ann".to_string(), "Ann: 7".to_string())].into()
    );
    Ok(())
}

/// The source's failures are counted in a row: a batch that fails after the batch before it
/// succeeded, in the same pass, is a first failure. Counted on from the failure before that
/// success, a budget of two attempts gave the run up there, and the contacts after the first
/// page (500) got nothing.
#[tokio::test]
async fn a_batch_failing_after_a_good_one_starts_its_own_count_of_failures() -> Result<()> {
    let db = TestDb::new().await?;
    let source = WebhookReceiver::start_https().await?;
    let s = sourcing_scheduler(&db, &source, true).await?;
    let contacts = (0..501)
        .map(|i| contact(&format!("u{i:04}"), "N", "", &[], ""))
        .collect();
    audience(&s, "many", contacts).await?;
    text_template(&s, "plain", "{{ name }}").await?;
    // The source names every recipient to be sent to (none here needs a variable).
    let names: Vec<String> = (0..501).map(|i| format!("\"u{i:04}\": {{}}")).collect();
    let answer = format!("{{\"recipients\": {{{}}}}}", names.join(", "));
    source.respond_with(vec![
        Response::status(503),
        Response::ok().body(answer.clone()),
        Response::status(503),
    ]);
    source.set_default(Response::ok().body(answer));
    three_seconds_before(&db, &s, "2026-05-04T08:00:00Z").await?;
    ScheduleServiceClient::connect(s.grpc_url())
        .await?
        .create_schedule(CreateScheduleRequest {
            schedule: Some(ScheduleSpec {
                max_attempts: Some(2),
                retry_policy: Some(RetryPolicy {
                    strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
                        delays: vec![prost_types::Duration {
                            seconds: 0,
                            nanos: 100_000_000,
                        }],
                    })),
                }),
                ..sourced("pages", "many", &source, "plain")
            }),
        })
        .await?;
    until("the run to fan out", || fanned_out(&db, "pages", 1)).await?;
    let created: i32 = db
        .connect()
        .await?
        .query_one(
            "SELECT tasks_created FROM herald.fanouts WHERE schedule_id = 'pages'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(created, 501, "the run gave up after its first page");
    assert_eq!(source.requests().len(), 4);
    Ok(())
}

#[tokio::test]
async fn a_campaign_to_an_audience_renders_each_tagged_contacts_message() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    audience(
        &s,
        "club",
        vec![
            contact("ann", "Ann", "Asia/Tokyo", &["vip"], ""),
            contact("bob", "Bob", "", &["vip", "new"], ""),
            contact("cat", "Cat", "", &["new"], ""),
        ],
    )
    .await?;
    text_template(&s, "offer", "{{ greeting }} {{ name }} ({{ time_zone }})").await?;
    CampaignServiceClient::connect(s.grpc_url())
        .await?
        .create_campaign(CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                name: "vip offer".into(),
                queue: "offers".into(),
                content: Some(uses("offer", &[("greeting", "Hello")])),
                audience: Some(AudienceTarget {
                    audience_id: "club".into(),
                    tags: vec!["vip".into()],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            recipients: vec![],
            ..Default::default()
        })
        .await?;
    assert_eq!(
        texts(&s, "offers").await?,
        [
            ("ann".to_string(), "Hello Ann (Asia/Tokyo)".to_string()),
            ("bob".to_string(), "Hello Bob (Europe/Berlin)".to_string()),
        ]
        .into()
    );
    Ok(())
}

/// A campaign sent at a local time (`local_start`) goes to every contact on that local date,
/// so "birthday is today" means that date: created the afternoon before, it greets the next
/// day's birthdays, not the day of its creation's.
#[tokio::test]
async fn a_campaign_at_a_local_time_greets_the_birthdays_of_that_date() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    db.connect()
        .await?
        .execute(
            "SELECT herald.set_test_clock('2026-12-23T15:00:00Z'::timestamptz - now())",
            &[],
        )
        .await?;
    audience(
        &s,
        "staff",
        vec![
            contact("ann", "Ann", "UTC", &[], "12-23"),
            contact("bob", "Bob", "UTC", &[], "12-24"),
        ],
    )
    .await?;
    text_template(&s, "greeting", "Happy birthday, {{ name }}").await?;
    CampaignServiceClient::connect(s.grpc_url())
        .await?
        .create_campaign(CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                name: "birthdays".into(),
                queue: "greetings".into(),
                content: Some(uses("greeting", &[])),
                local_start: "2026-12-24T09:00".into(),
                audience: Some(AudienceTarget {
                    audience_id: "staff".into(),
                    date_attribute: "birthday".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?;
    assert_eq!(
        texts(&s, "greetings").await?,
        [("bob".to_string(), "Happy birthday, Bob".to_string())].into()
    );
    Ok(())
}

/// Checks the Standard Webhooks signature of a request with [`SECRET`].
fn verify_signature(r: &herald_tests::RecordedRequest) -> Result<()> {
    use base64::Engine as _;
    use hmac::{Hmac, Mac};
    let key =
        base64::engine::general_purpose::STANDARD.decode(SECRET.trim_start_matches("whsec_"))?;
    let id = r.header("webhook-id").context("no webhook-id")?;
    let ts = r
        .header("webhook-timestamp")
        .context("no webhook-timestamp")?;
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key)?;
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&r.body);
    let expected = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    assert_eq!(r.header("webhook-signature"), Some(expected.as_str()));
    Ok(())
}

/// A schedule of Ann's note asking `url` for her figure, with `policy` and `max_attempts`.
fn noting_schedule(
    id: &str,
    url: String,
    overlap: OverlapPolicy,
    policy: Option<RetryPolicy>,
    max_attempts: Option<i32>,
) -> CreateScheduleRequest {
    CreateScheduleRequest {
        schedule: Some(ScheduleSpec {
            id: id.into(),
            cron: "0 8 * * *".into(),
            time_zone: "UTC".into(),
            queue: "notes".into(),
            overlap: overlap as i32,
            audience: Some(AudienceTarget {
                audience_id: "team".into(),
                ..Default::default()
            }),
            variables_source: Some(VariablesSource { url, timeout: None }),
            content: Some(uses("note", &[])),
            retry_policy: policy,
            max_attempts,
            ..Default::default()
        }),
    }
}

/// Schedule "notes" (Ann's note fed by `source`) made just before its 08:00 fire, with the
/// source answering `body` only once the returned gate opens; returns when the leader has
/// asked it and waits on the answer.
async fn notes_held_on_their_source(
    db: &TestDb,
    s: &SchedulerProcess,
    source: &WebhookReceiver,
    body: &str,
) -> Result<(herald_tests::Gate, ScheduleServiceClient<Channel>)> {
    let gate = herald_tests::Gate::new();
    source.set_default(Response::ok().body(body.to_owned()).hold_until(&gate));
    three_seconds_before(db, s, "2026-05-04T08:00:00Z").await?;
    let mut schedules = ScheduleServiceClient::connect(s.grpc_url()).await?;
    schedules
        .create_schedule(noting_schedule(
            "notes",
            format!("{}/v", source.url()),
            OverlapPolicy::Allow,
            None,
            None,
        ))
        .await?;
    source.wait_for_requests(1, Duration::from_secs(30)).await?;
    Ok((gate, schedules))
}

/// Explicit retry delays.
fn delays(ms: &[u64]) -> RetryPolicy {
    RetryPolicy {
        strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
            delays: ms
                .iter()
                .map(|ms| prost_types::Duration {
                    seconds: (ms / 1000) as i64,
                    nanos: ((ms % 1000) * 1_000_000) as i32,
                })
                .collect(),
        })),
    }
}

/// The newest run of `schedule`, once it has given up (no longer fanning out, with an error).
async fn given_up(s: &SchedulerProcess, schedule: &str) -> Result<ScheduleRun> {
    let ended = |r: &ScheduleRun| !r.fanning_out && !r.error.is_empty();
    until("the run to give up", || async {
        Ok(runs(s, schedule).await?.first().is_some_and(ended))
    })
    .await?;
    runs(s, schedule)
        .await?
        .into_iter()
        .next()
        .context("no run")
}

#[tokio::test]
async fn a_source_on_a_loopback_or_private_address_is_refused_unless_the_operator_allows_it(
) -> Result<()> {
    let db = TestDb::new().await?;
    let source = WebhookReceiver::start_https().await?;
    // As in production: the source's CA is trusted, but no non-public network is allowed.
    let s = sourcing_scheduler(&db, &source, false).await?;
    audience(&s, "team", vec![contact("ann", "Ann", "", &[], "")]).await?;
    text_template(&s, "note", "{{ name }}: {{ figure }}").await?;
    let mut schedules = ScheduleServiceClient::connect(s.grpc_url()).await?;

    // A literal loopback address, and plain http anywhere, are refused at the call; nothing
    // is stored.
    let refused = [
        ("literal", format!("{}/v", source.url())),
        ("plain", "http://figures.example.com/v".to_string()),
    ];
    for (id, url) in refused {
        let bad = schedules
            .create_schedule(noting_schedule(id, url, OverlapPolicy::Allow, None, None))
            .await
            .err()
            .with_context(|| format!("schedule {id} was accepted"))?;
        assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
        assert!(
            bad.message().contains("schedule.variables_source.url"),
            "{}",
            bad.message()
        );
        let gone = schedules
            .get_schedule(GetScheduleRequest { id: id.into() })
            .await
            .err()
            .with_context(|| format!("schedule {id} was stored"))?;
        assert_eq!(gone.code(), tonic::Code::NotFound);
    }

    // A name is resolved when the source is called: `localhost` passes the call, but its
    // loopback address is refused after resolution. A refusal is not retried: the run gives up
    // at once, says why, and the source never hears of it.
    three_seconds_before(&db, &s, "2026-05-04T08:00:00Z").await?;
    schedules
        .create_schedule(noting_schedule(
            "by-name",
            format!("{}/v", source.url_by_name()),
            OverlapPolicy::Allow,
            None,
            None,
        ))
        .await?;
    let run = given_up(&s, "by-name").await?;
    assert!(run.error.contains("non-public"), "{}", run.error);
    assert!(
        !run.error.contains("127.0.0.1"),
        "the run's error names the internal address: {}",
        run.error
    );
    assert_eq!(run.task_count, 0);
    assert!(
        source.requests().is_empty(),
        "the refused source was called"
    );
    assert!(texts(&s, "notes").await?.is_empty());
    let failures: i32 = db
        .connect()
        .await?
        .query_one(
            "SELECT failures FROM herald.fanouts WHERE schedule_id = 'by-name'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(failures, 1, "a refusal was tried again");
    Ok(())
}

#[tokio::test]
async fn a_failing_source_is_asked_as_often_as_the_schedules_retry_policy_says_then_the_run_gives_up(
) -> Result<()> {
    let db = TestDb::new().await?;
    let source = WebhookReceiver::start_https().await?;
    let s = sourcing_scheduler(&db, &source, true).await?;
    audience(&s, "team", vec![contact("ann", "Ann", "", &[], "")]).await?;
    text_template(&s, "note", "{{ name }}: {{ figure }}").await?;
    source.set_default(Response::status(503));
    three_seconds_before(&db, &s, "2026-05-04T08:00:00Z").await?;
    ScheduleServiceClient::connect(s.grpc_url())
        .await?
        .create_schedule(noting_schedule(
            "notes",
            format!("{}/v", source.url()),
            OverlapPolicy::Allow,
            Some(delays(&[200, 400])),
            Some(3),
        ))
        .await?;
    let run = given_up(&s, "notes").await?;
    assert!(run.error.contains("503"), "{}", run.error);
    let requests = source.requests();
    assert_eq!(requests.len(), 3, "three attempts, as max_attempts says");
    // Each try waited at least the policy's delay for it.
    let gaps: Vec<Duration> = requests
        .windows(2)
        .map(|w| w[1].received_at.duration_since(w[0].received_at))
        .collect();
    ensure!(
        gaps[0] >= Duration::from_millis(200) && gaps[1] >= Duration::from_millis(400),
        "tries came sooner than the policy's delays: {gaps:?}"
    );
    assert!(texts(&s, "notes").await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn with_overlap_skip_a_run_still_fanning_out_makes_the_next_fire_skip() -> Result<()> {
    let db = TestDb::new().await?;
    let source = WebhookReceiver::start_https().await?;
    let s = sourcing_scheduler(&db, &source, true).await?;
    audience(&s, "team", vec![contact("ann", "Ann", "", &[], "")]).await?;
    text_template(&s, "note", "{{ name }}: {{ figure }}").await?;
    // The source is down: the first run waits an hour between tries and has no task yet.
    source.set_default(Response::status(503));
    three_seconds_before(&db, &s, "2026-05-04T08:00:00Z").await?;
    ScheduleServiceClient::connect(s.grpc_url())
        .await?
        .create_schedule(noting_schedule(
            "notes",
            format!("{}/v", source.url()),
            OverlapPolicy::Skip,
            Some(delays(&[3_600_000])),
            Some(10),
        ))
        .await?;
    until("the first run to fail once", || async {
        let newest = runs(&s, "notes").await?.into_iter().next();
        Ok(newest.is_some_and(|r| r.fanning_out && r.error.contains("503")))
    })
    .await?;
    // The next day's fire finds it unfinished, though it has no live task.
    three_seconds_before(&db, &s, "2026-05-05T08:00:00Z").await?;
    until("the second fire to be recorded", || async {
        Ok(runs(&s, "notes").await?.len() == 2)
    })
    .await?;
    let all = runs(&s, "notes").await?;
    assert_eq!(all[0].kind, RunKind::SkippedOverlap as i32, "{all:?}");
    assert!(all[1].fanning_out, "{all:?}");
    Ok(())
}

/// Imports `n` contacts `u00001`… named `User 1`… into a new WeCom audience `id`.
async fn crowd(s: &SchedulerProcess, id: &str, n: usize) -> Result<()> {
    let mut c = audience(s, id, vec![]).await?;
    let mut csv = String::from("recipient,name\n");
    for i in 1..=n {
        csv.push_str(&format!("u{i:05},User {i}\n"));
    }
    let chunks: Vec<ImportContactsCsvRequest> = csv
        .as_bytes()
        .chunks(64 * 1024)
        .enumerate()
        .map(|(i, data)| ImportContactsCsvRequest {
            audience_id: if i == 0 { id.into() } else { String::new() },
            data: data.to_vec(),
        })
        .collect();
    let mut progress = c
        .import_contacts_csv(tokio_stream::iter(chunks))
        .await?
        .into_inner();
    while progress.message().await?.is_some() {}
    Ok(())
}

/// Per audience: how many tasks were made for it, and for how many distinct recipients.
async fn audience_tasks(db: &TestDb, audience: &str) -> Result<(i64, i64)> {
    let row = db
        .connect()
        .await?
        .query_one(
            "SELECT count(*) AS tasks, count(DISTINCT recipient) AS recipients
             FROM herald.task_records WHERE audience_id = $1",
            &[&audience],
        )
        .await?;
    Ok((row.get("tasks"), row.get("recipients")))
}

/// Creates a campaign named `name` sending template `template` to all of `audience`.
async fn audience_campaign(
    campaigns: &mut CampaignServiceClient<Channel>,
    name: &str,
    queue: &str,
    template: &str,
    audience: &str,
) -> Result<Campaign> {
    Ok(campaigns
        .create_campaign(CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                name: name.into(),
                queue: queue.into(),
                content: Some(uses(template, &[])),
                audience: Some(AudienceTarget {
                    audience_id: audience.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            recipients: vec![],
            ..Default::default()
        })
        .await?
        .into_inner())
}

/// Waits until the campaign has added its whole audience, and returns it.
async fn audience_added(campaigns: &CampaignServiceClient<Channel>, id: &str) -> Result<Campaign> {
    until("the campaign to add its whole audience", || {
        let mut campaigns = campaigns.clone();
        async move {
            let c = campaigns
                .get_campaign(GetCampaignRequest { id: id.into() })
                .await?
                .into_inner();
            Ok(!c.adding_audience)
        }
    })
    .await?;
    Ok(campaigns
        .clone()
        .get_campaign(GetCampaignRequest { id: id.into() })
        .await?
        .into_inner())
}

/// A campaign's audience reaching the 100,000-recipient cap adds the contacts that fit and
/// stops there, saying why; the page that crossed the cap used to be refused whole, so the
/// room left was never used.
#[tokio::test]
async fn an_audience_past_the_recipient_cap_adds_what_fits_and_says_why_it_stopped() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    // Campaigns made from here on start with 99,998 recipients counted: two places left.
    db.connect()
        .await?
        .batch_execute(
            "CREATE FUNCTION herald.test_nearly_full() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN NEW.recipient_count := 99998; RETURN NEW; END $$;
             CREATE TRIGGER test_nearly_full BEFORE INSERT ON herald.campaigns
                 FOR EACH ROW EXECUTE FUNCTION herald.test_nearly_full()",
        )
        .await?;
    let five = (0..5)
        .map(|i| contact(&format!("u{i}"), "N", "", &[], ""))
        .collect();
    audience(&s, "five", five).await?;
    text_template(&s, "hello", "Hello {{ name }}").await?;
    let mut campaigns = CampaignServiceClient::connect(s.grpc_url()).await?;
    let created =
        audience_campaign(&mut campaigns, "near the cap", "capped", "hello", "five").await?;
    let stopped = audience_added(&campaigns, &created.id).await?;
    assert!(
        stopped.audience_error.contains("100,000"),
        "{}",
        stopped.audience_error
    );
    assert_eq!(
        audience_tasks(&db, "five").await?,
        (2, 2),
        "the two that fitted"
    );
    assert_eq!(stopped.progress.map(|p| p.total), Some(100_000));
    Ok(())
}

#[tokio::test]
async fn a_campaign_to_a_large_audience_adds_it_in_pages_and_a_page_added_twice_adds_nothing(
) -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    crowd(&s, "crowd", 2_500).await?;
    text_template(&s, "offer", "Hello {{ name }}").await?;
    let mut campaigns = CampaignServiceClient::connect(s.grpc_url()).await?;
    let created = audience_campaign(&mut campaigns, "everyone", "offers", "offer", "crowd").await?;
    // The call wrote the first page and answered; the rest follows in the background.
    let first = created.progress.as_ref().map_or(0, |p| p.total);
    ensure!(
        first >= 1_000,
        "the first page was not added by the call: {first}"
    );
    let done = audience_added(&campaigns, &created.id).await?;
    assert_eq!(done.progress.as_ref().map(|p| p.total), Some(2_500));
    assert_eq!(done.audience_error, "");
    assert_eq!(audience_tasks(&db, "crowd").await?, (2_500, 2_500));

    // A replica that died after adding a page but before moving the cursor: the pages are
    // added again from the start, and nothing is added twice.
    db.connect()
        .await?
        .execute(
            "UPDATE herald.campaigns SET audience_pending = true, audience_after = ''",
            &[],
        )
        .await?;
    let again = audience_added(&campaigns, &created.id).await?;
    assert_eq!(again.progress.as_ref().map(|p| p.total), Some(2_500));
    assert_eq!(audience_tasks(&db, "crowd").await?, (2_500, 2_500));

    // Tasks remember their audience: a bulk operation and ListTasks select by it, and a task
    // to the same queue from elsewhere is not among them.
    let mut tasks = TaskServiceClient::connect(s.grpc_url()).await?;
    tasks
        .create_task(CreateTaskRequest {
            task: Some(TaskSpec {
                queue: "offers".into(),
                recipient: "u00001".into(),
                content: Some(Content {
                    body: Some(content::Body::Text("not from the audience".into())),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await?;
    let by_audience = TaskFilter {
        audience_id: "crowd".into(),
        ..Default::default()
    };
    let dry_run = tasks
        .start_bulk_operation(StartBulkOperationRequest {
            action: BulkAction::Cancel as i32,
            filter: Some(by_audience.clone()),
            dry_run: true,
            reschedule: None,
        })
        .await?
        .into_inner();
    assert_eq!(dry_run.matched, 2_500);
    let page = tasks
        .list_tasks(ListTasksRequest {
            filter: Some(TaskFilter {
                ..by_audience.clone()
            }),
            page_size: 1_000,
            ..Default::default()
        })
        .await?
        .into_inner()
        .tasks;
    assert_eq!(page.len(), 1_000);
    assert!(page
        .iter()
        .all(|t| t.audience_id == "crowd" && t.campaign_id == created.id));

    // An audience deleted while its campaign is still adding it stops the campaign there,
    // with why.
    AudienceServiceClient::connect(s.grpc_url())
        .await?
        .delete_audience(DeleteAudienceRequest { id: "crowd".into() })
        .await?;
    db.connect()
        .await?
        .execute(
            "UPDATE herald.campaigns SET audience_pending = true, audience_after = 'u02000'",
            &[],
        )
        .await?;
    let stopped = audience_added(&campaigns, &created.id).await?;
    assert!(
        stopped.audience_error.contains("no longer exists"),
        "{}",
        stopped.audience_error
    );
    Ok(())
}

#[tokio::test]
async fn an_audience_contact_that_does_not_render_is_left_out_and_holds_up_no_campaign(
) -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    audience(
        &s,
        "club",
        vec![
            contact("ann", "Ann", "", &[], "1990-05-01"),
            contact("bob", "Bob", "", &[], ""),
        ],
    )
    .await?;
    text_template(&s, "birthday", "Happy {{ birthday }}, {{ name }}").await?;
    let mut campaigns = CampaignServiceClient::connect(s.grpc_url()).await?;
    let club = audience_campaign(&mut campaigns, "birthdays", "greetings", "birthday", "club")
        .await
        .context("a contact without the template's attribute refused the whole campaign")?;
    // Bob has no birthday to render: he is left out, Ann is not.
    assert_eq!(
        texts(&s, "greetings").await?,
        [("ann".to_string(), "Happy 1990-05-01, Ann".to_string())].into()
    );
    let club = audience_added(&campaigns, &club.id).await?;
    assert_eq!(club.progress.as_ref().map(|p| p.total), Some(1));
    assert_eq!(club.audience_error, "");

    // A campaign whose pages cannot be added (its stored spec no longer decodes) holds up no
    // campaign listed after it.
    db.connect()
        .await?
        .execute(
            "UPDATE herald.campaigns SET spec = '\\x00ff'::bytea, audience_pending = true
             WHERE id = $1::text::uuid",
            &[&club.id],
        )
        .await?;
    crowd(&s, "crowd", 1_500).await?;
    text_template(&s, "offer", "Hello {{ name }}").await?;
    let everyone =
        audience_campaign(&mut campaigns, "everyone", "offers", "offer", "crowd").await?;
    let done = audience_added(&campaigns, &everyone.id).await?;
    assert_eq!(done.progress.as_ref().map(|p| p.total), Some(1_500));
    assert_eq!(audience_tasks(&db, "crowd").await?, (1_500, 1_500));
    Ok(())
}

/// UpdateSchedule checks what CreateSchedule checks, no more and no less: an inline schedule
/// whose template takes its figures from a variables source can be edited, and an audience
/// that does not exist (or a date attribute it does not declare) is refused naming the field.
#[tokio::test]
async fn update_schedule_checks_the_audience_and_renders_as_create_does() -> Result<()> {
    use herald_proto::v1::UpdateScheduleRequest;
    let db = TestDb::new().await?;
    let source = WebhookReceiver::start_https().await?;
    let s = sourcing_scheduler(&db, &source, true).await?;
    audience(&s, "team", vec![contact("ann", "Ann", "", &[], "")]).await?;
    text_template(&s, "note", "{{ figure }} today").await?;
    let mut schedules = ScheduleServiceClient::connect(s.grpc_url()).await?;
    schedules
        .create_schedule(CreateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "notes".into(),
                cron: "0 8 * * *".into(),
                time_zone: "UTC".into(),
                queue: "notes".into(),
                recipients: vec!["ann".into(), "bob".into()],
                variables_source: Some(VariablesSource {
                    url: format!("{}/v", source.url()),
                    timeout: None,
                }),
                content: Some(uses("note", &[])),
                ..Default::default()
            }),
        })
        .await?;
    let update = |spec: ScheduleSpec, paths: &[&str]| UpdateScheduleRequest {
        schedule: Some(ScheduleSpec {
            id: "notes".into(),
            ..spec
        }),
        update_mask: Some(prost_types::FieldMask {
            paths: paths.iter().map(|p| p.to_string()).collect(),
        }),
    };
    let edited = schedules
        .update_schedule(update(
            ScheduleSpec {
                cron: "0 9 * * *".into(),
                ..Default::default()
            },
            &["cron"],
        ))
        .await
        .context("an edit of a source-fed schedule was refused")?
        .into_inner();
    assert_eq!(
        edited.schedule.and_then(|s| s.spec).map(|s| s.cron),
        Some("0 9 * * *".into())
    );

    for (target, field) in [
        (
            AudienceTarget {
                audience_id: "no-such-team".into(),
                ..Default::default()
            },
            "schedule.audience.audience_id",
        ),
        (
            AudienceTarget {
                audience_id: "team".into(),
                date_attribute: "hired".into(),
                ..Default::default()
            },
            "schedule.audience.date_attribute",
        ),
    ] {
        let refused = schedules
            .update_schedule(update(
                ScheduleSpec {
                    recipients: vec![],
                    audience: Some(target),
                    ..Default::default()
                },
                &["recipients", "audience"],
            ))
            .await
            .err()
            .with_context(|| format!("an update with a bad {field} was accepted"))?;
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(field), "{refused:?}");
    }
    let stored = schedules
        .get_schedule(GetScheduleRequest { id: "notes".into() })
        .await?
        .into_inner();
    let spec = stored.spec.context("no spec")?;
    assert_eq!((spec.audience, spec.recipients.len()), (None, 2));
    Ok(())
}

/// A fire time that falls due while the leader is busy (here, waiting on a slow variables
/// source for another schedule) is on time when the leader reaches it, however late: a
/// schedule with a one-second grace and misfire SKIP still gets its run, as a fired one.
#[tokio::test]
async fn a_fire_time_due_while_the_leader_was_busy_is_not_a_misfire() -> Result<()> {
    let db = TestDb::new().await?;
    let source = WebhookReceiver::start_https().await?;
    let s = sourcing_scheduler(&db, &source, true).await?;
    audience(&s, "team", vec![contact("ann", "Ann", "", &[], "")]).await?;
    text_template(&s, "note", "{{ name }}: {{ figure }}").await?;
    let (gate, mut schedules) = notes_held_on_their_source(
        &db,
        &s,
        &source,
        r#"{"recipients": {"ann": {"figure": 7}}}"#,
    )
    .await?;
    schedules
        .create_schedule(CreateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "minutely".into(),
                cron: "1 8 * * *".into(),
                time_zone: "UTC".into(),
                queue: "reports".into(),
                recipients: vec!["ops".into()],
                misfire: MisfirePolicy::Skip as i32,
                misfire_grace: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                content: Some(Content {
                    body: Some(content::Body::Text("08:01 report".into())),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await?;
    // The leader waits on the source for the 08:00 run; meanwhile 08:01 passes.
    db.connect()
        .await?
        .execute(
            "SELECT herald.set_test_clock('2026-05-04T08:01:05Z'::timestamptz - now())",
            &[],
        )
        .await?;
    gate.release();
    let cursor_past = || async {
        let row = db
            .connect()
            .await?
            .query_one(
                "SELECT next_fire_at > '2026-05-04T08:01:00Z' AS past FROM herald.schedules
                 WHERE id = 'minutely'",
                &[],
            )
            .await?;
        anyhow::Ok(row.get::<_, bool>("past"))
    };
    until("the leader to reach the 08:01 fire time", cursor_past).await?;
    let runs = runs(&s, "minutely").await?;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].kind, RunKind::Fired as i32, "{runs:?}");
    assert_eq!(runs[0].task_count, 1, "{runs:?}");
    Ok(())
}

/// A run already made keeps what it sends: an UpdateSchedule of the content while the run is
/// still fanning out (its first batch waiting on the variables source) applies from the next
/// run; this run's later batches go out as it was made.
#[tokio::test]
async fn a_run_fanning_out_keeps_its_content_when_the_schedule_changes() -> Result<()> {
    use herald_proto::v1::UpdateScheduleRequest;
    let db = TestDb::new().await?;
    let source = WebhookReceiver::start_https().await?;
    let s = sourcing_scheduler(&db, &source, true).await?;
    // One contact more than a batch: the run takes two.
    crowd(&s, "team", 501).await?;
    text_template(&s, "note", "{{ name }}: {{ figure }}").await?;
    text_template(&s, "other", "changed: {{ figure }}").await?;
    let figures: serde_json::Map<String, serde_json::Value> = (1..=501)
        .map(|i| (format!("u{i:05}"), serde_json::json!({"figure": i})))
        .collect();
    let body = serde_json::json!({ "recipients": figures }).to_string();
    let (gate, mut schedules) = notes_held_on_their_source(&db, &s, &source, &body).await?;
    schedules
        .update_schedule(UpdateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "notes".into(),
                content: Some(uses("other", &[])),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["content".into()],
            }),
        })
        .await?;
    gate.release();
    until("the run to fan out", || fanned_out(&db, "notes", 1)).await?;
    let texts = texts(&s, "notes").await?;
    assert_eq!(texts.len(), 501);
    assert_eq!(
        texts.get("u00501").map(String::as_str),
        Some("User 501: 501")
    );
    assert!(
        texts.values().all(|t| !t.starts_with("changed")),
        "the run's later batch took the new content"
    );
    Ok(())
}
