//! `herald.grant_claim`, the routed claim's grant step (#18): reservation, recipient marks and
//! slots given back in one call. Driven here directly on a migrated database, so each rule is
//! seen without routing in front of it: assignments take their account's slots in order, one
//! that would open a conversation past the tier's room gives its slot back, a recipient sent to
//! within the interval is refused with its slot given back, sends by queue pass as they are, and
//! an account with gaps grants each send its own instant. A reservation that waits for another
//! claim's lock grants only the room that claim left; feedback says when it frees room on a full
//! account. And claims, report batches and webhook batches working on the same accounts at once
//! lock them in one order, so they never deadlock; the locking functions keep that order
//! whatever order their callers pass.

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use herald_proto::v1::{
    executor_message, provider_event, scheduler_message, AccountStandingEvent, DeliveryState,
    DeliveryStatusEvent, InboundMessageEvent, OutcomeClass, ProviderEvent, RateLimitScope,
    RecordProviderEventsRequest, ReportBatch,
};
use herald_tests::accounts::{backend_pid, create_many, hold_account, pooled, until_blocked_by};
use herald_tests::lease::{result, ScriptedExecutor};
use herald_tests::{connect_lease, connect_tasks, SchedulerProcess, TestDb};
use tokio_postgres::Client;
use uuid::Uuid;

/// A migrated database (the scheduler applies the migrations) with pool `p` and `accounts`,
/// each given room for `room` sends at once and then adjusted by `extra` SQL.
async fn database(accounts: &[&str], room: i32, extra: &str) -> Result<(TestDb, Client)> {
    database_on(TestDb::new().await?, accounts, room, extra).await
}

/// [`database`] on `db`.
async fn database_on(
    db: TestDb,
    accounts: &[&str],
    room: i32,
    extra: &str,
) -> Result<(TestDb, Client)> {
    // Started and stopped: only its migrations are wanted.
    drop(SchedulerProcess::spawn(&db).await?);
    let conn = db.connect().await?;
    conn.execute(
        "INSERT INTO herald.pools (namespace, name) VALUES ('default', 'p')",
        &[],
    )
    .await?;
    for id in accounts {
        conn.execute(
            "INSERT INTO herald.accounts (namespace, id, sender_kind, pool, credentials_ref,
                                          rate_per_sec, burst, effective_rate, tokens,
                                          max_in_flight, high_priority_reserve)
             VALUES ('default', $1, 'webhook', 'p', $1, 1000, 1000, 1000, 1000, $2, 0)",
            &[id, &room],
        )
        .await?;
    }
    conn.batch_execute(extra).await?;
    Ok((db, conn))
}

/// One assignment as routing makes it.
struct Assign<'a> {
    account: Option<&'a str>,
    high: bool,
    opens: bool,
    recipient: &'a str,
}

fn to<'a>(account: &'a str, recipient: &'a str) -> Assign<'a> {
    Assign {
        account: Some(account),
        high: false,
        opens: false,
        recipient,
    }
}

/// Calls grant_claim with fresh task ids; returns the ids and, per id granted, its account and
/// instant, in the order returned.
async fn grant(
    conn: &Client,
    assigned: &[Assign<'_>],
    tracked: &[&str],
) -> Result<(
    Vec<Uuid>,
    Vec<(Uuid, Option<String>, Option<DateTime<Utc>>)>,
)> {
    let ids: Vec<Uuid> = assigned.iter().map(|_| Uuid::new_v4()).collect();
    let accounts: Vec<Option<&str>> = assigned.iter().map(|a| a.account).collect();
    let high: Vec<bool> = assigned.iter().map(|a| a.high).collect();
    let opens: Vec<bool> = assigned.iter().map(|a| a.opens).collect();
    let recipients: Vec<&str> = assigned.iter().map(|a| a.recipient).collect();
    let rows = conn
        .query(
            "SELECT out_id, out_account, out_at FROM herald.grant_claim(
                 'default', $1, $2, $3, $4, $5, $6)",
            &[&ids, &accounts, &high, &opens, &recipients, &tracked],
        )
        .await
        .context("grant_claim")?;
    let granted = rows
        .iter()
        .map(|r| (r.get("out_id"), r.get("out_account"), r.get("out_at")))
        .collect();
    Ok((ids, granted))
}

/// Locks account `id`'s row in the open transaction of `tx` without waiting: fails at once if
/// another transaction holds it.
async fn take_at_once(tx: &impl tokio_postgres::GenericClient, id: &str) -> Result<()> {
    tx.execute(
        "SELECT 1 FROM herald.accounts WHERE namespace = 'default' AND id = $1
         FOR UPDATE NOWAIT",
        &[&id],
    )
    .await?;
    Ok(())
}

/// (in_flight, day_count) of an account.
async fn counts(conn: &Client, account: &str) -> Result<(i32, i32)> {
    let row = conn
        .query_one(
            "SELECT herald.account_in_flight(a) AS in_flight, day_count
             FROM herald.accounts a WHERE id = $1",
            &[&account],
        )
        .await?;
    Ok((row.get("in_flight"), row.get("day_count")))
}

#[tokio::test]
async fn assignments_take_their_accounts_room_in_order_and_a_conversation_past_the_tier_gives_its_slot_back(
) -> Result<()> {
    // "a" has room for two sends; "b" for many, but its tier allows one new conversation.
    let (_db, conn) = database(
        &["a", "b"],
        2,
        "UPDATE herald.accounts SET max_in_flight = 10, tier_limit = 1, tier_used = 0,
                tier_counted_at = now() WHERE id = 'b'",
    )
    .await?;
    let opening = |recipient| Assign {
        opens: true,
        ..to("b", recipient)
    };
    let by_queue = Assign {
        account: None,
        high: false,
        opens: false,
        recipient: "q",
    };
    let (ids, granted) = grant(
        &conn,
        &[
            to("a", "r1"),
            to("a", "r2"),
            to("a", "r3"),
            by_queue,
            opening("r5"),
            opening("r6"),
        ],
        &[],
    )
    .await?;
    let granted_ids: Vec<Uuid> = granted.iter().map(|g| g.0).collect();
    assert_eq!(
        granted_ids,
        vec![ids[0], ids[1], ids[3], ids[4]],
        "the first two of a, the send by queue and b's first conversation, in order"
    );
    let by_queue = granted.iter().find(|g| g.0 == ids[3]).context("by queue")?;
    assert_eq!((by_queue.1.as_deref(), by_queue.2), (None, None));
    assert!(granted
        .iter()
        .filter(|g| g.0 != ids[3])
        .all(|g| g.2.is_some()));
    assert_eq!(counts(&conn, "a").await?, (2, 2), "a's third had no slot");
    assert_eq!(
        counts(&conn, "b").await?,
        (1, 1),
        "b reserved two; the one past the tier gave its slot and its day back"
    );
    Ok(())
}

/// An account with gaps plans its sends up to a second ahead from the room it read now; none
/// of them falls in its quiet hours or on its next local day (where it would go in quiet hours,
/// or count against today's cap while going tomorrow's).
#[tokio::test]
async fn paced_sends_stop_at_quiet_hours_and_at_local_midnight() -> Result<()> {
    let (_db, conn) = database(
        &["paced"],
        100,
        "UPDATE herald.accounts SET gap_min_ms = 50, gap_max_ms = 50,
                time_zone = 'Asia/Shanghai', quiet_start = '22:00', quiet_end = '08:00',
                tokens_at = '2026-01-01'",
    )
    .await?;
    let plan = "SELECT cardinality(out_times) AS n,
                       (SELECT max(t) FROM unnest(out_times) t) AS last
                FROM herald.reserve_capacity('default', ARRAY['paced'], ARRAY[0], ARRAY[20],
                                             ARRAY[0], $1::text::timestamptz)";
    // Half a second before quiet hours begin at 22:00 in Shanghai.
    let row = conn.query_one(plan, &[&"2026-12-07 21:59:59.5+08"]).await?;
    let last: DateTime<Utc> = row.get("last");
    let quiet: DateTime<Utc> = "2026-12-07T14:00:00Z".parse()?;
    assert!(last < quiet, "a send planned in quiet hours: {last}");
    assert!(
        row.get::<_, i32>("n") >= 2,
        "nothing paced before quiet hours"
    );
    // Without quiet hours, half a second before local midnight.
    conn.execute(
        "UPDATE herald.accounts SET quiet_start = NULL, quiet_end = NULL, next_send_at = NULL",
        &[],
    )
    .await?;
    let row = conn.query_one(plan, &[&"2026-12-08 23:59:59.5+08"]).await?;
    let last: DateTime<Utc> = row.get("last");
    let midnight: DateTime<Utc> = "2026-12-08T16:00:00Z".parse()?;
    assert!(last < midnight, "a send planned on the next day: {last}");
    Ok(())
}

/// Two sends to one new recipient in a claim: routing marks only the first as opening the
/// conversation. When the tier has no room for it, the second is refused too (its slot given
/// back): kept, it would open the conversation past the tier, and uncounted.
#[tokio::test]
async fn a_second_send_to_a_recipient_whose_conversation_found_no_tier_room_is_refused_too(
) -> Result<()> {
    let (_db, conn) = database(
        &["b"],
        10,
        "UPDATE herald.accounts SET tier_limit = 1, tier_used = 1, tier_counted_at = now()
         WHERE id = 'b'",
    )
    .await?;
    let (_ids, granted) = grant(
        &conn,
        &[
            Assign {
                opens: true,
                ..to("b", "new")
            },
            to("b", "new"),
        ],
        &[],
    )
    .await?;
    assert!(granted.is_empty(), "granted past the tier: {granted:?}");
    assert_eq!(counts(&conn, "b").await?, (0, 0), "both slots given back");
    Ok(())
}

/// An account granted everything it was asked keeps every assignment without the slotting's
/// window passes (the usual case); beside one short of room, in the same claim, both keep
/// routing's order, and the whole account's marks carry its reservation instant.
#[tokio::test]
async fn an_account_granted_whole_beside_one_short_of_room_keeps_the_claims_order() -> Result<()> {
    let (_db, conn) = database(
        &["short", "whole"],
        2,
        "UPDATE herald.accounts SET max_in_flight = 10 WHERE id = 'whole'",
    )
    .await?;
    let (ids, granted) = grant(
        &conn,
        &[
            to("whole", "w1"),
            to("short", "s1"),
            to("whole", "w2"),
            to("short", "s2"),
            to("short", "s3"),
            to("whole", "w3"),
        ],
        &["short", "whole"],
    )
    .await?;
    let granted_ids: Vec<Uuid> = granted.iter().map(|g| g.0).collect();
    assert_eq!(
        granted_ids,
        vec![ids[0], ids[1], ids[2], ids[3], ids[5]],
        "every send of the whole account and the first two of the short one, in order"
    );
    assert_eq!(counts(&conn, "whole").await?, (3, 3));
    assert_eq!(counts(&conn, "short").await?, (2, 2), "s3 had no slot");
    let whole_at: Vec<Option<DateTime<Utc>>> = granted
        .iter()
        .filter(|g| g.1.as_deref() == Some("whole"))
        .map(|g| g.2)
        .collect();
    assert!(
        whole_at.iter().all(|at| at.is_some() && *at == whole_at[0]),
        "one reservation instant for the whole account: {whole_at:?}"
    );
    let marks: Vec<(String, DateTime<Utc>)> = conn
        .query(
            "SELECT recipient, last_sent_at FROM herald.recipient_sends
             WHERE account_id = 'whole' ORDER BY recipient",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get("recipient"), r.get("last_sent_at")))
        .collect();
    let expected: Vec<(String, DateTime<Utc>)> = ["w1", "w2", "w3"]
        .iter()
        .map(|r| (r.to_string(), whole_at[0].unwrap_or_default()))
        .collect();
    assert_eq!(
        marks, expected,
        "each whole send marked at the reservation instant"
    );
    let short_marks: i64 = conn
        .query_one(
            "SELECT count(*) AS n FROM herald.recipient_sends
             WHERE account_id = 'short' AND recipient IN ('s1', 's2', 's3')",
            &[],
        )
        .await?
        .get("n");
    assert_eq!(
        short_marks, 2,
        "s1 and s2 marked; s3, refused for room, not"
    );
    Ok(())
}

#[tokio::test]
async fn a_recipient_sent_to_within_the_interval_is_refused_and_its_slot_given_back() -> Result<()>
{
    // A concurrent claim marked r1 a moment ago; the interval is 6 s.
    let (_db, conn) = database(
        &["c"],
        10,
        "UPDATE herald.accounts SET recipient_interval_ms = 6000;
         INSERT INTO herald.recipient_sends (namespace, account_id, recipient, last_sent_at)
         VALUES ('default', 'c', 'r1', now())",
    )
    .await?;
    let (ids, granted) = grant(&conn, &[to("c", "r1"), to("c", "r2")], &["c"]).await?;
    let granted_ids: Vec<Uuid> = granted.iter().map(|g| g.0).collect();
    assert_eq!(granted_ids, vec![ids[1]]);
    assert_eq!(counts(&conn, "c").await?, (1, 1), "r1's slot given back");
    let marked: DateTime<Utc> = conn
        .query_one(
            "SELECT last_sent_at FROM herald.recipient_sends WHERE recipient = 'r2'",
            &[],
        )
        .await?
        .get("last_sent_at");
    assert_eq!(Some(marked), granted[0].2, "marked at its grant instant");

    // An account that does not record sends per recipient is not refused.
    let (ids, granted) = grant(&conn, &[to("c", "r1")], &[]).await?;
    assert_eq!(granted.len(), 1);
    assert_eq!(granted[0].0, ids[0]);
    Ok(())
}

#[tokio::test]
async fn an_account_with_gaps_grants_each_send_its_own_later_instant() -> Result<()> {
    let (_db, conn) = database(
        &["d"],
        10,
        "UPDATE herald.accounts SET gap_min_ms = 100, gap_max_ms = 200",
    )
    .await?;
    let (_, granted) = grant(&conn, &[to("d", "r1"), to("d", "r2"), to("d", "r3")], &[]).await?;
    let instants: Vec<DateTime<Utc>> = granted.iter().filter_map(|g| g.2).collect();
    assert_eq!(instants.len(), 3, "{granted:?}");
    for pair in instants.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= chrono::Duration::milliseconds(100)
                && gap <= chrono::Duration::milliseconds(200),
            "a drawn gap between consecutive sends: {gap}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn concurrent_reservations_and_feedback_on_the_same_accounts_never_deadlock() -> Result<()> {
    // Claims reserve on accounts and give unused slots back; report batches record outcomes for
    // the same accounts, and folds apply what they left waiting. Each locks the rows in the
    // order it is given (sorted by its caller).
    // Two claim sessions and two report sessions run at once on eight shared accounts; a
    // function locking in another order deadlocks here within a few rounds.
    let ids: Vec<String> = (0..8).map(|i| format!("acct-{i}")).collect();
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    let (db, _conn) = database(&names, 1_000_000, "").await?;
    let mut sessions = tokio::task::JoinSet::new();
    for session in 0..4 {
        let mut conn = db.connect().await?;
        let ids = ids.clone();
        let claims = session % 2 == 0;
        sessions.spawn(async move {
            let ones = vec![1_i32; ids.len()];
            let zeros = vec![0_i32; ids.len()];
            let no_wait = vec![0_i64; ids.len()];
            let no_reason: Vec<Option<&str>> = vec![None; ids.len()];
            for _ in 0..40 {
                let tx = conn.transaction().await?;
                if claims {
                    tx.query(
                        "SELECT * FROM herald.reserve_capacity('default', $1, $2, $3, $2)",
                        &[&ids, &zeros, &ones],
                    )
                    .await
                    .context("reserve")?;
                }
                // A claim gives its slots back; a report batch records successes.
                let (released, ok) = if claims {
                    (&ones, &zeros)
                } else {
                    (&zeros, &ones)
                };
                tx.query(
                    "SELECT herald.account_feedback('default', $1, $2, $2, $3, $4, $5, $4, $4, $6)",
                    &[&ids, released, ok, &zeros, &no_wait, &no_reason],
                )
                .await
                .context("feedback")?;
                if !claims {
                    tx.query("SELECT herald.fold_account_deltas('default', $1)", &[&ids])
                        .await
                        .context("fold")?;
                }
                tx.commit().await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(session) = sessions.join_next().await {
        session??;
    }
    let conn = db.connect().await?;
    let in_flight: i64 = conn
        .query_one(
            "SELECT sum(herald.account_in_flight(a))::bigint AS in_flight FROM herald.accounts a",
            &[],
        )
        .await?
        .get("in_flight");
    assert_eq!(in_flight, 0, "every slot reserved was given back");
    Ok(())
}

/// Report batches lock account rows in the order Rust sorts their ids, byte by byte; a
/// claim's grant takes them in that order too, whatever the database's collation. Under ICU
/// en-US `acct-a` sorts before `Acct-b`, byte by byte after it. While a report batch holds
/// `Acct-b`, the first of the two in its order, a grant on both accounts waits for it holding
/// neither, so the batch can take `acct-a` next. Fails if the grant sorts by the database's
/// collation: it then holds `acct-a` while it waits, and the batch's next lock would deadlock
/// with it (taken here with NOWAIT, it fails at once).
#[tokio::test]
async fn a_grant_takes_account_rows_byte_by_byte_as_report_batches_do_under_a_linguistic_collation(
) -> Result<()> {
    let db = TestDb::with_icu_collation("en-US").await?;
    let (db, conn) = database_on(db, &["acct-a", "Acct-b"], 10, "").await?;
    let linguistic: bool = conn
        .query_one("SELECT 'acct-a' < 'Acct-b' AS before", &[])
        .await?
        .get("before");
    assert!(linguistic, "the database should sort linguistically");

    let mut batch = db.connect().await?;
    let (batch, batch_pid) = hold_account(&mut batch, "Acct-b").await?;
    let granting = db.connect().await?;
    let granted = tokio::spawn(async move {
        let (_, granted) = grant(&granting, &[to("acct-a", "+r"), to("Acct-b", "+s")], &[]).await?;
        anyhow::Ok(granted.len())
    });
    until_blocked_by(&conn, batch_pid, "the grant to wait for the report batch").await?;
    take_at_once(&batch, "acct-a")
        .await
        .context("the waiting grant holds acct-a")?;
    batch.commit().await?;
    assert_eq!(
        granted.await??,
        2,
        "both assignments granted once the batch ended"
    );
    Ok(())
}

/// The functions that lock several account rows take them byte by byte whatever order their
/// caller passes the ids in, so no caller can get the order wrong. While another transaction
/// holds `a1`, the first of the two in that order, a call given `[a2, a1]` waits for it holding
/// neither, so the other transaction can take `a2` next. Fails if the function locks in the
/// order it is given: it then holds `a2` while it waits, and that next lock would deadlock with
/// it (taken here with NOWAIT, it fails at once).
#[tokio::test]
async fn account_locks_are_taken_byte_by_byte_whatever_order_the_caller_passes() -> Result<()> {
    let calls = [
        "SELECT herald.lock_accounts('default', ARRAY['a2', 'a1'])",
        "SELECT herald.apply_account_feedback('default', ARRAY['a2', 'a1'], ARRAY[0, 0],
             ARRAY[0, 0], ARRAY[0, 0], ARRAY[0, 0], ARRAY[0, 0]::bigint[], ARRAY[0, 0],
             ARRAY[0, 0], ARRAY[NULL, NULL]::text[])",
        "SELECT herald.fold_account_deltas('default', ARRAY['a2', 'a1'])",
    ];
    let (db, conn) = database(&["a1", "a2"], 10, "").await?;
    for call in calls {
        let mut holder = db.connect().await?;
        let (holder, holder_pid) = hold_account(&mut holder, "a1").await?;
        let caller = db.connect().await?;
        let called = tokio::spawn(async move { caller.batch_execute(call).await });
        until_blocked_by(&conn, holder_pid, call).await?;
        take_at_once(&holder, "a2")
            .await
            .with_context(|| format!("the waiting call holds a2: {call}"))?;
        holder.commit().await?;
        called.await?.with_context(|| call.to_owned())?;
    }
    Ok(())
}

/// Frees one slot of `account` through `herald.account_feedback`, as a report batch with one
/// success-free release does; returns whether it said room came back.
async fn release_one(conn: &Client, account: &str) -> Result<bool> {
    let row = conn
        .query_one(
            "SELECT herald.account_feedback('default', ARRAY[$1], ARRAY[1], ARRAY[0], ARRAY[0],
                                            ARRAY[0], ARRAY[0::bigint], ARRAY[0], ARRAY[0],
                                            ARRAY[NULL::text]) AS freed",
            &[&account],
        )
        .await
        .context("feedback")?;
    Ok(row.get("freed"))
}

/// A report batch that frees a slot on an account at its in-flight limit says so (dispatchers
/// waiting for that account look again); one that frees a slot where room was left does not.
/// Fails if the check misses the full account or counts one that had room.
#[tokio::test]
async fn feedback_says_when_it_frees_room_on_an_account_that_had_none() -> Result<()> {
    let (_db, conn) = database(
        &["full", "roomy"],
        2,
        "UPDATE herald.accounts SET in_flight = 2 WHERE id = 'full';
         UPDATE herald.accounts SET in_flight = 1 WHERE id = 'roomy';",
    )
    .await?;
    assert!(!release_one(&conn, "roomy").await?, "roomy had room left");
    assert!(release_one(&conn, "full").await?, "full was at its limit");
    assert!(
        !release_one(&conn, "full").await?,
        "full had room again after the first release"
    );
    Ok(())
}

/// A reservation that has to wait for another claim's lock on an account grants only the room
/// that claim left: it reads the row once the lock is its own, not as it stood when its call
/// began. Fails if the reservation reads the row before locking it (it would grant all 5).
#[tokio::test]
async fn a_reservation_waiting_for_another_claims_lock_grants_only_the_room_left() -> Result<()> {
    let (db, conn) = database(&["acct"], 5, "").await?;
    const RESERVE: &str = "SELECT out_low FROM herald.reserve_capacity(
                               'default', ARRAY['acct'], ARRAY[0], $1::integer[], ARRAY[0])";
    let mut first = db.connect().await?;
    let first = first.transaction().await?;
    let granted: i32 = first.query_one(RESERVE, &[&vec![3_i32]]).await?.get(0);
    assert_eq!(granted, 3);
    let first_pid = backend_pid(&first).await?;

    // A second claim asks for the whole room while the first holds the account row.
    let second = db.connect().await?;
    let waiting = tokio::spawn(async move {
        let row = second.query_one(RESERVE, &[&vec![5_i32]]).await?;
        anyhow::Ok(row.get::<_, i32>(0))
    });
    until_blocked_by(
        &conn,
        first_pid,
        "the second reservation to wait for the first",
    )
    .await?;
    first.commit().await?;

    assert_eq!(waiting.await??, 2, "only the room the first claim left");
    assert_eq!(counts(&conn, "acct").await?, (5, 5));
    Ok(())
}

/// A claim leases only what its grant kept: an assignment the grant refuses stays scheduled
/// exactly as it was (its lease count, last executor, last grant time and account), the
/// account keeps no slot for it, and the rest of the claim is leased and delivered.
#[tokio::test]
async fn a_refused_assignment_stays_as_it_was_and_the_rest_is_leased() -> Result<()> {
    let (db, conn) = database(
        &["a1"],
        10,
        "UPDATE herald.accounts SET recipient_interval_ms = 3600000",
    )
    .await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    create_many(&mut tasks, vec![pooled("p", "+r"), pooled("p", "+s")]).await?;
    let task = |recipient: &'static str| {
        let conn = &conn;
        async move {
            let row = conn
                .query_one(
                    "SELECT id FROM herald.tasks WHERE recipient = $1",
                    &[&recipient],
                )
                .await?;
            anyhow::Ok(row.get::<_, Uuid>("id"))
        }
    };
    let refused = task("+r").await?;
    // As if it had been leased twice before, last by another executor on another account.
    conn.execute(
        "UPDATE herald.tasks SET lease_count = 2, executor_id = 'earlier',
                leased_at = '2026-01-01T00:00:00Z', account_id = 'gone'
         WHERE id = $1",
        &[&refused],
    )
    .await?;

    // Another claimer's send to (a1, +r), not committed yet: routing cannot see it, and the
    // grant's recipient mark waits for it, then finds the pair just taken.
    let other = db.connect().await?;
    other
        .batch_execute(
            "BEGIN;
             INSERT INTO herald.recipient_sends (namespace, account_id, recipient, last_sent_at)
             VALUES ('default', 'a1', 'r', now())",
        )
        .await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 10).await?;
    herald_tests::until("the grant waits for the other send to (a1, +r)", || async {
        let row = conn
            .query_one(
                "SELECT count(*) AS n FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                   AND query LIKE '%grant_claim%'",
                &[],
            )
            .await?;
        Ok(row.get::<_, i64>("n") > 0)
    })
    .await?;
    other.batch_execute("COMMIT").await?;

    let leases = exec.leases(1).await?;
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].task_id, task("+s").await?.to_string());
    assert_eq!(leases[0].account_id, "a1");
    let row = conn
        .query_one(
            "SELECT state::text AS state, lease_count, executor_id, leased_at, lease_expires_at,
                    account_id
             FROM herald.tasks WHERE id = $1",
            &[&refused],
        )
        .await?;
    assert_eq!(row.get::<_, String>("state"), "scheduled");
    assert_eq!(row.get::<_, i32>("lease_count"), 2);
    assert_eq!(
        row.get::<_, Option<String>>("executor_id").as_deref(),
        Some("earlier")
    );
    let prior: DateTime<Utc> = "2026-01-01T00:00:00Z".parse()?;
    assert_eq!(
        row.get::<_, Option<DateTime<Utc>>>("leased_at"),
        Some(prior)
    );
    assert_eq!(
        row.get::<_, Option<DateTime<Utc>>>("lease_expires_at"),
        None
    );
    assert_eq!(
        row.get::<_, Option<String>>("account_id").as_deref(),
        Some("gone")
    );
    assert_eq!(counts(&conn, "a1").await?.0, 1, "one slot in flight: +s's");
    Ok(())
}

/// A routed lease is stamped with the instant its account's capacity was taken: its
/// `leased_at` is the instant the grant recorded the send to its recipient at, so the recorded
/// lease times keep the spacing and rates the reservation enforced (docs/accounts.md).
#[tokio::test]
async fn a_routed_lease_is_stamped_with_its_grant_instant() -> Result<()> {
    let (db, conn) = database(
        &["a1", "a2"],
        10,
        "UPDATE herald.accounts SET recipient_interval_ms = 1000",
    )
    .await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let recipients = ["+r1", "+r2", "+r3", "+r4"];
    create_many(
        &mut tasks,
        recipients.iter().map(|r| pooled("p", r)).collect(),
    )
    .await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 10).await?;
    let leases = exec.leases(recipients.len()).await?;
    assert_eq!(leases.len(), recipients.len());
    let rows = conn
        .query(
            "SELECT t.recipient, t.account_id, t.leased_at, s.last_sent_at
             FROM herald.tasks t
             JOIN herald.recipient_sends s
               ON s.namespace = t.namespace AND s.account_id = t.account_id
              AND s.recipient = ltrim(t.recipient, '+')",
            &[],
        )
        .await?;
    assert_eq!(rows.len(), recipients.len(), "every send has its mark");
    for row in rows {
        let leased: DateTime<Utc> = row.get("leased_at");
        let marked: DateTime<Utc> = row.get("last_sent_at");
        assert_eq!(
            leased,
            marked,
            "{} through {}",
            row.get::<_, String>("recipient"),
            row.get::<_, String>("account_id")
        );
    }
    Ok(())
}

/// A grant in progress on account `a1`, from another connection: it holds the account's row
/// (as `herald.reserve_capacity` does) and would mark the pair (`a1`, `+r`) next. The pair's
/// mark exists, as an earlier send left it, so a block of that recipient updates its row.
struct GrantInProgress {
    conn: Client,
    pid: i32,
}

impl GrantInProgress {
    async fn start(db: &TestDb, conn: &Client) -> Result<Self> {
        conn.execute(
            "INSERT INTO herald.recipient_sends (namespace, account_id, recipient, last_sent_at)
             VALUES ('default', 'a1', 'r', now() - interval '1 hour')
             ON CONFLICT DO NOTHING",
            &[],
        )
        .await?;
        let grant = db.connect().await?;
        grant
            .batch_execute(
                "BEGIN;
                 SELECT 1 FROM herald.accounts
                 WHERE namespace = 'default' AND id = 'a1' FOR UPDATE",
            )
            .await?;
        let pid = grant
            .query_one("SELECT pg_backend_pid() AS pid", &[])
            .await?
            .get("pid");
        Ok(GrantInProgress { conn: grant, pid })
    }

    /// Waits until a statement whose text contains `statement` waits for this grant, directly
    /// or behind other sessions waiting for the same row: a second waiter for a row lock waits
    /// for the first (which holds the row's tuple lock), not for the row's holder. The
    /// scheduler's own jobs (the fold of a report's deltas) may be queued first.
    async fn until_waited_on_by(&self, conn: &Client, statement: &str) -> Result<()> {
        let pattern = format!("%{statement}%");
        herald_tests::until(&format!("{statement} to wait for the grant"), || async {
            let row = conn
                .query_one(
                    "WITH RECURSIVE waiting(pid) AS (
                         SELECT a.pid FROM pg_stat_activity a
                         WHERE $1 = ANY(pg_blocking_pids(a.pid))
                         UNION
                         SELECT a.pid FROM pg_stat_activity a, waiting w
                         WHERE w.pid = ANY(pg_blocking_pids(a.pid))
                     )
                     SELECT count(*) AS n FROM pg_stat_activity a JOIN waiting w USING (pid)
                     WHERE a.datname = current_database() AND a.query LIKE $2",
                    &[&self.pid, &pattern],
                )
                .await?;
            Ok(row.get::<_, i64>("n") > 0)
        })
        .await
    }

    /// Marks the pair, as the grant would next: it must not have to wait for `waiter`, which
    /// waits for the grant. Then commits.
    async fn mark_and_commit(self, waiter: &str) -> Result<()> {
        self.mark(waiter).await?;
        self.conn.batch_execute("COMMIT").await?;
        Ok(())
    }

    /// Takes the pair's mark without waiting; `waiter` must not hold it.
    async fn mark(&self, waiter: &str) -> Result<()> {
        self.conn
            .batch_execute(
                "SELECT 1 FROM herald.recipient_sends
                 WHERE namespace = 'default' AND account_id = 'a1' AND recipient = 'r'
                 FOR UPDATE NOWAIT",
            )
            .await
            .with_context(|| {
                format!("{waiter} holds the recipient's mark while it waits for the account")
            })
    }
}

/// A recipient-scoped RATE_LIMITED report takes its account's row before the recipient's mark,
/// as a claim's grant does: while a grant holds the account, the report waits without holding
/// the mark the grant is about to write (the other way round the two deadlocked).
#[tokio::test]
async fn a_recipient_limit_reported_during_a_grant_waits_for_the_account_before_the_mark(
) -> Result<()> {
    // Recovering from a slowdown: its feedback goes onto its row at once, not into the deltas.
    let (db, conn) = database(
        &["a1"],
        10,
        "UPDATE herald.accounts SET effective_rate = 500",
    )
    .await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    create_many(&mut tasks, vec![pooled("p", "+r")]).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 10).await?;
    let lease = exec.leases(1).await?.remove(0);
    assert_eq!(lease.account_id, "a1");
    let grant = GrantInProgress::start(&db, &conn).await?;
    let mut limited = result(&lease, OutcomeClass::RateLimited);
    limited.rate_limit_scope = RateLimitScope::Recipient as i32;
    exec.send(executor_message::Kind::Report(ReportBatch {
        results: vec![limited],
    }))
    .await?;
    grant.until_waited_on_by(&conn, "account_feedback").await?;
    grant.mark_and_commit("the report").await?;

    match exec.next().await? {
        scheduler_message::Kind::ReportAcks(acks) => {
            assert_eq!(acks.acks.len(), 1);
            assert!(acks.acks[0].accepted, "{:?}", acks.acks[0]);
        }
        other => anyhow::bail!("expected report acks, got {other:?}"),
    }
    let blocked: bool = conn
        .query_one(
            "SELECT blocked_until > now() AS blocked FROM herald.recipient_sends
             WHERE namespace = 'default' AND account_id = 'a1' AND recipient = 'r'",
            &[],
        )
        .await?
        .get("blocked");
    assert!(blocked, "the recipient is left alone after the report");
    Ok(())
}

/// A provider webhook batch that both ends a send for a recipient-limit failure (131049: the
/// recipient is left alone on its account) and reports on that account's standing takes the
/// account's row before the recipient's mark, as a grant does: while a grant holds the
/// account, the batch waits without holding the mark the grant is about to write.
#[tokio::test]
async fn a_webhook_batch_waits_for_the_account_before_the_recipients_mark() -> Result<()> {
    let (db, conn) = database(&["a1"], 10, "").await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    create_many(&mut tasks, vec![pooled("p", "+r")]).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 10).await?;
    let lease = exec.leases(1).await?.remove(0);
    let mut sent = result(&lease, OutcomeClass::Ok);
    sent.provider_message_id = "wamid-r".into();
    let acks = exec.report(vec![sent]).await?;
    assert!(acks[0].accepted, "{acks:?}");
    let grant = GrantInProgress::start(&db, &conn).await?;
    let mut lease_client = connect_lease(&scheduler.grpc_url()).await?;
    let webhook = tokio::spawn(async move {
        lease_client
            .record_provider_events(RecordProviderEventsRequest {
                events: vec![
                    ProviderEvent {
                        kind: Some(provider_event::Kind::Delivery(DeliveryStatusEvent {
                            provider_message_id: "wamid-r".into(),
                            state: DeliveryState::FailedAfterAcceptance as i32,
                            error_code: 131_049,
                            error: "per-user marketing limit".into(),
                            ..Default::default()
                        })),
                    },
                    ProviderEvent {
                        kind: Some(provider_event::Kind::Standing(AccountStandingEvent {
                            credentials_ref: "a1".into(),
                            quality: "yellow".into(),
                            ..Default::default()
                        })),
                    },
                ],
            })
            .await
    });
    grant
        .until_waited_on_by(&conn, "whose credentials_ref is one of")
        .await?;
    grant.mark_and_commit("the webhook batch").await?;

    webhook.await??;
    let row = conn
        .query_one(
            "SELECT (SELECT blocked_until > now() FROM herald.recipient_sends
                     WHERE account_id = 'a1' AND recipient = 'r') AS blocked,
                    (SELECT quality FROM herald.accounts WHERE id = 'a1') AS quality",
            &[],
        )
        .await?;
    assert!(row.get::<_, bool>("blocked"), "the recipient is left alone");
    assert_eq!(
        row.get::<_, Option<String>>("quality").as_deref(),
        Some("yellow")
    );
    Ok(())
}

/// A webhook batch whose events change two accounts, in the other order, with a reply in
/// between, takes both account rows first and in id order: while a grant holds the first, the
/// batch holds neither the second account nor the replying recipient's mark.
#[tokio::test]
async fn a_webhook_batch_takes_its_accounts_in_id_order_before_any_mark() -> Result<()> {
    let (db, conn) = database(&["a1", "a2"], 10, "").await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let grant = GrantInProgress::start(&db, &conn).await?;
    let standing = |account: &str| ProviderEvent {
        kind: Some(provider_event::Kind::Standing(AccountStandingEvent {
            credentials_ref: account.into(),
            quality: "yellow".into(),
            ..Default::default()
        })),
    };
    let reply = ProviderEvent {
        kind: Some(provider_event::Kind::Inbound(InboundMessageEvent {
            credentials_ref: "a1".into(),
            sender: "+r".into(),
            r#type: "text".into(),
            text: "thanks".into(),
            ..Default::default()
        })),
    };
    let mut lease_client = connect_lease(&scheduler.grpc_url()).await?;
    let webhook = tokio::spawn(async move {
        lease_client
            .record_provider_events(RecordProviderEventsRequest {
                events: vec![standing("a2"), reply, standing("a1")],
            })
            .await
    });
    grant.until_waited_on_by(&conn, "herald.accounts").await?;
    take_at_once(&grant.conn, "a2")
        .await
        .context("the webhook batch holds a2 while it waits for a1")?;
    grant.mark_and_commit("the webhook batch").await?;

    webhook.await??;
    let qualities: Vec<Option<String>> = conn
        .query("SELECT quality FROM herald.accounts ORDER BY id", &[])
        .await?
        .iter()
        .map(|r| r.get("quality"))
        .collect();
    assert_eq!(qualities, vec![Some("yellow".to_owned()); 2]);
    Ok(())
}

/// An account that has sent for weeks at its configured rate: its success streak and its count
/// of outcomes seen stay small. Both were integers that only grew, and once one overflowed,
/// every feedback of the account failed, and with it every report batch that carried one (its
/// leases then lapsed and were sent again).
#[tokio::test]
async fn feedback_on_an_account_with_billions_of_outcomes_still_applies() -> Result<()> {
    let (_db, conn) = database(
        &["a1"],
        10,
        "UPDATE herald.accounts SET success_streak = 2147483600, outcomes_seen = 2147483600",
    )
    .await?;
    conn.batch_execute(
        "SELECT herald.apply_account_feedback('default', ARRAY['a1'], ARRAY[0], ARRAY[0],
             ARRAY[100], ARRAY[0], ARRAY[0]::bigint[], ARRAY[0], ARRAY[0], ARRAY[NULL]::text[])",
    )
    .await?;
    let row = conn
        .query_one(
            "SELECT success_streak, outcomes_seen FROM herald.accounts WHERE id = 'a1'",
            &[],
        )
        .await?;
    assert_eq!(
        (
            row.get::<_, i32>("success_streak"),
            row.get::<_, i32>("outcomes_seen")
        ),
        (0, 20)
    );
    Ok(())
}
