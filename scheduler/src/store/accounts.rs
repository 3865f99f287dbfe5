//! The account and pool aggregates: definitions, live status, and the feedback reports give.

use chrono::{DateTime, NaiveTime, Utc};
use tokio_postgres::Row;

use super::{Store, StoreError};
use crate::model::{AccountLimits, AccountRecord, AccountSpec, AccountState, PoolRecord};

/// Why an account or pool write was refused.
#[derive(Debug, thiserror::Error)]
pub enum AccountWriteError {
    /// The id or name is taken.
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// The thing to change does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// Something still depends on it.
    #[error("{0}")]
    InUse(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

const ACCOUNT_COLUMNS: &str = "id, sender_kind, pool, time_zone, credentials_ref, state::text, \
     rate_per_sec, burst, daily_cap, max_in_flight, recipient_interval_ms, quiet_start, quiet_end, \
     high_priority_reserve, high_priority_min, adaptive_floor, recovery_successes, \
     offline_cooldown_ms, effective_rate, rate_reason, rate_changed_at, \
     CASE WHEN day = (now() AT TIME ZONE time_zone)::date THEN day_count ELSE 0 END, \
     in_flight, offline_until, state_reason, throttled_until, created_at, updated_at";

/// Accumulated feedback for one account from a batch of outcomes.
#[derive(Debug, Default, Clone)]
pub struct AccountFeedback {
    /// Leases that ended (freeing in-flight slots).
    pub released: i32,
    /// Leases that sent nothing (refunded from the daily count).
    pub refund: i32,
    /// Successful sends.
    pub ok: i32,
    /// Account-scoped RATE_LIMITED outcomes.
    pub rate_limited: i32,
    /// The longest retry-after among them, in milliseconds.
    pub retry_after_ms: i64,
    /// ACCOUNT_UNAVAILABLE outcomes.
    pub unavailable: i32,
    /// The last error that made the account unavailable.
    pub reason: Option<String>,
}

fn unique_violation(e: &StoreError) -> bool {
    e.sql_state() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

impl Store {
    /// Creates an account, and its pool if missing.
    pub async fn create_account(
        &self,
        namespace: &str,
        spec: &AccountSpec,
    ) -> Result<AccountRecord, AccountWriteError> {
        let mut conn = self.conn().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting an account create"))?;
        tx.execute(
            "INSERT INTO herald.pools (namespace, name) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&namespace, &spec.pool],
        )
        .await
        .map_err(StoreError::query("creating the account's pool"))?;
        let l = &spec.limits;
        let (quiet_start, quiet_end) = split_quiet(l.quiet_hours);
        let inserted = tx
            .execute(
                "INSERT INTO herald.accounts (namespace, id, sender_kind, pool, time_zone,
                     credentials_ref, state, rate_per_sec, burst, daily_cap, max_in_flight,
                     recipient_interval_ms, quiet_start, quiet_end, high_priority_reserve,
                     high_priority_min, adaptive_floor, recovery_successes, offline_cooldown_ms,
                     effective_rate, tokens)
                 VALUES ($1, $2, $3, $4, $5, $6, $7::text::herald.account_state, $8, $9, $10,
                         $11, $12, $13, $14, $15, $16, $17, $18, $19, $8, $20)",
                &[
                    &namespace,
                    &spec.id,
                    &spec.sender_kind,
                    &spec.pool,
                    &spec.time_zone,
                    &spec.credentials_ref,
                    &spec.state.as_str(),
                    &l.rate_per_sec,
                    &l.burst,
                    &l.daily_cap,
                    &l.max_in_flight,
                    &l.recipient_interval_ms,
                    &quiet_start,
                    &quiet_end,
                    &l.high_priority_reserve,
                    &l.high_priority_min,
                    &l.adaptive_floor,
                    &l.recovery_successes,
                    &l.offline_cooldown_ms,
                    // The bucket starts full.
                    &f64::from(l.burst),
                ],
            )
            .await
            .map_err(StoreError::query("creating an account"));
        match inserted {
            Ok(_) => {}
            Err(e) if unique_violation(&e) => {
                return Err(AccountWriteError::AlreadyExists(format!(
                    "account {}",
                    spec.id
                )))
            }
            Err(e) => return Err(e.into()),
        }
        tx.commit()
            .await
            .map_err(StoreError::query("committing an account create"))?;
        self.get_account(namespace, &spec.id)
            .await?
            .ok_or_else(|| AccountWriteError::NotFound(format!("account {}", spec.id)))
    }

    /// Replaces an account's definition (the caller merged the update mask). A changed rate
    /// resets the effective rate; the state set by an operator ends an offline spell.
    pub async fn update_account(
        &self,
        namespace: &str,
        spec: &AccountSpec,
    ) -> Result<AccountRecord, AccountWriteError> {
        let conn = self.conn().await?;
        conn.execute(
            "INSERT INTO herald.pools (namespace, name) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&namespace, &spec.pool],
        )
        .await
        .map_err(StoreError::query("creating the account's pool"))?;
        let l = &spec.limits;
        let (quiet_start, quiet_end) = split_quiet(l.quiet_hours);
        let changed = conn
            .execute(
                "UPDATE herald.accounts SET
                     sender_kind = $3, pool = $4, time_zone = $5, credentials_ref = $6,
                     state = $7::text::herald.account_state,
                     offline_until = CASE WHEN $7 = 'offline' THEN offline_until ELSE NULL END,
                     state_reason = CASE WHEN state::text = $7 THEN state_reason
                                         ELSE 'set by an operator' END,
                     effective_rate = CASE WHEN rate_per_sec = $8 THEN least(effective_rate, $8)
                                           ELSE $8 END,
                     rate_reason = CASE WHEN rate_per_sec = $8 THEN rate_reason
                                        ELSE 'configured rate' END,
                     rate_changed_at = CASE WHEN rate_per_sec = $8 THEN rate_changed_at
                                            ELSE now() END,
                     rate_per_sec = $8, burst = $9,
                     tokens = least(tokens, CAST(CAST($9 AS integer) AS float8)),
                     daily_cap = $10, max_in_flight = $11, recipient_interval_ms = $12,
                     quiet_start = $13, quiet_end = $14, high_priority_reserve = $15,
                     high_priority_min = $16, adaptive_floor = $17, recovery_successes = $18,
                     offline_cooldown_ms = $19, updated_at = now()
                 WHERE namespace = $1 AND id = $2",
                &[
                    &namespace,
                    &spec.id,
                    &spec.sender_kind,
                    &spec.pool,
                    &spec.time_zone,
                    &spec.credentials_ref,
                    &spec.state.as_str(),
                    &l.rate_per_sec,
                    &l.burst,
                    &l.daily_cap,
                    &l.max_in_flight,
                    &l.recipient_interval_ms,
                    &quiet_start,
                    &quiet_end,
                    &l.high_priority_reserve,
                    &l.high_priority_min,
                    &l.adaptive_floor,
                    &l.recovery_successes,
                    &l.offline_cooldown_ms,
                ],
            )
            .await
            .map_err(StoreError::query("updating an account"))?;
        if changed == 0 {
            return Err(AccountWriteError::NotFound(format!("account {}", spec.id)));
        }
        // Limits may have opened: wake dispatchers.
        conn.execute("SELECT pg_notify('herald_due', '0')", &[])
            .await
            .map_err(StoreError::query("announcing an account change"))?;
        self.get_account(namespace, &spec.id)
            .await?
            .ok_or_else(|| AccountWriteError::NotFound(format!("account {}", spec.id)))
    }

    /// Reads one account.
    pub async fn get_account(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Option<AccountRecord>, StoreError> {
        let conn = self.conn().await?;
        let row = conn
            .query_opt(
                &format!(
                    "SELECT {ACCOUNT_COLUMNS} FROM herald.accounts WHERE namespace = $1 AND id = $2"
                ),
                &[&namespace, &id],
            )
            .await
            .map_err(StoreError::query("reading an account"))?;
        row.as_ref().map(account_from_row).transpose()
    }

    /// Lists accounts ordered by id, after `after`, optionally of one pool.
    pub async fn list_accounts(
        &self,
        namespace: &str,
        pool: Option<&str>,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AccountRecord>, StoreError> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                &format!(
                    "SELECT {ACCOUNT_COLUMNS} FROM herald.accounts
                     WHERE namespace = $1 AND ($2::text IS NULL OR pool = $2)
                       AND ($3::text IS NULL OR id > $3)
                     ORDER BY id LIMIT $4"
                ),
                &[&namespace, &pool, &after, &limit],
            )
            .await
            .map_err(StoreError::query("listing accounts"))?;
        rows.iter().map(account_from_row).collect()
    }

    /// Deletes an account no live task needs.
    pub async fn delete_account(&self, namespace: &str, id: &str) -> Result<(), AccountWriteError> {
        let conn = self.conn().await?;
        let row = conn
            .query_one(
                "WITH live AS (
                     SELECT count(*) AS n FROM herald.tasks
                     WHERE account_id = $2 AND namespace = $1 AND state IN ('scheduled', 'leased')
                 ),
                 gone AS (
                     DELETE FROM herald.accounts
                     WHERE namespace = $1 AND id = $2 AND (SELECT n FROM live) = 0
                     RETURNING id
                 )
                 SELECT (SELECT n FROM live), (SELECT count(*) FROM gone),
                        EXISTS (SELECT 1 FROM herald.accounts WHERE namespace = $1 AND id = $2)",
                &[&namespace, &id],
            )
            .await
            .map_err(StoreError::query("deleting an account"))?;
        let live: i64 = row.get(0);
        let gone: i64 = row.get(1);
        let exists: bool = row.get(2);
        if gone > 0 {
            return Ok(());
        }
        if !exists {
            return Err(AccountWriteError::NotFound(format!("account {id}")));
        }
        Err(AccountWriteError::InUse(format!(
            "account {id} still has {live} scheduled or leased tasks"
        )))
    }

    /// Creates a pool.
    pub async fn create_pool(
        &self,
        namespace: &str,
        name: &str,
        description: &str,
    ) -> Result<PoolRecord, AccountWriteError> {
        let conn = self.conn().await?;
        let inserted = conn
            .execute(
                "INSERT INTO herald.pools (namespace, name, description) VALUES ($1, $2, $3)",
                &[&namespace, &name, &description],
            )
            .await
            .map_err(StoreError::query("creating a pool"));
        match inserted {
            Ok(_) => {}
            Err(e) if unique_violation(&e) => {
                return Err(AccountWriteError::AlreadyExists(format!("pool {name}")))
            }
            Err(e) => return Err(e.into()),
        }
        self.get_pool(namespace, name)
            .await?
            .ok_or_else(|| AccountWriteError::NotFound(format!("pool {name}")))
    }

    /// Changes a pool's description.
    pub async fn update_pool(
        &self,
        namespace: &str,
        name: &str,
        description: &str,
    ) -> Result<PoolRecord, AccountWriteError> {
        let conn = self.conn().await?;
        let changed = conn
            .execute(
                "UPDATE herald.pools SET description = $3 WHERE namespace = $1 AND name = $2",
                &[&namespace, &name, &description],
            )
            .await
            .map_err(StoreError::query("updating a pool"))?;
        if changed == 0 {
            return Err(AccountWriteError::NotFound(format!("pool {name}")));
        }
        self.get_pool(namespace, name)
            .await?
            .ok_or_else(|| AccountWriteError::NotFound(format!("pool {name}")))
    }

    /// Reads pools (all, or the one named) with their members and combined status.
    pub async fn list_pools(
        &self,
        namespace: &str,
        name: Option<&str>,
    ) -> Result<Vec<PoolRecord>, StoreError> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT p.name, p.description, p.created_at,
                        COALESCE(array_agg(a.id ORDER BY a.id) FILTER (WHERE a.id IS NOT NULL),
                                 '{}'),
                        COALESCE(sum(a.effective_rate) FILTER (WHERE a.state = 'active'), 0),
                        (SELECT count(*) FROM herald.tasks t
                         WHERE t.state = 'scheduled' AND t.route = p.namespace || '/p:' || p.name)
                 FROM herald.pools p
                 LEFT JOIN herald.accounts a ON a.namespace = p.namespace AND a.pool = p.name
                 WHERE p.namespace = $1 AND ($2::text IS NULL OR p.name = $2)
                 GROUP BY p.namespace, p.name, p.description, p.created_at
                 ORDER BY p.name",
                &[&namespace, &name],
            )
            .await
            .map_err(StoreError::query("listing pools"))?;
        Ok(rows
            .iter()
            .map(|r| PoolRecord {
                name: r.get(0),
                description: r.get(1),
                created_at: r.get(2),
                account_ids: r.get(3),
                effective_rate: r.get(4),
                scheduled_tasks: r.get(5),
            })
            .collect())
    }

    /// Reads one pool.
    pub async fn get_pool(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PoolRecord>, StoreError> {
        Ok(self
            .list_pools(namespace, Some(name))
            .await?
            .into_iter()
            .next())
    }

    /// Deletes a pool with no accounts and no waiting tasks.
    pub async fn delete_pool(&self, namespace: &str, name: &str) -> Result<(), AccountWriteError> {
        let Some(pool) = self.get_pool(namespace, name).await? else {
            return Err(AccountWriteError::NotFound(format!("pool {name}")));
        };
        if !pool.account_ids.is_empty() || pool.scheduled_tasks > 0 {
            return Err(AccountWriteError::InUse(format!(
                "pool {name} still has {} accounts and {} scheduled tasks",
                pool.account_ids.len(),
                pool.scheduled_tasks
            )));
        }
        let conn = self.conn().await?;
        conn.execute(
            "DELETE FROM herald.pools WHERE namespace = $1 AND name = $2",
            &[&namespace, &name],
        )
        .await
        .map_err(StoreError::query("deleting a pool"))?;
        Ok(())
    }

    /// Which of `pools` and `accounts` exist, for validating task targets.
    pub async fn existing_targets(
        &self,
        namespace: &str,
        pools: &[&str],
        accounts: &[&str],
    ) -> Result<(Vec<String>, Vec<String>), StoreError> {
        let conn = self.conn().await?;
        let pools_found = conn
            .query(
                "SELECT name FROM herald.pools WHERE namespace = $1 AND name = ANY($2)",
                &[&namespace, &pools],
            )
            .await
            .map_err(StoreError::query("checking pools"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let accounts_found = conn
            .query(
                "SELECT id FROM herald.accounts WHERE namespace = $1 AND id = ANY($2)",
                &[&namespace, &accounts],
            )
            .await
            .map_err(StoreError::query("checking accounts"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        Ok((pools_found, accounts_found))
    }
}

/// Applies accumulated feedback to accounts in one statement; returns true when an account that
/// was at its in-flight limit got room back.
pub(crate) async fn apply_feedback(
    client: &impl deadpool_postgres::GenericClient,
    namespace: &str,
    feedback: &std::collections::BTreeMap<String, AccountFeedback>,
) -> Result<bool, StoreError> {
    if feedback.is_empty() {
        return Ok(false);
    }
    let ids: Vec<&str> = feedback.keys().map(String::as_str).collect();
    let f: Vec<&AccountFeedback> = feedback.values().collect();
    let released: Vec<i32> = f.iter().map(|x| x.released).collect();
    let refund: Vec<i32> = f.iter().map(|x| x.refund).collect();
    let ok: Vec<i32> = f.iter().map(|x| x.ok).collect();
    let rate_limited: Vec<i32> = f.iter().map(|x| x.rate_limited).collect();
    let retry_after: Vec<i64> = f.iter().map(|x| x.retry_after_ms).collect();
    let unavailable: Vec<i32> = f.iter().map(|x| x.unavailable).collect();
    let reasons: Vec<Option<&str>> = f.iter().map(|x| x.reason.as_deref()).collect();
    let row = client
        .query_one(
            "SELECT herald.account_feedback($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &namespace,
                &ids,
                &released,
                &refund,
                &ok,
                &rate_limited,
                &retry_after,
                &unavailable,
                &reasons,
            ],
        )
        .await
        .map_err(StoreError::query("applying account feedback"))?;
    Ok(row.get::<_, Option<bool>>(0).unwrap_or(false))
}

fn split_quiet(q: Option<(NaiveTime, NaiveTime)>) -> (Option<NaiveTime>, Option<NaiveTime>) {
    match q {
        Some((s, e)) => (Some(s), Some(e)),
        None => (None, None),
    }
}

fn account_from_row(r: &Row) -> Result<AccountRecord, StoreError> {
    let state: &str = r.get(5);
    let quiet_start: Option<NaiveTime> = r.get(11);
    let quiet_end: Option<NaiveTime> = r.get(12);
    let burst: i32 = r.get(7);
    Ok(AccountRecord {
        spec: AccountSpec {
            id: r.get(0),
            sender_kind: r.get(1),
            pool: r.get(2),
            time_zone: r.get(3),
            credentials_ref: r.get(4),
            state: AccountState::parse(state)
                .ok_or_else(|| StoreError::Corrupt(format!("account state {state:?}")))?,
            limits: AccountLimits {
                rate_per_sec: r.get(6),
                burst,
                daily_cap: r.get(8),
                max_in_flight: r.get(9),
                recipient_interval_ms: r.get(10),
                quiet_hours: quiet_start.zip(quiet_end),
                high_priority_reserve: r.get(13),
                high_priority_min: r.get(14),
                adaptive_floor: r.get(15),
                recovery_successes: r.get(16),
                offline_cooldown_ms: r.get(17),
            },
        },
        effective_rate: r.get(18),
        rate_reason: r.get(19),
        rate_changed_at: r.get::<_, DateTime<Utc>>(20),
        today_count: r.get(21),
        in_flight: r.get(22),
        offline_until: r.get(23),
        state_reason: r.get(24),
        throttled_until: r.get(25),
        created_at: r.get(26),
        updated_at: r.get(27),
    })
}
