//! CampaignService on the real binary: 10,000 recipients paused midway and resumed with each
//! sent exactly once, cancel midway with nothing sent after it returns, duplicates dropped,
//! and local-time sends.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use herald_proto::v1::{
    campaign_service_client::CampaignServiceClient, content, scheduler_message,
    AddRecipientsRequest, CampaignRecipient, CampaignSpec, CampaignState, CancelCampaignRequest,
    Content, CreateCampaignRequest, CreateTaskRequest, GetCampaignRequest, OutcomeClass,
    PauseCampaignRequest, ResumeCampaignRequest, RevokeResult,
};
use herald_tests::lease::{lease_ref, result, ScriptedExecutor};
use herald_tests::{connect_tasks, task_spec, SchedulerProcess, TestDb};
use tonic::transport::Channel;

const QUEUE: &str = "campaign";

async fn client(s: &SchedulerProcess) -> Result<CampaignServiceClient<Channel>> {
    Ok(CampaignServiceClient::connect(s.grpc_url()).await?)
}

fn spec() -> CampaignSpec {
    CampaignSpec {
        name: "launch".into(),
        queue: QUEUE.into(),
        content: Some(Content {
            body: Some(content::Body::Text("we launched".into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn create_with(c: &mut CampaignServiceClient<Channel>, n: usize) -> Result<String> {
    let id = c
        .create_campaign(CreateCampaignRequest {
            campaign: Some(spec()),
            recipients: vec![],
            ..Default::default()
        })
        .await?
        .into_inner()
        .id;
    let all: Vec<CampaignRecipient> = (0..n)
        .map(|i| CampaignRecipient {
            recipient: format!("user-{i}"),
            ..Default::default()
        })
        .collect();
    for chunk in all.chunks(1_000) {
        c.add_recipients(AddRecipientsRequest {
            campaign_id: id.clone(),
            recipients: chunk.to_vec(),
        })
        .await?;
    }
    Ok(id)
}

/// Leases and reports OK until `target` sends in total, counting recipients.
async fn send_until(
    exec: &mut ScriptedExecutor,
    sent: &mut HashMap<String, usize>,
    target: usize,
) -> Result<()> {
    while sent.values().sum::<usize>() < target {
        let want = (target - sent.values().sum::<usize>()).min(500);
        exec.credit(want as u32).await?;
        let leases = exec.leases(want).await?;
        for l in &leases {
            *sent.entry(l.recipient.clone()).or_default() += 1;
        }
        exec.report_each(&leases, OutcomeClass::Ok).await?;
    }
    Ok(())
}

async fn live_or_done(db: &TestDb, id: &str) -> Result<i64> {
    let c = db.connect().await?;
    let id: uuid::Uuid = id.parse()?;
    Ok(c.query_one(
        "SELECT count(*) FROM herald.tasks WHERE campaign_id = $1
           AND state IN ('leased', 'succeeded', 'failed')",
        &[&id],
    )
    .await?
    .get(0))
}

#[tokio::test]
async fn ten_thousand_paused_midway_and_resumed_each_sent_once() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let id = create_with(&mut c, 10_000).await?;
    // Duplicates are dropped.
    let dup = c
        .add_recipients(AddRecipientsRequest {
            campaign_id: id.clone(),
            recipients: vec![
                CampaignRecipient {
                    recipient: "user-7".into(),
                    ..Default::default()
                };
                2
            ],
        })
        .await?
        .into_inner();
    assert_eq!((dup.added, dup.duplicates, dup.total), (0, 2, 10_000));

    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[QUEUE], 0).await?;
    let mut sent = HashMap::new();
    send_until(&mut exec, &mut sent, 5_000).await?;
    let paused = c
        .pause_campaign(PauseCampaignRequest { id: id.clone() })
        .await?
        .into_inner();
    assert_eq!(paused.state, CampaignState::Paused as i32);
    let at_pause = live_or_done(&db, &id).await?;
    // With credit on offer, nothing of the paused campaign is leased.
    exec.credit(500).await?;
    // A heartbeat round trip after the credit: the dispatcher had the credit and an empty
    // claim behind it, so a lease would have come first.
    exec.send(herald_proto::v1::executor_message::Kind::Heartbeat(
        herald_proto::v1::Heartbeat::default(),
    ))
    .await?;
    if let scheduler_message::Kind::Leases(b) = exec.next().await? {
        bail!("leased while paused: {}", b.leases.len());
    }
    assert_eq!(live_or_done(&db, &id).await?, at_pause);
    let progress = c
        .get_campaign(GetCampaignRequest { id: id.clone() })
        .await?
        .into_inner()
        .progress
        .unwrap_or_default();
    assert_eq!(
        (progress.total, progress.sent, progress.scheduled),
        (10_000, 5_000, 5_000)
    );

    c.resume_campaign(ResumeCampaignRequest { id: id.clone() })
        .await?;
    // The 500 credits granted while paused are used first.
    let leases = exec.leases(500).await?;
    for l in &leases {
        *sent.entry(l.recipient.clone()).or_default() += 1;
    }
    exec.report_each(&leases, OutcomeClass::Ok).await?;
    send_until(&mut exec, &mut sent, 10_000).await?;
    assert_eq!(sent.len(), 10_000);
    assert!(sent.values().all(|n| *n == 1));
    let done = c
        .get_campaign(GetCampaignRequest { id: id.clone() })
        .await?
        .into_inner();
    let p = done.progress.unwrap_or_default();
    assert_eq!((p.sent, p.scheduled), (10_000, 0));
    assert_eq!(done.state, CampaignState::Finished as i32);
    Ok(())
}

#[tokio::test]
async fn cancel_midway_nothing_is_sent_after_it_returns() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let id = create_with(&mut c, 2_000).await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[QUEUE], 0).await?;
    let mut sent = HashMap::new();
    send_until(&mut exec, &mut sent, 500).await?;
    // 20 more leased and held unreported when the cancel comes.
    exec.credit(20).await?;
    let held = exec.leases(20).await?;
    let mut cancel_client = c.clone();
    let cid = id.clone();
    let cancel = tokio::spawn(async move {
        cancel_client
            .cancel_campaign(CancelCampaignRequest { id: cid })
            .await
    });
    let mut revoked = 0;
    while revoked < held.len() {
        match exec.next().await? {
            scheduler_message::Kind::Revoke(r) => {
                if let Some(lease) = r.lease {
                    exec.revoke_ack(lease, RevokeResult::StoppedBeforeSend)
                        .await?;
                    revoked += 1;
                }
            }
            other => bail!("expected revokes, got {other:?}"),
        }
    }
    let response = cancel.await??.into_inner();
    assert_eq!(response.revoked, 20);
    assert_eq!(response.in_flight_at_cancel, 0);
    assert_eq!(response.cancelled_scheduled, 1_480);
    // After the cancel returned: credit on offer, nothing leased; a late report changes nothing.
    exec.credit(500).await?;
    // A heartbeat round trip after the credit: the dispatcher had the credit and an empty
    // claim behind it, so a lease would have come first.
    exec.send(herald_proto::v1::executor_message::Kind::Heartbeat(
        herald_proto::v1::Heartbeat::default(),
    ))
    .await?;
    if let scheduler_message::Kind::Leases(b) = exec.next().await? {
        bail!("leased after cancel: {}", b.leases.len());
    }
    let _ = lease_ref(&held[0]);
    let p = c
        .get_campaign(GetCampaignRequest { id })
        .await?
        .into_inner()
        .progress
        .unwrap_or_default();
    assert_eq!((p.sent, p.cancelled, p.scheduled), (500, 1_500, 0));
    Ok(())
}

#[tokio::test]
async fn local_time_sends_use_each_recipients_zone() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let day = (chrono::Utc::now() + chrono::Duration::days(30)).date_naive();
    let mut spec = task_spec(QUEUE, "tokyo-user", "ohayo");
    spec.local_time = format!("{day}T09:00");
    spec.local_time_zone = "Asia/Tokyo".into();
    let task = tasks
        .create_task(CreateTaskRequest { task: Some(spec) })
        .await?
        .into_inner()
        .task
        .unwrap_or_default();
    let expected = day
        .and_hms_opt(0, 0, 0)
        .unwrap_or_default()
        .and_utc()
        .timestamp();
    assert_eq!(task.run_at.unwrap_or_default().seconds, expected);

    let mut c = client(&s).await?;
    let mut campaign = spec_local(&day.to_string());
    campaign.time_zone = "Europe/Berlin".into();
    // A send window in each recipient's zone rides along on every task.
    campaign.send_window = Some(herald_proto::v1::SendWindow {
        start: "08:00".into(),
        end: "20:00".into(),
        ..Default::default()
    });
    let created = c
        .create_campaign(CreateCampaignRequest {
            campaign: Some(campaign),
            recipients: vec![
                CampaignRecipient {
                    recipient: "ny".into(),
                    time_zone: "America/New_York".into(),
                    ..Default::default()
                },
                CampaignRecipient {
                    recipient: "berlin".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        })
        .await?
        .into_inner();
    let conn = db.connect().await?;
    let cid: uuid::Uuid = created.id.parse()?;
    let rows = conn
        .query(
            "SELECT recipient, (run_at AT TIME ZONE CASE recipient WHEN 'ny'
                 THEN 'America/New_York' ELSE 'Europe/Berlin' END)::time::text
             FROM herald.tasks WHERE campaign_id = $1",
            &[&cid],
        )
        .await?;
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(
            r.get::<_, String>(1),
            "09:00:00",
            "{}",
            r.get::<_, String>(0)
        );
    }
    let windows = conn
        .query(
            "SELECT recipient, window_zone, window_start::text AS window_start,
                    window_end::text AS window_end
             FROM herald.tasks WHERE campaign_id = $1 ORDER BY recipient",
            &[&cid],
        )
        .await?;
    let got: Vec<(String, String, String, String)> = windows
        .iter()
        .map(|r| {
            (
                r.get("recipient"),
                r.get("window_zone"),
                r.get("window_start"),
                r.get("window_end"),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "berlin".into(),
                "Europe/Berlin".into(),
                "08:00:00".into(),
                "20:00:00".into()
            ),
            (
                "ny".into(),
                "America/New_York".into(),
                "08:00:00".into(),
                "20:00:00".into()
            ),
        ]
    );
    Ok(())
}

fn spec_local(day: &str) -> CampaignSpec {
    CampaignSpec {
        local_start: format!("{day}T09:00"),
        ..spec()
    }
}

/// A CreateCampaign refused for one of its first recipients writes nothing: it used to leave an
/// ACTIVE campaign without recipients behind, listed and shown, its id never given to the
/// caller. A good request afterwards creates the campaign and its tasks.
#[tokio::test]
async fn a_campaign_refused_for_a_recipient_is_not_created() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let sql = db.connect().await?;
    let recipients = |second: &str| {
        vec![
            CampaignRecipient {
                recipient: "user-1".into(),
                ..Default::default()
            },
            CampaignRecipient {
                recipient: second.into(),
                ..Default::default()
            },
        ]
    };
    let refused = c
        .create_campaign(CreateCampaignRequest {
            campaign: Some(spec()),
            recipients: recipients(""),
            ..Default::default()
        })
        .await
        .err()
        .context("a campaign with an empty recipient was created")?;
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("recipients[1].recipient"),
        "{refused:?}"
    );
    let count = |table: &'static str| {
        let sql = &sql;
        async move {
            anyhow::Ok(
                sql.query_one(&format!("SELECT count(*) FROM herald.{table}"), &[])
                    .await?
                    .get::<_, i64>(0),
            )
        }
    };
    assert_eq!(
        count("campaigns").await?,
        0,
        "a refused campaign was written"
    );
    assert_eq!(count("tasks").await?, 0);

    let created = c
        .create_campaign(CreateCampaignRequest {
            campaign: Some(spec()),
            recipients: recipients("user-2"),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        created.progress.map(|p| p.total),
        Some(2),
        "the campaign's recipients"
    );
    assert_eq!(count("campaigns").await?, 1);
    assert_eq!(count("tasks").await?, 2);
    Ok(())
}

/// A campaign's start and deadline have a task's bounds: starting more than 366 days ahead (by
/// instant or wall clock) or expiring before it starts is INVALID_ARGUMENT naming the field,
/// and nothing is written (each made tasks CreateTask would refuse).
#[tokio::test]
async fn a_campaigns_start_and_deadline_have_a_tasks_bounds() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let year = |y: i64| prost_types::Timestamp::date_time(y, 1, 1, 9, 0, 0);
    let in_a_week = prost_types::Timestamp::from(
        std::time::SystemTime::now() + std::time::Duration::from_secs(7 * 86_400),
    );
    let tomorrow = prost_types::Timestamp::from(
        std::time::SystemTime::now() + std::time::Duration::from_secs(86_400),
    );
    let local_in_a_week = (chrono::Utc::now() + chrono::Duration::days(7))
        .format("%Y-%m-%dT%H:%M")
        .to_string();
    let cases = [
        (
            "campaign.start_at",
            CampaignSpec {
                start_at: Some(year(2099)?),
                ..spec()
            },
        ),
        (
            "campaign.local_start",
            CampaignSpec {
                local_start: "2200-01-01T09:00".into(),
                ..spec()
            },
        ),
        (
            "campaign.expire_at",
            CampaignSpec {
                start_at: Some(in_a_week),
                expire_at: Some(tomorrow),
                ..spec()
            },
        ),
        // A wall-clock start is checked too: it made a campaign whose every task expired.
        (
            "campaign.expire_at",
            CampaignSpec {
                local_start: local_in_a_week,
                time_zone: "America/New_York".into(),
                expire_at: Some(tomorrow),
                ..spec()
            },
        ),
    ];
    for (field, campaign) in cases {
        let status = c
            .create_campaign(CreateCampaignRequest {
                campaign: Some(campaign),
                recipients: vec![CampaignRecipient {
                    recipient: "user-1".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .await
            .err()
            .with_context(|| format!("{field}: created"))?;
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{field}: {status:?}"
        );
        assert!(status.message().contains(field), "{field}: {status:?}");
    }
    let campaigns: i64 = db
        .connect()
        .await?
        .query_one("SELECT count(*) FROM herald.campaigns", &[])
        .await?
        .get(0);
    assert_eq!(campaigns, 0, "a refused campaign was written");

    // A cancelled campaign can be neither paused nor resumed (both answered OK).
    let id = c
        .create_campaign(CreateCampaignRequest {
            campaign: Some(spec()),
            recipients: vec![],
            ..Default::default()
        })
        .await?
        .into_inner()
        .id;
    c.cancel_campaign(CancelCampaignRequest { id: id.clone() })
        .await?;
    let paused = c
        .pause_campaign(PauseCampaignRequest { id: id.clone() })
        .await
        .err()
        .context("a cancelled campaign was paused")?;
    assert_eq!(paused.code(), tonic::Code::FailedPrecondition, "{paused:?}");
    let resumed = c
        .resume_campaign(ResumeCampaignRequest { id })
        .await
        .err()
        .context("a cancelled campaign was resumed")?;
    assert_eq!(
        resumed.code(),
        tonic::Code::FailedPrecondition,
        "{resumed:?}"
    );
    Ok(())
}

/// "+1650…" and "1650…" are one WhatsApp user (the suppression list already says so): a
/// campaign gives them one task, within a chunk and across chunks, and a schedule may not list
/// both. Before, that user got the campaign twice.
#[tokio::test]
async fn one_number_with_and_without_its_plus_is_one_recipient() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let recipient = |r: &str| CampaignRecipient {
        recipient: r.into(),
        ..Default::default()
    };
    let created = c
        .create_campaign(CreateCampaignRequest {
            campaign: Some(spec()),
            recipients: vec![
                recipient("+16505550101"),
                recipient("16505550101"),
                recipient("+16505550101"),
                recipient("+16505550102"),
            ],
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(created.progress.map(|p| p.total), Some(2));
    let again = c
        .add_recipients(AddRecipientsRequest {
            campaign_id: created.id.clone(),
            recipients: vec![recipient("16505550102"), recipient("16505550103")],
        })
        .await?
        .into_inner();
    assert_eq!((again.added, again.duplicates, again.total), (1, 1, 3));

    let mut schedules =
        herald_proto::v1::schedule_service_client::ScheduleServiceClient::connect(s.grpc_url())
            .await?;
    let refused = schedules
        .create_schedule(herald_proto::v1::CreateScheduleRequest {
            schedule: Some(herald_proto::v1::ScheduleSpec {
                id: "twice".into(),
                cron: "0 9 * * *".into(),
                queue: QUEUE.into(),
                recipients: vec!["+16505550101".into(), "16505550101".into()],
                content: spec().content,
                ..Default::default()
            }),
        })
        .await
        .err()
        .context("a schedule listing one number twice was created")?;
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("schedule.recipients"),
        "{refused:?}"
    );
    Ok(())
}

/// CreateCampaign retried with its idempotency key (its answer lost to a timeout, say) answers
/// the campaign the first call made, with the first chunk's recipients once, instead of a
/// second campaign messaging everyone again. The key on another campaign is ALREADY_EXISTS.
#[tokio::test]
async fn a_create_campaign_retried_with_its_key_makes_one_campaign() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let request = |name: &str, recipients: &[&str]| CreateCampaignRequest {
        campaign: Some(CampaignSpec {
            name: name.into(),
            ..spec()
        }),
        recipients: recipients
            .iter()
            .map(|r| CampaignRecipient {
                recipient: (*r).into(),
                ..Default::default()
            })
            .collect(),
        idempotency_key: "spring-sale-2027".into(),
    };
    let first = c
        .create_campaign(request("spring", &["user-1", "user-2"]))
        .await?
        .into_inner();
    // The retry carries the same chunk, and one recipient more the client added meanwhile.
    let again = c
        .create_campaign(request("spring", &["user-1", "user-2", "user-3"]))
        .await?
        .into_inner();
    assert_eq!(again.id, first.id);
    assert_eq!(again.progress.map(|p| p.total), Some(3));
    let other = c
        .create_campaign(request("autumn", &["user-1"]))
        .await
        .err()
        .context("the key made a second campaign")?;
    assert_eq!(other.code(), tonic::Code::AlreadyExists, "{other:?}");
    assert!(other.message().contains("idempotency_key"), "{other:?}");
    let (campaigns, tasks): (i64, i64) = {
        let conn = db.connect().await?;
        (
            conn.query_one("SELECT count(*) FROM herald.campaigns", &[])
                .await?
                .get(0),
            conn.query_one("SELECT count(*) FROM herald.tasks", &[])
                .await?
                .get(0),
        )
    };
    assert_eq!((campaigns, tasks), (1, 3));

    // Retried once more after the campaign was cancelled: still that campaign, not an error.
    c.cancel_campaign(CancelCampaignRequest {
        id: first.id.clone(),
    })
    .await?;
    let late = c
        .create_campaign(request("spring", &["user-1", "user-2", "user-3"]))
        .await
        .context("a retry after the campaign was cancelled")?
        .into_inner();
    assert_eq!(
        (late.id, late.state),
        (first.id, CampaignState::Cancelled as i32)
    );
    Ok(())
}

/// Retrying a finished campaign's failure reopens the campaign, so its controls reach the
/// re-driven task: a finished campaign can be neither paused nor cancelled, and its retried
/// sends were out of the operator's reach.
#[tokio::test]
async fn retrying_a_finished_campaigns_failure_reopens_it() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let id = create_with(&mut c, 1).await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[QUEUE], 1).await?;
    let lease = exec.leases(1).await?.remove(0);
    exec.report_each(std::slice::from_ref(&lease), OutcomeClass::Permanent)
        .await?;
    let conn = db.connect().await?;
    // A campaign is finished a minute after its last change, by the sweep; here at once.
    conn.execute("SELECT herald.set_test_clock(interval '2 minutes')", &[])
        .await?;
    conn.execute("SELECT herald.finish_campaigns()", &[])
        .await?;
    let state = || async {
        anyhow::Ok(
            conn.query_one(
                "SELECT state::text FROM herald.campaigns WHERE id = $1::text::uuid",
                &[&id],
            )
            .await?
            .get::<_, String>(0),
        )
    };
    assert_eq!(state().await?, "finished");
    connect_tasks(&s.grpc_url())
        .await?
        .retry_task(herald_proto::v1::RetryTaskRequest {
            id: lease.task_id.clone(),
            ..Default::default()
        })
        .await?;
    assert_eq!(state().await?, "active");
    let paused = c
        .pause_campaign(PauseCampaignRequest { id: id.clone() })
        .await?
        .into_inner();
    assert_eq!(paused.state, CampaignState::Paused as i32);
    Ok(())
}

/// A campaign whose pool has no account able to send shows no finish estimate: it said "now"
/// at every refresh for a campaign that could not move.
#[tokio::test]
async fn a_campaign_whose_pool_cannot_send_has_no_finish_estimate() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    herald_proto::v1::account_service_client::AccountServiceClient::connect(s.grpc_url())
        .await?
        .create_account(herald_proto::v1::CreateAccountRequest {
            account: Some(herald_tests::accounts::whatsapp_account("wa-1", "wa", 5.0)),
        })
        .await?;
    let mut c = client(&s).await?;
    let created = c
        .create_campaign(CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                pool: "wa".into(),
                ..spec()
            }),
            recipients: vec![CampaignRecipient {
                recipient: "+15550001".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await?
        .into_inner();
    let estimate = |c: &mut CampaignServiceClient<Channel>| {
        let mut c = c.clone();
        let id = created.id.clone();
        async move {
            anyhow::Ok(
                c.get_campaign(GetCampaignRequest { id })
                    .await?
                    .into_inner()
                    .progress
                    .and_then(|p| p.estimated_finish),
            )
        }
    };
    assert!(
        estimate(&mut c).await?.is_some(),
        "no estimate with a sending pool"
    );
    db.connect()
        .await?
        .execute("UPDATE herald.accounts SET state = 'paused'", &[])
        .await?;
    assert_eq!(estimate(&mut c).await?, None);
    Ok(())
}

/// A campaign's labels are checked as a task's are, with one entry left for the
/// `herald.campaign_id` every task of it carries: a bad one is INVALID_ARGUMENT naming
/// `campaign.labels`, and nothing is written.
#[tokio::test]
async fn a_campaigns_bad_labels_are_refused_naming_the_field() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let full: std::collections::BTreeMap<String, String> =
        (0..32).map(|i| (format!("k{i}"), "v".into())).collect();
    let long: std::collections::BTreeMap<String, String> =
        [("team".to_string(), "x".repeat(257))].into();
    for (labels, why) in [(full, "at most 31"), (long, "at most 256")] {
        let refused = c
            .create_campaign(CreateCampaignRequest {
                campaign: Some(CampaignSpec {
                    labels: labels.into_iter().collect(),
                    ..spec()
                }),
                recipients: vec![],
                ..Default::default()
            })
            .await
            .err()
            .with_context(|| format!("a campaign whose labels break {why:?} was created"))?;
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().contains("campaign.labels") && refused.message().contains(why),
            "{refused:?}"
        );
    }
    let written: i64 = db
        .connect()
        .await?
        .query_one("SELECT count(*) FROM herald.campaigns", &[])
        .await?
        .get(0);
    assert_eq!(written, 0, "a refused campaign was written");
    Ok(())
}

/// Only recipients new to a campaign count towards its 100,000 cap: a stream resumed from its
/// start near the cap adds nobody and is not refused, and a new recipient past it is.
#[tokio::test]
async fn recipients_already_in_a_campaign_near_its_cap_are_dropped_not_refused() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let id = create_with(&mut c, 1_000).await?;
    // As if 98,999 more had been added before the stream broke.
    let sql = db.connect().await?;
    sql.execute(
        "UPDATE herald.campaigns SET recipient_count = 99999 WHERE id = $1::text::uuid",
        &[&id],
    )
    .await?;
    let again: Vec<CampaignRecipient> = (0..1_000)
        .map(|i| CampaignRecipient {
            recipient: format!("user-{i}"),
            ..Default::default()
        })
        .collect();
    let resumed = c
        .add_recipients(AddRecipientsRequest {
            campaign_id: id.clone(),
            recipients: again.clone(),
        })
        .await
        .context("recipients already added were refused as over the cap")?
        .into_inner();
    assert_eq!((resumed.added, resumed.duplicates), (0, 1_000));
    // One new recipient still fits; a second does not.
    let one_more = |name: &str| AddRecipientsRequest {
        campaign_id: id.clone(),
        recipients: [
            again[..10].to_vec(),
            vec![CampaignRecipient {
                recipient: name.into(),
                ..Default::default()
            }],
        ]
        .concat(),
    };
    let fits = c.add_recipients(one_more("last")).await?.into_inner();
    assert_eq!((fits.added, fits.total), (1, 100_000));
    let over = c
        .add_recipients(one_more("too-many"))
        .await
        .err()
        .context("a recipient past the cap was added")?;
    assert_eq!(over.code(), tonic::Code::FailedPrecondition, "{over:?}");
    Ok(())
}

/// Recipients whose tasks ended and moved into the history are still the campaign's: once a
/// retry reopened the finished campaign, adding them again (a stream resumed from its start)
/// drops them as duplicates instead of sending them twice.
#[tokio::test]
async fn recipients_whose_tasks_moved_into_the_history_are_not_added_again() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::builder(&db)
        .env("HERALD_HISTORY_AFTER", "0s")
        .env("HERALD_RETENTION_INTERVAL", "100ms")
        .spawn()
        .await?;
    let mut c = client(&s).await?;
    let id = create_with(&mut c, 3).await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[QUEUE], 3).await?;
    let leases = exec.leases(3).await?;
    exec.report_each(&leases[..2], OutcomeClass::Ok).await?;
    exec.report_each(&leases[2..], OutcomeClass::Permanent)
        .await?;
    let sql = db.connect().await?;
    // A campaign is finished a minute after its last change, by the sweep; here at once. Its
    // ended tasks then move into the history.
    sql.execute("SELECT herald.set_test_clock(interval '2 minutes')", &[])
        .await?;
    sql.execute("SELECT herald.finish_campaigns()", &[]).await?;
    for lease in &leases {
        herald_tests::until_moved_to_history(&sql, &lease.task_id).await?;
    }
    connect_tasks(&s.grpc_url())
        .await?
        .retry_task(herald_proto::v1::RetryTaskRequest {
            id: leases[2].task_id.clone(),
            ..Default::default()
        })
        .await?;
    let again: Vec<CampaignRecipient> = (0..3)
        .map(|i| CampaignRecipient {
            recipient: format!("user-{i}"),
            ..Default::default()
        })
        .collect();
    let added = c
        .add_recipients(AddRecipientsRequest {
            campaign_id: id,
            recipients: again,
        })
        .await?
        .into_inner();
    assert_eq!((added.added, added.duplicates, added.total), (0, 3, 3));
    Ok(())
}

/// A replica that dies between a campaign cancel's transaction and its revokes leaves the
/// leased tasks parked for good: when their leases lapse they end CANCELLED (their send
/// unconfirmed), instead of waiting SCHEDULED forever on a route nothing claims.
#[tokio::test]
async fn a_cancelled_campaigns_parked_lease_that_lapses_ends_cancelled() -> Result<()> {
    use herald_proto::v1::{CancelOutcome, GetTaskRequest, TaskState};
    let db = TestDb::new().await?;
    let s = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", "2s")
        .spawn()
        .await?;
    let mut c = client(&s).await?;
    let id = create_with(&mut c, 1).await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[QUEUE], 1).await?;
    let lease = exec.leases(1).await?.remove(0);
    // Its revokes never come.
    cancel_committed(&db, &id).await?;
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    herald_tests::until("the lapsed lease to be swept", || {
        let mut tasks = tasks.clone();
        let id = lease.task_id.clone();
        async move {
            let t = tasks.get_task(GetTaskRequest { id }).await?.into_inner();
            Ok(t.state != TaskState::Leased as i32)
        }
    })
    .await?;
    let task = tasks
        .get_task(GetTaskRequest {
            id: lease.task_id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(task.state, TaskState::Cancelled as i32, "{task:?}");
    assert_eq!(task.cancel_outcome, CancelOutcome::Unconfirmed as i32);
    let p = c
        .get_campaign(GetCampaignRequest { id })
        .await?
        .into_inner()
        .progress
        .unwrap_or_default();
    assert_eq!((p.scheduled, p.cancelled), (0, 1));

    // The executor comes back and says the message went: the task learns it, and the report
    // batch is taken (it once failed on the sweeper's attempt row, and with it every report
    // the executor sent again on each new stream).
    exec.report(vec![result(&lease, OutcomeClass::Ok)])
        .await
        .context("the late report's batch failed")?;
    let task = tasks
        .get_task(GetTaskRequest {
            id: lease.task_id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(task.state, TaskState::Cancelled as i32, "{task:?}");
    assert_eq!(task.cancel_outcome, CancelOutcome::AlreadySent as i32);
    Ok(())
}

/// What CancelCampaign's transaction commits for campaign `id` (campaigns::cancel), before
/// the revokes that follow it: the campaign cancelled, its leased tasks parked for good.
async fn cancel_committed(db: &TestDb, id: &str) -> Result<()> {
    db.connect()
        .await?
        .batch_execute(&format!(
            "UPDATE herald.campaigns SET state = 'cancelled' WHERE id = '{id}';
             UPDATE herald.tasks SET route = 'cancelled:' || route
             WHERE campaign_id = '{id}' AND state = 'leased';"
        ))
        .await?;
    Ok(())
}

/// A campaign's cancel parked a leased task for good (its revoke not yet sent), and the send
/// then failed in a way worth retrying: the task ends CANCELLED, not SCHEDULED on the parked
/// route, where no claim would ever take it and nothing would end it.
#[tokio::test]
async fn a_parked_task_whose_send_fails_ends_cancelled() -> Result<()> {
    use herald_proto::v1::{CancelOutcome, GetTaskRequest, TaskState};
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let id = create_with(&mut c, 1).await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[QUEUE], 1).await?;
    let lease = exec.leases(1).await?.remove(0);
    cancel_committed(&db, &id).await?;
    exec.report(vec![result(&lease, OutcomeClass::Transient)])
        .await?;
    let task = connect_tasks(&s.grpc_url())
        .await?
        .get_task(GetTaskRequest {
            id: lease.task_id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(task.state, TaskState::Cancelled as i32, "{task:?}");
    assert_eq!(task.cancel_outcome, CancelOutcome::SendFailed as i32);
    let p = c
        .get_campaign(GetCampaignRequest { id })
        .await?
        .into_inner()
        .progress
        .unwrap_or_default();
    assert_eq!((p.scheduled, p.cancelled), (0, 1));
    Ok(())
}
