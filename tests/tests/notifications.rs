//! The operator notification webhook on the real binaries: a permanent send failure, a passed
//! deadline and an account going offline each produce exactly one notification, signed like
//! the webhook sender (Standard Webhooks), with the event's data.

use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use herald_proto::v1::TaskState;
use herald_tests::{
    connect_tasks, create_task, task_spec, unique_id, wait_for_task_state, ExecutorProcess,
    RecordedRequest, Response, SchedulerProcess, TaskSpecExt, TestDb, WebhookReceiver,
};
use hmac::{Hmac, Mac};
use sha2::Sha256;

const WAIT: Duration = Duration::from_secs(30);
const KEY: &[u8] = b"the operator's notification key!";

fn secret() -> String {
    format!("whsec_{}", BASE64.encode(KEY))
}

/// Checks the Standard Webhooks signature and returns the parsed body.
fn verified(request: &RecordedRequest) -> Result<serde_json::Value> {
    let id = request.header("webhook-id").context("no webhook-id")?;
    let ts = request
        .header("webhook-timestamp")
        .context("no webhook-timestamp")?;
    let signature = request
        .header("webhook-signature")
        .context("no webhook-signature")?;
    let mut mac = Hmac::<Sha256>::new_from_slice(KEY)?;
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&request.body);
    let expected = format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()));
    anyhow::ensure!(
        signature == expected,
        "bad signature {signature}, expected {expected}"
    );
    Ok(serde_json::from_slice(&request.body)?)
}

#[tokio::test]
async fn failures_expiries_and_offline_accounts_notify_once_each_signed() -> Result<()> {
    let notify = WebhookReceiver::start().await?;
    // The first try is refused: the notification is retried, not lost.
    notify.respond_with(vec![Response::status(503)]);
    let provider = WebhookReceiver::start().await?;
    provider.set_default(Response::status(422));
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_NOTIFY_URL", format!("{}/notify", notify.url()))
        .env("HERALD_NOTIFY_SECRET", secret())
        .spawn()
        .await?;
    let _executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml(format!(
            "[queues.hooks]\nsender = \"webhook\"\nurl = \"{}/hook\"\nsecret = \"provider-secret\"\n",
            provider.url()
        ))
        .spawn()
        .await?;
    let mut client = connect_tasks(&scheduler.grpc_url()).await?;

    // 1. A permanent failure (the provider answers 422).
    let failing = create_task(&mut client, task_spec("hooks", &unique_id("r"), "x")).await?;
    wait_for_task_state(&mut client, &failing.id, TaskState::Failed, WAIT).await?;

    // 2. A deadline that passes while no executor serves the task's queue.
    let expiring = create_task(
        &mut client,
        task_spec("unserved", &unique_id("r"), "x")
            .with_expire_at(SystemTime::now() + Duration::from_millis(1500)),
    )
    .await?;
    wait_for_task_state(&mut client, &expiring.id, TaskState::Expired, WAIT).await?;

    // 3. An account going offline (the state change the report path makes, done directly).
    let conn = db.connect().await?;
    conn.batch_execute(
        "INSERT INTO herald.pools (namespace, name) VALUES ('default', 'wa');
         INSERT INTO herald.accounts (namespace, id, sender_kind, pool, credentials_ref,
                                      rate_per_sec, burst, effective_rate, tokens)
         VALUES ('default', 'wa-1', 'whatsapp_cloud', 'wa', 'wa-1', 1, 1, 1, 1);
         UPDATE herald.accounts SET state = 'offline', state_reason = 'account locked',
                offline_until = now() + interval '5 minutes' WHERE id = 'wa-1';
         -- Already offline: no second notification.
         UPDATE herald.accounts SET state = 'offline' WHERE id = 'wa-1';",
    )
    .await?;

    // The refused first try plus three deliveries.
    let requests = notify.wait_for_requests(4, WAIT).await?;
    let mut delivered: Vec<serde_json::Value> = Vec::new();
    for r in &requests[1..] {
        delivered.push(verified(r)?);
    }
    // The retry carried the same webhook-id as the refused try.
    let ids: Vec<&str> = requests
        .iter()
        .filter_map(|r| r.header("webhook-id"))
        .collect();
    assert!(ids[1..].contains(&ids[0]), "retry kept its id: {ids:?}");

    let find = |kind: &str| {
        delivered
            .iter()
            .filter(|v| v["type"] == kind)
            .cloned()
            .collect::<Vec<_>>()
    };
    let failed = find("task.failed");
    assert_eq!(failed.len(), 1, "{delivered:?}");
    assert_eq!(failed[0]["data"]["task_id"], failing.id.as_str());
    assert_eq!(failed[0]["data"]["state"], "FAILED");
    let expired = find("task.expired");
    assert_eq!(expired.len(), 1, "{delivered:?}");
    assert_eq!(expired[0]["data"]["task_id"], expiring.id.as_str());
    let offline = find("account.offline");
    assert_eq!(offline.len(), 1, "{delivered:?}");
    assert_eq!(offline[0]["data"]["account_id"], "wa-1");
    assert_eq!(offline[0]["data"]["reason"], "account locked");

    Ok(())
}

#[tokio::test]
async fn a_campaign_whose_tasks_all_ended_notifies_finished_once() -> Result<()> {
    use herald_proto::v1::{
        campaign_service_client::CampaignServiceClient, CampaignRecipient, CampaignSpec, Content,
        CreateCampaignRequest,
    };
    let notify = WebhookReceiver::start().await?;
    let provider = WebhookReceiver::start().await?;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_NOTIFY_URL", format!("{}/notify", notify.url()))
        .env("HERALD_NOTIFY_SECRET", secret())
        .spawn()
        .await?;
    let _executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml(format!(
            "[queues.hooks]\nsender = \"webhook\"\nurl = \"{}/hook\"\nsecret = \"provider-secret\"\n",
            provider.url()
        ))
        .spawn()
        .await?;
    let mut campaigns = CampaignServiceClient::new(
        tonic::transport::Channel::from_shared(scheduler.grpc_url())?
            .connect()
            .await?,
    );
    let created = campaigns
        .create_campaign(CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                name: "launch".into(),
                queue: "hooks".into(),
                content: Some(Content {
                    body: Some(herald_proto::v1::content::Body::Text("we're live".into())),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            recipients: (0..3)
                .map(|i| CampaignRecipient {
                    recipient: format!("+1555000{i}"),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .await?
        .into_inner();
    provider.wait_for_requests(3, WAIT).await?;
    // A campaign that took recipients in the last minute is not declared finished (more chunks
    // may come); move its last change a minute back instead of waiting for it.
    let conn = db.connect().await?;
    let uuid: uuid::Uuid = created.id.parse()?;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let live: i64 = conn
            .query_one(
                "SELECT count(*) FROM herald.tasks
                 WHERE campaign_id = $1 AND state IN ('scheduled', 'leased')",
                &[&uuid],
            )
            .await?
            .get(0);
        if live == 0 {
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "tasks still live");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    conn.execute(
        "UPDATE herald.campaigns SET updated_at = now() - interval '2 minutes' WHERE id = $1",
        &[&uuid],
    )
    .await?;
    let requests = notify.wait_for_requests(1, WAIT).await?;
    let finished: Vec<serde_json::Value> = requests
        .iter()
        .map(verified)
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .filter(|b| b["type"] == "campaign.finished")
        .collect();
    assert_eq!(finished.len(), 1, "{requests:?}");
    assert_eq!(finished[0]["data"]["campaign_id"], created.id.as_str());
    assert_eq!(finished[0]["data"]["states"]["succeeded"], 3);
    let state: String = conn
        .query_one(
            "SELECT state::text FROM herald.campaigns WHERE id = $1",
            &[&uuid],
        )
        .await?
        .get(0);
    assert_eq!(state, "finished");
    Ok(())
}
