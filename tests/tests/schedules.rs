//! ScheduleService on the real binary: fire-time preview, misfire policies after the scheduler
//! was down across 5 fire times, SIGKILL and restart without duplicate or gap, and three
//! replicas materialising one schedule with each fire time once; RunScheduleNow outside the
//! fire-time rules; ListSchedules pages cut to what a client accepts when schedules are large.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use herald_proto::v1::{
    content, schedule_service_client::ScheduleServiceClient, Content, CreateScheduleRequest,
    GetScheduleRequest, ListScheduleRunsRequest, ListSchedulesRequest, MisfirePolicy,
    OverlapPolicy, PauseScheduleRequest, PreviewFireTimesRequest, RepeatedTimePolicy,
    ResumeScheduleRequest, RunKind, RunScheduleNowRequest, ScheduleSpec,
};
use herald_tests::{read_every_page, until, SchedulerProcess, TestDb};
use tonic::transport::Channel;

async fn client(s: &SchedulerProcess) -> Result<ScheduleServiceClient<Channel>> {
    Ok(ScheduleServiceClient::connect(s.grpc_url()).await?)
}

fn every(seconds: u32, id: &str, misfire: MisfirePolicy, recipients: &[&str]) -> ScheduleSpec {
    ScheduleSpec {
        id: id.into(),
        cron: format!("*/{seconds} * * * * *"),
        time_zone: "Europe/Berlin".into(),
        misfire: misfire as i32,
        misfire_grace: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        queue: "reports".into(),
        recipients: recipients.iter().map(|r| (*r).to_string()).collect(),
        content: Some(Content {
            body: Some(content::Body::Text("daily report".into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Runs of a schedule: fire time (epoch seconds) → (kind, tasks linked to it).
async fn runs(db: &TestDb, id: &str) -> Result<BTreeMap<i64, (String, i64)>> {
    let c = db.connect().await?;
    let rows = c
        .query(
            "SELECT extract(epoch FROM r.fire_time)::bigint, r.kind,
                    (SELECT count(*) FROM herald.tasks t
                     WHERE t.schedule_id = r.schedule_id AND t.fire_time = r.fire_time)
             FROM herald.schedule_runs r WHERE r.schedule_id = $1",
            &[&id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect())
}

/// The scheduler started again `down` (an SQL interval) later by the test clock, once each of
/// `schedules` has a run on time after it came back.
async fn restarted_later(db: &TestDb, down: &str, schedules: &[&str]) -> Result<SchedulerProcess> {
    let conn = db.connect().await?;
    conn.execute(
        "SELECT herald.set_test_clock(
             coalesce((SELECT skew FROM herald.test_clock), interval '0') + $1::text::interval)",
        &[&down],
    )
    .await?;
    let s = SchedulerProcess::spawn(db).await?;
    let restarted: i64 = conn
        .query_one(
            "SELECT extract(epoch FROM herald.now())::bigint AS now",
            &[],
        )
        .await?
        .get("now");
    for id in schedules {
        until("an on-time run after the restart", || async {
            Ok(runs(db, id).await?.keys().any(|t| *t > restarted + 1))
        })
        .await?;
    }
    Ok(s)
}

#[tokio::test]
async fn preview_follows_the_dst_policy() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let after = prost_types::Timestamp {
        seconds: 1_793_448_000, // 2026-10-31T12:00:00Z
        nanos: 0,
    };
    let twice = c
        .preview_fire_times(PreviewFireTimesRequest {
            cron: "30 1 * * *".into(),
            time_zone: "America/New_York".into(),
            repeated_time: RepeatedTimePolicy::FireTwice as i32,
            after: Some(after),
            count: 3,
            ..Default::default()
        })
        .await?
        .into_inner()
        .fire_times;
    let secs: Vec<i64> = twice.iter().map(|t| t.seconds).collect();
    // 01:30 EDT, 01:30 EST, then the next day's 01:30 EST.
    assert_eq!(secs, vec![1_793_511_000, 1_793_514_600, 1_793_601_000]);
    let bad = c
        .preview_fire_times(PreviewFireTimesRequest {
            cron: "61 * * * *".into(),
            ..Default::default()
        })
        .await
        .err()
        .map(|s| s.code());
    assert_eq!(bad, Some(tonic::Code::InvalidArgument));
    Ok(())
}

#[tokio::test]
async fn misfire_policies_after_the_scheduler_was_down_across_5_fire_times() -> Result<()> {
    let db = TestDb::new().await?;
    let mut s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    for (id, policy) in [
        ("skip", MisfirePolicy::Skip),
        ("once", MisfirePolicy::FireOnceNow),
        ("each", MisfirePolicy::CatchUp),
    ] {
        c.create_schedule(CreateScheduleRequest {
            schedule: Some(every(2, id, policy, &["ops@example.com"])),
        })
        .await?;
    }
    for id in ["skip", "once", "each"] {
        until("a first run", || async {
            Ok(!runs(&db, id).await?.is_empty())
        })
        .await?;
    }
    s.kill()?;
    s.wait().await?;
    let before: BTreeMap<&str, i64> = {
        let mut m = BTreeMap::new();
        for id in ["skip", "once", "each"] {
            m.insert(id, *runs(&db, id).await?.keys().last().unwrap_or(&0));
        }
        m
    };
    // The scenario itself: the scheduler stays down across at least 5 fire times that are
    // older than the 1 s misfire grace when it comes back (every 2 s, plus the grace, plus the
    // run created ahead of time before the kill). The test clock passes those 13 s at once.
    let s = restarted_later(&db, "13 s", &["skip", "once", "each"]).await?;
    // Stop it before reading: a fire time materialised between reading the runs and counting
    // the labelled tasks below would make the two disagree.
    let mut s = s;
    s.kill()?;
    s.wait().await?;
    let catch_ups = |r: &BTreeMap<i64, (String, i64)>, last: i64| -> Vec<i64> {
        r.iter()
            .filter(|(t, (k, _))| **t > last && k == "catch_up")
            .map(|(t, _)| *t)
            .collect()
    };
    let skip = runs(&db, "skip").await?;
    assert!(catch_ups(&skip, before["skip"]).is_empty(), "{skip:?}");
    let once = runs(&db, "once").await?;
    assert_eq!(catch_ups(&once, before["once"]).len(), 1, "{once:?}");
    let each = runs(&db, "each").await?;
    let missed = catch_ups(&each, before["each"]);
    assert!(missed.len() >= 5, "{each:?}");
    // Every fire time from the last one before the crash on is there exactly once: no gap.
    let all: Vec<i64> = each
        .keys()
        .copied()
        .filter(|t| *t >= before["each"])
        .collect();
    assert!(all.windows(2).all(|w| w[1] - w[0] == 2), "{all:?}");
    // Catch-up tasks say so, with their original fire time.
    let conn = db.connect().await?;
    let labelled: Vec<i64> = conn
        .query(
            "SELECT extract(epoch FROM fire_time)::bigint FROM herald.tasks
             WHERE schedule_id = 'each'
               AND labels->>'herald.catch_up' = 'true'
               AND (labels->>'herald.fire_time')::timestamptz = fire_time
             ORDER BY fire_time",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get::<_, i64>(0))
        // The run just before the crash is a catch-up too when a loaded machine started the
        // materialiser late; only the runs after it are this scenario's.
        .filter(|t| *t > before["each"])
        .collect();
    assert_eq!(labelled, missed, "before: {before:?}, runs: {each:?}");
    Ok(())
}

/// `expire_after` counts from the fire time: a missed run found after its tasks would have
/// expired sends nothing (recorded SKIPPED_EXPIRED), and a catch-up found sooner keeps only
/// what is left of its time. Before, catch-ups expired `expire_after` after being found, so a
/// reminder missed hours ago was still sent.
#[tokio::test]
async fn a_missed_run_found_after_its_expiry_is_skipped_and_a_catch_up_keeps_what_is_left(
) -> Result<()> {
    let db = TestDb::new().await?;
    let mut s = SchedulerProcess::spawn(&db).await?;
    let mut spec = every(2, "stale", MisfirePolicy::CatchUp, &["ops@example.com"]);
    spec.expire_after = Some(prost_types::Duration {
        seconds: 8,
        nanos: 0,
    });
    client(&s)
        .await?
        .create_schedule(CreateScheduleRequest {
            schedule: Some(spec),
        })
        .await?;
    until("a first run", || async {
        Ok(!runs(&db, "stale").await?.is_empty())
    })
    .await?;
    s.kill()?;
    s.wait().await?;
    let conn = db.connect().await?;
    conn.execute(
        "SELECT herald.set_test_clock(
             coalesce((SELECT skew FROM herald.test_clock), interval '0') + interval '13 s')",
        &[],
    )
    .await?;
    let restarted: i64 = conn
        .query_one("SELECT extract(epoch FROM herald.now())::bigint", &[])
        .await?
        .get(0);
    let s = SchedulerProcess::spawn(&db).await?;
    until("an on-time run after the restart", || async {
        Ok(runs(&db, "stale").await?.keys().any(|t| *t > restarted + 1))
    })
    .await?;
    let mut s = s;
    s.kill()?;
    s.wait().await?;
    let all = runs(&db, "stale").await?;
    let skipped: Vec<i64> = all
        .iter()
        .filter(|(_, (kind, _))| kind == "skipped_expired")
        .map(|(t, (_, tasks))| {
            assert_eq!(*tasks, 0, "a skipped run made tasks: {all:?}");
            *t
        })
        .collect();
    assert!(
        !skipped.is_empty(),
        "the runs missed by more than 8 s were not skipped: {all:?}"
    );
    // Each catch-up task expires 8 s after its fire time (never before it is due, plus a
    // second), not 8 s after the restart found it. The runs missed by less than 8 s (fire
    // times from 8 s to the 1 s grace before the restart) are such catch-ups.
    let (catch_ups, wrong): (i64, i64) = {
        let r = conn
            .query_one(
                "SELECT count(*) AS catch_ups,
                        count(*) FILTER (WHERE expire_at <> greatest(
                            fire_time + interval '8 s', run_at + interval '1 s')) AS wrong
                 FROM herald.task_records
                 WHERE schedule_id = 'stale' AND labels->>'herald.catch_up' = 'true'",
                &[],
            )
            .await?;
        (r.get("catch_ups"), r.get("wrong"))
    };
    assert!(catch_ups > 0, "no catch-up in time was made: {all:?}");
    assert_eq!(
        wrong, 0,
        "catch-up tasks expiring from when they were found"
    );
    Ok(())
}

#[tokio::test]
async fn sigkill_midway_then_restart_has_no_duplicate_and_no_gap() -> Result<()> {
    let db = TestDb::new().await?;
    let mut s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    c.create_schedule(CreateScheduleRequest {
        schedule: Some(every(1, "tick", MisfirePolicy::CatchUp, &["a", "b"])),
    })
    .await?;
    until("three runs", || async {
        Ok(runs(&db, "tick").await?.len() >= 3)
    })
    .await?;
    s.kill()?;
    s.wait().await?;
    let _s = SchedulerProcess::spawn(&db).await?;
    let restarted = chrono::Utc::now().timestamp();
    until("runs after the restart", || async {
        Ok(runs(&db, "tick").await?.keys().any(|t| *t >= restarted + 2))
    })
    .await?;
    let r = runs(&db, "tick").await?;
    let times: Vec<i64> = r.keys().copied().collect();
    assert!(times.windows(2).all(|w| w[1] - w[0] == 1), "gap: {times:?}");
    assert!(r.values().all(|(_, n)| *n == 2), "duplicates: {r:?}");
    Ok(())
}

#[tokio::test]
async fn three_replicas_fire_each_time_once() -> Result<()> {
    let db = TestDb::new().await?;
    let a = SchedulerProcess::spawn(&db).await?;
    let _b = SchedulerProcess::spawn(&db).await?;
    let _c = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&a).await?;
    c.create_schedule(CreateScheduleRequest {
        schedule: Some(every(1, "shared", MisfirePolicy::CatchUp, &["x", "y", "z"])),
    })
    .await?;
    until("five runs", || async {
        Ok(runs(&db, "shared").await?.len() >= 5)
    })
    .await?;
    // Pause and resume round trip while replicas race.
    c.pause_schedule(PauseScheduleRequest {
        id: "shared".into(),
    })
    .await?;
    c.resume_schedule(ResumeScheduleRequest {
        id: "shared".into(),
    })
    .await?;
    let r = runs(&db, "shared").await?;
    assert!(r.values().all(|(_, n)| *n == 3), "{r:?}");
    let conn = db.connect().await?;
    let dup: i64 = conn
        .query_one(
            "SELECT count(*) FROM (SELECT fire_time, recipient FROM herald.tasks
             WHERE schedule_id = 'shared' GROUP BY 1, 2 HAVING count(*) > 1) d",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(dup, 0);
    Ok(())
}

#[tokio::test]
async fn run_now_creates_a_manual_run_without_moving_the_next_fire_and_refuses_when_it_must(
) -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let spec = ScheduleSpec {
        id: "daily".into(),
        cron: "0 9 * * *".into(),
        time_zone: "Europe/Berlin".into(),
        overlap: OverlapPolicy::Skip as i32,
        queue: "reports".into(),
        recipients: vec!["ann".into(), "bob".into()],
        content: Some(Content {
            body: Some(content::Body::Text("daily report".into())),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = c
        .create_schedule(CreateScheduleRequest {
            schedule: Some(spec),
        })
        .await?
        .into_inner();
    let run = c
        .run_schedule_now(RunScheduleNowRequest { id: "daily".into() })
        .await?
        .into_inner();
    assert_eq!(run.kind, RunKind::Manual as i32);
    assert_eq!(run.task_count, 2);
    let tasks: i64 = db
        .connect()
        .await?
        .query_one(
            "SELECT count(*) FROM herald.tasks WHERE schedule_id = 'daily' AND state = 'scheduled'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(tasks, 2, "the manual run's tasks");
    let after = c
        .get_schedule(GetScheduleRequest { id: "daily".into() })
        .await?
        .into_inner();
    assert_eq!(
        after.next_fire_time, created.next_fire_time,
        "the next fire moved"
    );

    // Its tasks are still live and the overlap policy is SKIP: a second run is refused.
    let busy = c
        .run_schedule_now(RunScheduleNowRequest { id: "daily".into() })
        .await
        .err()
        .ok_or_else(|| anyhow::anyhow!("a run over a live one was accepted"))?;
    assert_eq!(busy.code(), tonic::Code::FailedPrecondition, "{busy:?}");
    // Paused, and unknown: refused too, and nothing more was created.
    c.pause_schedule(PauseScheduleRequest { id: "daily".into() })
        .await?;
    let paused = c
        .run_schedule_now(RunScheduleNowRequest { id: "daily".into() })
        .await
        .err()
        .ok_or_else(|| anyhow::anyhow!("a paused schedule ran"))?;
    assert_eq!(paused.code(), tonic::Code::FailedPrecondition, "{paused:?}");
    let missing = c
        .run_schedule_now(RunScheduleNowRequest { id: "nope".into() })
        .await
        .err()
        .ok_or_else(|| anyhow::anyhow!("an unknown schedule ran"))?;
    assert_eq!(missing.code(), tonic::Code::NotFound);
    assert_eq!(runs(&db, "daily").await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_page_of_large_schedules_is_cut_to_what_a_client_accepts() -> Result<()> {
    // 100 schedules of 60 KB of content: one page of all of them would be 6 MB, more than the
    // 4 MiB a gRPC client decodes by default.
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let body = "s".repeat(60_000);
    let mut created = Vec::new();
    for i in 0..100 {
        let id = format!("large-{i:03}");
        let mut spec = every(1, &id, MisfirePolicy::Skip, &["+15550100"]);
        spec.cron = "0 0 9 * * *".into();
        spec.content = Some(Content {
            body: Some(content::Body::Text(body.clone())),
            ..Default::default()
        });
        c.create_schedule(CreateScheduleRequest {
            schedule: Some(spec),
        })
        .await?;
        created.push(id);
    }
    let (seen, pages) = read_every_page(20, |token| {
        let mut c = c.clone();
        async move {
            let page = c
                .list_schedules(ListSchedulesRequest {
                    page_size: 100,
                    page_token: token,
                })
                .await?
                .into_inner();
            let ids = page
                .schedules
                .iter()
                .filter_map(|s| s.spec.as_ref().map(|spec| spec.id.clone()))
                .collect();
            Ok((ids, page.next_page_token))
        }
    })
    .await?;
    anyhow::ensure!(pages > 1, "the schedules did not fit one page");
    anyhow::ensure!(seen == created, "every schedule once, in id order");
    Ok(())
}

/// Bad input to ScheduleService is INVALID_ARGUMENT naming its field, and writes nothing: enum
/// values no policy has (they were stored as the defaults, another policy than asked), an
/// expiry at or before the fire time (every run then created nothing, with only a log line),
/// a missing or malformed id (it answered NOT_FOUND), a malformed `before` (ignored) and page
/// sizes out of range (clamped).
#[tokio::test]
async fn bad_schedule_input_names_its_field_and_changes_nothing() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    let base = || every(60, "report", MisfirePolicy::Skip, &["+15550001"]);
    let cases: Vec<(&str, ScheduleSpec)> = vec![
        (
            "schedule.skipped_time",
            ScheduleSpec {
                skipped_time: 9,
                ..base()
            },
        ),
        (
            "schedule.repeated_time",
            ScheduleSpec {
                repeated_time: 9,
                ..base()
            },
        ),
        (
            "schedule.overlap",
            ScheduleSpec {
                overlap: 9,
                ..base()
            },
        ),
        (
            "schedule.misfire",
            ScheduleSpec {
                misfire: 9,
                ..base()
            },
        ),
        (
            // A valid expression for a date that never comes.
            "schedule.cron",
            ScheduleSpec {
                cron: "0 0 30 2 *".into(),
                ..base()
            },
        ),
        (
            "schedule.expire_after",
            ScheduleSpec {
                expire_after: Some(prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                }),
                ..base()
            },
        ),
    ];
    for (field, spec) in cases {
        let status = c
            .create_schedule(CreateScheduleRequest {
                schedule: Some(spec),
            })
            .await
            .err()
            .with_context(|| format!("{field}: accepted"))?;
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{field}: {status:?}"
        );
        assert!(status.message().contains(field), "{field}: {status:?}");
    }
    let count: i64 = db
        .connect()
        .await?
        .query_one("SELECT count(*) FROM herald.schedules", &[])
        .await?
        .get(0);
    assert_eq!(count, 0, "a refused schedule was written");

    let preview = c
        .preview_fire_times(PreviewFireTimesRequest {
            cron: "0 9 * * *".into(),
            skipped_time: 9,
            ..Default::default()
        })
        .await
        .err()
        .context("an unknown skipped_time previewed")?;
    assert_eq!(preview.code(), tonic::Code::InvalidArgument, "{preview:?}");

    for id in ["", "Not A Name"] {
        let status = c
            .get_schedule(GetScheduleRequest { id: id.into() })
            .await
            .err()
            .context("got a schedule")?;
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{id:?}: {status:?}"
        );
        assert!(status.message().contains("id"), "{status:?}");
    }
    c.create_schedule(CreateScheduleRequest {
        schedule: Some(base()),
    })
    .await?;
    let bad_runs = [
        ListScheduleRunsRequest {
            id: "report".into(),
            before: Some(prost_types::Timestamp {
                seconds: i64::MAX,
                nanos: 0,
            }),
            ..Default::default()
        },
        ListScheduleRunsRequest {
            id: "report".into(),
            page_size: -1,
            ..Default::default()
        },
        ListScheduleRunsRequest {
            id: "report".into(),
            page_size: 100_000,
            ..Default::default()
        },
    ];
    for request in bad_runs {
        let status = c
            .list_schedule_runs(request.clone())
            .await
            .err()
            .with_context(|| format!("{request:?}: listed"))?;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
    Ok(())
}

/// A run whose recipients' tasks no longer check (the template changed to need a variable the
/// schedule does not supply) is not recorded as if it had sent: it counts the tasks it made
/// (none) and says why, in RunScheduleNow's answer and in ListScheduleRuns.
#[tokio::test]
async fn a_run_whose_tasks_no_longer_render_counts_none_and_says_why() -> Result<()> {
    use herald_proto::v1::{
        template, template_service_client::TemplateServiceClient, CreateTemplateRequest, Template,
        TemplateContent, TextTemplate, UpdateTemplateRequest,
    };
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let text = |body: &str| Template {
        id: "report".into(),
        kind: Some(template::Kind::Text(TextTemplate { body: body.into() })),
        ..Default::default()
    };
    let mut templates = TemplateServiceClient::connect(s.grpc_url()).await?;
    templates
        .create_template(CreateTemplateRequest {
            template: Some(text("{{ team }} report")),
        })
        .await?;
    let mut c = client(&s).await?;
    c.create_schedule(CreateScheduleRequest {
        schedule: Some(ScheduleSpec {
            id: "daily".into(),
            cron: "0 9 * * *".into(),
            time_zone: "Europe/Berlin".into(),
            queue: "reports".into(),
            recipients: vec!["ann".into(), "bob".into()],
            content: Some(Content {
                body: Some(content::Body::Template(TemplateContent {
                    template_id: "report".into(),
                    variables: [("team".to_string(), "Sales".to_string())].into(),
                    ..Default::default()
                })),
                ..Default::default()
            }),
            ..Default::default()
        }),
    })
    .await?;
    templates
        .update_template(UpdateTemplateRequest {
            template: Some(text("{{ team }} report for {{ region }}")),
        })
        .await?;
    let run = c
        .run_schedule_now(RunScheduleNowRequest { id: "daily".into() })
        .await?
        .into_inner();
    assert_eq!(run.task_count, 0, "{run:?}");
    assert!(
        run.error.contains("2 of 2") && run.error.contains("region"),
        "{run:?}"
    );
    let listed = c
        .list_schedule_runs(ListScheduleRunsRequest {
            id: "daily".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .runs;
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].task_count, &listed[0].error), (0, &run.error));
    assert_eq!(
        runs(&db, "daily").await?.into_values().collect::<Vec<_>>(),
        [("manual".to_string(), 0)]
    );
    Ok(())
}

/// ResumeSchedule computes the next fire time from the rules it reads under the schedule's
/// row lock: an edit of the cron committing while the resume waits must not leave a cursor
/// from the old rules (a run at a time the new expression does not name).
#[tokio::test]
async fn resume_takes_the_next_fire_from_rules_changed_while_it_waited() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    c.create_schedule(CreateScheduleRequest {
        schedule: Some(ScheduleSpec {
            id: "daily".into(),
            cron: "0 9 * * *".into(),
            time_zone: "UTC".into(),
            queue: "reports".into(),
            recipients: vec!["ann".into()],
            content: Some(Content {
                body: Some(content::Body::Text("daily report".into())),
                ..Default::default()
            }),
            ..Default::default()
        }),
    })
    .await?;
    c.pause_schedule(PauseScheduleRequest { id: "daily".into() })
        .await?;
    // An edit of the rules, not yet committed when the resume comes.
    let mut editor = db.connect().await?;
    let editor_pid: i32 = editor
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let edit = editor.transaction().await?;
    edit.execute(
        "UPDATE herald.schedules SET cron = '30 10 * * *' WHERE id = 'daily'",
        &[],
    )
    .await?;
    let resume = tokio::spawn({
        let mut c = c.clone();
        async move {
            c.resume_schedule(ResumeScheduleRequest { id: "daily".into() })
                .await
        }
    });
    let watcher = db.connect().await?;
    herald_tests::accounts::until_blocked_by(&watcher, editor_pid, "the resume to wait").await?;
    edit.commit().await?;
    let resumed = resume.await??.into_inner();
    let next = resumed
        .next_fire_time
        .context("a resumed schedule has a next fire time")?;
    let next = chrono::DateTime::from_timestamp(next.seconds, 0).context("a fire time")?;
    assert_eq!(
        next.format("%H:%M").to_string(),
        "10:30",
        "the cursor follows the old rules"
    );
    Ok(())
}

/// After a long outage (here 3 days of a schedule every 2 s: 129,600 fire times, as many as 90
/// days of one every minute), CATCH_UP fires the latest 100 missed fire times and FIRE_ONCE_NOW
/// one run for the latest, once, at a bounded cost. Before, each pass walked the next 100,000
/// missed fire times one by one, so CATCH_UP fired 100 per pass from days ago and
/// FIRE_ONCE_NOW once per pass.
#[tokio::test]
async fn a_catch_up_after_days_down_fires_the_latest_missed_runs_once() -> Result<()> {
    let db = TestDb::new().await?;
    let mut s = SchedulerProcess::spawn(&db).await?;
    let mut c = client(&s).await?;
    for (id, policy) in [
        ("once", MisfirePolicy::FireOnceNow),
        ("each", MisfirePolicy::CatchUp),
    ] {
        c.create_schedule(CreateScheduleRequest {
            schedule: Some(every(2, id, policy, &["ops@example.com"])),
        })
        .await?;
        until("a first run", || async {
            Ok(!runs(&db, id).await?.is_empty())
        })
        .await?;
    }
    s.kill()?;
    s.wait().await?;
    let before = runs(&db, "each")
        .await?
        .keys()
        .last()
        .copied()
        .unwrap_or(0)
        .max(runs(&db, "once").await?.keys().last().copied().unwrap_or(0));
    let mut s = restarted_later(&db, "3 days", &["once", "each"]).await?;
    s.kill()?;
    s.wait().await?;
    // The catch-ups, and the first run on time after them: the latest missed fire time is the
    // one just before it.
    let after_outage = |r: BTreeMap<i64, (String, i64)>| -> (Vec<i64>, Option<i64>) {
        let kind = |k: &str| -> Vec<i64> {
            r.iter()
                .filter(|(t, (kind, _))| **t > before && kind == k)
                .map(|(t, _)| *t)
                .collect()
        };
        (kind("catch_up"), kind("fired").first().copied())
    };
    let (each, on_time) = after_outage(runs(&db, "each").await?);
    assert_eq!(each.len(), 100, "{each:?}");
    assert!(each.windows(2).all(|w| w[1] - w[0] == 2), "{each:?}");
    assert_eq!(each.last().map(|t| t + 2), on_time, "not the latest missed");
    let (once, on_time) = after_outage(runs(&db, "once").await?);
    assert_eq!(once.len(), 1, "{once:?}");
    assert_eq!(
        once.first().map(|t| t + 2),
        on_time,
        "not the latest missed"
    );
    Ok(())
}
