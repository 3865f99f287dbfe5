//! Plain SQL on herald's schema: the baselines (what PostgreSQL allows on this machine for the
//! same state changes, with no herald in between) and the bulk loads of S4.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use futures::SinkExt;
use herald_proto::v1::{content, Content};
use prost::Message;
use tokio_postgres::Client;

/// The queue every benchmark task is on.
pub(crate) const QUEUE: &str = "bench";

/// The stored form of the benchmark's message: a prost-encoded `herald.v1.Content`, exactly as
/// the scheduler stores what CreateTask receives.
pub(crate) fn content_bytes() -> Vec<u8> {
    Content {
        body: Some(content::Body::Text("benchmark message".to_owned())),
        ..Default::default()
    }
    .encode_to_vec()
}

/// Columns the COPY baseline fills; everything else takes its default, as with CreateTask.
const COPY_COLUMNS: &str = "id, queue, recipient, content, priority, run_at, max_attempts, \
     backoff_initial_ms, backoff_max_ms, backoff_multiplier, backoff_jitter, route";

/// The claim's routing key of a task sent by queue alone in the default namespace.
pub(crate) const ROUTE: &str = "default/";

/// Inserts `n` tasks with one COPY (text format), due `due_in` from now (negative: overdue),
/// one microsecond apart as tasks created one by one would be (identical due times would make
/// one huge duplicate run in the due index, which no real workload has). Ids are UUIDv7 like
/// the scheduler's, so the primary key grows at its right edge as it does under CreateTask.
pub(crate) async fn copy_tasks(client: &Client, n: usize, due_in: Duration) -> Result<()> {
    let hex: String = content_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let now: chrono::DateTime<chrono::Utc> = client.query_one("SELECT now()", &[]).await?.get(0);
    let first = now + chrono::Duration::milliseconds(due_in.as_millis() as i64)
        - chrono::Duration::microseconds(n as i64);
    let sink = client
        .copy_in(&format!(
            "COPY herald.tasks ({COPY_COLUMNS}) FROM STDIN (FORMAT text)"
        ))
        .await
        .context("starting COPY")?;
    futures::pin_mut!(sink);
    let mut buf = String::with_capacity(256 * 1024);
    for i in 0..n {
        let id = uuid::Uuid::now_v7();
        let run_at =
            (first + chrono::Duration::microseconds(i as i64)).format("%Y-%m-%d %H:%M:%S%.6f+00");
        // bytea in text COPY: \\x + hex (the backslash itself escaped).
        buf.push_str(&format!(
            "{id}\t{QUEUE}\trecipient-{i}\t\\\\x{hex}\t5\t{run_at}\t10\t1000\t3600000\t2\t0.2\t{ROUTE}\n"
        ));
        if buf.len() >= 200 * 1024 {
            sink.send(Bytes::from(std::mem::take(&mut buf))).await?;
        }
    }
    if !buf.is_empty() {
        sink.send(Bytes::from(buf)).await?;
    }
    sink.finish().await.context("finishing COPY")?;
    Ok(())
}

/// The plain-SQL claim: the same predicate and index walk as herald's (one priority level, the
/// one the benchmark uses), `FOR UPDATE SKIP LOCKED`, the same columns changed and returned.
/// `= ANY(ARRAY(...))` pins the update to primary-key lookups: the natural `UPDATE ... FROM
/// (CTE)` form lets the planner pick a hash join over a sequential scan of the whole table
/// (measured: 21 ms per 512-row claim at 50k rows, growing with the table).
const BASELINE_CLAIM: &str = "
UPDATE herald.tasks t
SET state = 'leased', lease_count = t.lease_count + 1, executor_id = 'baseline',
    leased_at = now(), lease_expires_at = now() + interval '30 seconds', updated_at = now()
WHERE t.id = ANY(ARRAY(
    SELECT id FROM herald.tasks
    WHERE state = 'scheduled' AND route = 'default/' AND priority = 5 AND run_at <= now()
    ORDER BY run_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED))
RETURNING t.id, t.lease_count, t.queue, t.recipient, t.content, t.run_at, t.labels";

/// The plain-SQL completion: the state change and the attempt row. `= ANY($1)` again pins the
/// update to primary-key lookups (joining `unnest($1, $2)` for the fencing pair let the planner
/// hash-join a sequential scan of the table: 5k tasks/s at 50k rows). The fencing check stays
/// (lease_count must still be the claimed one), applied as a filter on the looked-up rows.
const BASELINE_COMPLETE: &str = "
WITH done AS (
    UPDATE herald.tasks t
    SET state = 'succeeded', attempts = t.attempts + 1, finished_at = now(),
        lease_expires_at = NULL, updated_at = now()
    WHERE t.id = ANY($1::uuid[]) AND t.state = 'leased'
      AND t.lease_count = ($2::integer[])[array_position($1::uuid[], t.id)]
    RETURNING t.id, t.lease_count, t.executor_id, t.leased_at
)
INSERT INTO herald.attempts (task_id, attempt, executor_id, outcome, leased_at, started_at)
SELECT id, lease_count, executor_id, 1, leased_at, now() FROM done";

/// Drains every due task with `workers` connections, each claiming `batch` and completing the
/// batch in one statement; returns tasks/s.
pub(crate) async fn baseline_drain(
    url: &str,
    workers: usize,
    batch: i64,
    expected: usize,
) -> Result<f64> {
    let mut clients = Vec::with_capacity(workers);
    for _ in 0..workers {
        clients.push(connect(url).await?);
    }
    let started = Instant::now();
    let mut handles = Vec::with_capacity(workers);
    for client in clients {
        handles.push(tokio::spawn(async move {
            let claim = client.prepare(BASELINE_CLAIM).await?;
            let complete = client.prepare(BASELINE_COMPLETE).await?;
            let mut done = 0usize;
            loop {
                let rows = client.query(&claim, &[&batch]).await?;
                if rows.is_empty() {
                    return anyhow::Ok(done);
                }
                let ids: Vec<uuid::Uuid> = rows.iter().map(|r| r.get(0)).collect();
                let attempts: Vec<i32> = rows.iter().map(|r| r.get(1)).collect();
                client.execute(&complete, &[&ids, &attempts]).await?;
                done += rows.len();
            }
        }));
    }
    let mut done = 0;
    for h in handles {
        done += h.await??;
    }
    let elapsed = started.elapsed();
    anyhow::ensure!(
        done == expected,
        "baseline drained {done} of {expected} tasks"
    );
    Ok(done as f64 / elapsed.as_secs_f64())
}

/// Inserts `n` tasks with `clients` concurrent COPYs; returns rows/s.
pub(crate) async fn baseline_copy(url: &str, clients: usize, n: usize) -> Result<f64> {
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(connect(url).await?);
    }
    let share = n / clients;
    let started = Instant::now();
    let mut handles = Vec::with_capacity(clients);
    for client in conns {
        handles.push(tokio::spawn(async move {
            copy_tasks(&client, share, Duration::from_secs(3600)).await
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok((share * clients) as f64 / started.elapsed().as_secs_f64())
}

/// Tops the table up to `total` future tasks (due a day or more from now) with one
/// INSERT ... SELECT generate_series: far faster than any API for millions of rows. Ids are
/// time-ordered like UUIDv7 (a millisecond prefix, then a counter) so the primary key is
/// appended to as in production.
pub(crate) async fn fill_future(client: &Client, from: u64, total: u64) -> Result<()> {
    if total <= from {
        return Ok(());
    }
    let content = content_bytes();
    client
        .execute(
            "INSERT INTO herald.tasks (id, queue, recipient, content, priority, run_at,
                 max_attempts, backoff_initial_ms, backoff_max_ms, backoff_multiplier,
                 backoff_jitter, route)
             SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
                     || lpad(to_hex(i), 20, '0'))::uuid,
                    $3, 'recipient-' || i, $4, (i % 10)::smallint,
                    now() + interval '1 day' + (i % 604800) * interval '1 second',
                    10, 1000, 3600000, 2, 0.2, $5
             FROM generate_series($1::bigint, $2::bigint - 1) AS i",
            &[&(from as i64), &(total as i64), &QUEUE, &content, &ROUTE],
        )
        .await
        .context("filling the table with future tasks")?;
    Ok(())
}

/// Connects with tokio-postgres and drives the connection in the background.
pub(crate) async fn connect(url: &str) -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Percentiles of a sample, in its own unit: (p50, p99, max).
pub(crate) fn percentiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    (at(0.5), at(0.99), v[v.len() - 1])
}
