//! AccountService: sending accounts and pools.

use base64::Engine;
use chrono::NaiveTime;
use herald_proto::v1::{self as pb, account_service_server::AccountService};
use herald_proto::SenderKind;
use tonic::{Request, Response, Status};

use super::convert;
use super::validate::{duration_ms, queue_name_problem, Violations};
use crate::auth::namespace_of;
use crate::error::{Error, FieldViolation};
use crate::model::{AccountLimits, AccountRecord, AccountSpec, AccountState, PoolRecord};
use crate::store::accounts::AccountWriteError;
use crate::store::Store;

/// The AccountService implementation.
pub struct AccountApi {
    store: Store,
}

impl AccountApi {
    /// Serves accounts from `store`.
    pub fn new(store: Store) -> Self {
        AccountApi { store }
    }
}

impl From<AccountWriteError> for Error {
    fn from(e: AccountWriteError) -> Self {
        match e {
            AccountWriteError::AlreadyExists(what) => {
                Error::AlreadyExists(format!("{what} already exists"))
            }
            AccountWriteError::NotFound(what) => Error::NotFound(what),
            AccountWriteError::InUse(m) => Error::FailedPrecondition(m),
            AccountWriteError::Store(e) => Error::Store(e),
        }
    }
}

fn invalid(field: &str, description: &str) -> Error {
    Error::InvalidArgument(vec![FieldViolation {
        field: field.into(),
        description: description.into(),
    }])
}

/// Parses "HH:MM".
fn clock(s: &str) -> Option<NaiveTime> {
    NaiveTime::parse_from_str(s, "%H:%M").ok()
}

/// Validates a wire account into a definition; `path` prefixes field names.
pub fn account_spec(a: &pb::Account, path: &str, v: &mut Violations) -> Option<AccountSpec> {
    let f = |name: &str| format!("{path}.{name}");
    if let Some(p) = queue_name_problem(&a.id) {
        v.add(f("id"), p);
    }
    // The kinds executors implement, defined once in the wire contract.
    if SenderKind::parse(&a.sender_kind).is_none() {
        v.add(
            f("sender_kind"),
            format!("must be one of {}", SenderKind::expected()),
        );
    }
    if let Some(p) = queue_name_problem(&a.pool) {
        v.add(f("pool"), p);
    }
    let time_zone = if a.time_zone.is_empty() {
        "UTC".to_string()
    } else {
        a.time_zone.clone()
    };
    if time_zone.parse::<chrono_tz::Tz>().is_err() {
        v.add(f("time_zone"), "is not an IANA time zone name");
    }
    let credentials_ref = if a.credentials_ref.is_empty() {
        a.id.clone()
    } else {
        a.credentials_ref.clone()
    };
    if credentials_ref.len() > 128 || credentials_ref.chars().any(char::is_control) {
        v.add(
            f("credentials_ref"),
            "must be at most 128 printable characters",
        );
    }
    let state = match pb::AccountState::try_from(a.state) {
        Ok(pb::AccountState::Unspecified) | Ok(pb::AccountState::Active) => AccountState::Active,
        Ok(pb::AccountState::Paused) => AccountState::Paused,
        Ok(pb::AccountState::Offline) => {
            v.add(f("state"), "OFFLINE is set by senders, not by operators");
            AccountState::Active
        }
        Err(_) => {
            v.add(f("state"), "is not an account state");
            AccountState::Active
        }
    };
    let limits = match &a.limits {
        None => {
            v.add(f("limits"), "is required (at least rate_per_second)");
            None
        }
        Some(l) => account_limits(l, &f("limits"), v),
    };
    Some(AccountSpec {
        id: a.id.clone(),
        sender_kind: a.sender_kind.clone(),
        pool: a.pool.clone(),
        time_zone,
        credentials_ref,
        state,
        limits: limits?,
    })
}

fn account_limits(l: &pb::AccountLimits, path: &str, v: &mut Violations) -> Option<AccountLimits> {
    let before = v.0.len();
    let f = |name: &str| format!("{path}.{name}");
    if !(l.rate_per_second > 0.0 && l.rate_per_second <= 10_000.0) {
        v.add(
            f("rate_per_second"),
            "must be greater than 0 and at most 10000",
        );
    }
    let burst = l
        .burst
        .unwrap_or_else(|| (l.rate_per_second.ceil() as i32).max(1));
    if !(1..=100_000).contains(&burst) {
        v.add(f("burst"), "must be between 1 and 100000");
    }
    if l.daily_cap.is_some_and(|c| c < 0) {
        v.add(f("daily_cap"), "must not be negative");
    }
    if l.max_in_flight.is_some_and(|m| m < 1) {
        v.add(f("max_in_flight"), "must be at least 1");
    }
    let recipient_interval_ms = match l.recipient_interval.as_ref().map(duration_ms) {
        None => None,
        Some(Some(ms)) if ms <= 7 * 86_400_000 => Some(ms),
        Some(_) => {
            v.add(f("recipient_interval"), "must be between 0 and 7 days");
            None
        }
    };
    let quiet_hours = match &l.quiet_hours {
        None => None,
        Some(q) => match (clock(&q.start), clock(&q.end)) {
            (Some(s), Some(e)) if s != e => Some((s, e)),
            (Some(_), Some(_)) => {
                v.add(f("quiet_hours"), "start and end must differ");
                None
            }
            _ => {
                v.add(f("quiet_hours"), "start and end must be HH:MM");
                None
            }
        },
    };
    if !(0.0..=0.9).contains(&l.high_priority_reserve) {
        v.add(f("high_priority_reserve"), "must be between 0 and 0.9");
    }
    if l.high_priority_reserve > 0.0 && l.max_in_flight.is_none() {
        v.add(f("high_priority_reserve"), "needs max_in_flight");
    }
    let high_priority_min = l.high_priority_min.unwrap_or(7);
    if !(0..=9).contains(&high_priority_min) {
        v.add(f("high_priority_min"), "must be between 0 and 9");
    }
    let adaptive_floor = l.adaptive_floor.unwrap_or(0.1);
    if !(0.01..=1.0).contains(&adaptive_floor) {
        v.add(f("adaptive_floor"), "must be between 0.01 and 1");
    }
    let recovery_successes = l.recovery_successes.unwrap_or(20);
    if !(1..=100_000).contains(&recovery_successes) {
        v.add(f("recovery_successes"), "must be between 1 and 100000");
    }
    let offline_cooldown_ms = match l.offline_cooldown.as_ref().map(duration_ms) {
        None => 300_000,
        Some(Some(ms)) if ms <= 7 * 86_400_000 => ms,
        Some(_) => {
            v.add(f("offline_cooldown"), "must be between 0 and 7 days");
            0
        }
    };
    (v.0.len() == before).then_some(AccountLimits {
        rate_per_sec: l.rate_per_second,
        burst,
        daily_cap: l.daily_cap,
        max_in_flight: l.max_in_flight,
        recipient_interval_ms,
        quiet_hours,
        high_priority_reserve: l.high_priority_reserve,
        high_priority_min: high_priority_min as i16,
        adaptive_floor,
        recovery_successes,
        offline_cooldown_ms,
    })
}

fn limits_to_wire(l: &AccountLimits) -> pb::AccountLimits {
    pb::AccountLimits {
        rate_per_second: l.rate_per_sec,
        burst: Some(l.burst),
        daily_cap: l.daily_cap,
        max_in_flight: l.max_in_flight,
        recipient_interval: l.recipient_interval_ms.map(convert::duration_from_ms),
        quiet_hours: l.quiet_hours.map(|(s, e)| pb::QuietHours {
            start: s.format("%H:%M").to_string(),
            end: e.format("%H:%M").to_string(),
        }),
        high_priority_reserve: l.high_priority_reserve,
        high_priority_min: Some(i32::from(l.high_priority_min)),
        adaptive_floor: Some(l.adaptive_floor),
        recovery_successes: Some(l.recovery_successes),
        offline_cooldown: Some(convert::duration_from_ms(l.offline_cooldown_ms)),
    }
}

fn account_to_wire(r: &AccountRecord) -> pb::Account {
    let s = &r.spec;
    pb::Account {
        id: s.id.clone(),
        sender_kind: s.sender_kind.clone(),
        pool: s.pool.clone(),
        time_zone: s.time_zone.clone(),
        credentials_ref: s.credentials_ref.clone(),
        state: match s.state {
            AccountState::Active => pb::AccountState::Active,
            AccountState::Paused => pb::AccountState::Paused,
            AccountState::Offline => pb::AccountState::Offline,
        } as i32,
        limits: Some(limits_to_wire(&s.limits)),
        status: Some(pb::AccountStatus {
            effective_rate: r.effective_rate,
            rate_change_reason: r.rate_reason.clone(),
            rate_changed_at: Some(convert::timestamp(r.rate_changed_at)),
            today_count: r.today_count,
            in_flight: r.in_flight,
            offline_until: r.offline_until.map(convert::timestamp),
            state_reason: r.state_reason.clone(),
            throttled_until: r.throttled_until.map(convert::timestamp),
        }),
        created_at: Some(convert::timestamp(r.created_at)),
        updated_at: Some(convert::timestamp(r.updated_at)),
    }
}

fn pool_to_wire(p: &PoolRecord) -> pb::Pool {
    pb::Pool {
        name: p.name.clone(),
        description: p.description.clone(),
        account_ids: p.account_ids.clone(),
        effective_rate: p.effective_rate,
        scheduled_tasks: p.scheduled_tasks,
        created_at: Some(convert::timestamp(p.created_at)),
    }
}

/// Applies an update mask's paths from `patch` onto `current` (both wire accounts).
fn merge(current: &mut pb::Account, patch: &pb::Account, paths: &[String]) -> Result<(), Error> {
    let mut limits = current.limits.clone().unwrap_or_default();
    let new = patch.limits.clone().unwrap_or_default();
    for path in paths {
        match path.as_str() {
            "sender_kind" => current.sender_kind.clone_from(&patch.sender_kind),
            "pool" => current.pool.clone_from(&patch.pool),
            "time_zone" => current.time_zone.clone_from(&patch.time_zone),
            "credentials_ref" => current.credentials_ref.clone_from(&patch.credentials_ref),
            "state" => current.state = patch.state,
            "limits" => limits = new.clone(),
            "limits.rate_per_second" => limits.rate_per_second = new.rate_per_second,
            "limits.burst" => limits.burst = new.burst,
            "limits.daily_cap" => limits.daily_cap = new.daily_cap,
            "limits.max_in_flight" => limits.max_in_flight = new.max_in_flight,
            "limits.recipient_interval" => limits.recipient_interval = new.recipient_interval,
            "limits.quiet_hours" => limits.quiet_hours = new.quiet_hours.clone(),
            "limits.high_priority_reserve" => {
                limits.high_priority_reserve = new.high_priority_reserve
            }
            "limits.high_priority_min" => limits.high_priority_min = new.high_priority_min,
            "limits.adaptive_floor" => limits.adaptive_floor = new.adaptive_floor,
            "limits.recovery_successes" => limits.recovery_successes = new.recovery_successes,
            "limits.offline_cooldown" => limits.offline_cooldown = new.offline_cooldown,
            other => {
                return Err(invalid(
                    "update_mask",
                    &format!("unknown or read-only path {other:?}"),
                ))
            }
        }
    }
    current.limits = Some(limits);
    Ok(())
}

#[tonic::async_trait]
impl AccountService for AccountApi {
    async fn create_account(
        &self,
        request: Request<pb::CreateAccountRequest>,
    ) -> Result<Response<pb::Account>, Status> {
        let ns = namespace_of(&request)?;
        let Some(account) = request.into_inner().account else {
            return Err(invalid("account", "is required").into());
        };
        let mut v = Violations::default();
        let spec = account_spec(&account, "account", &mut v);
        let spec = match (spec, v.is_empty()) {
            (Some(s), true) => s,
            _ => return Err(Error::InvalidArgument(v.0).into()),
        };
        let record = self
            .store
            .create_account(&ns, &spec)
            .await
            .map_err(Error::from)?;
        tracing::info!(account = %spec.id, pool = %spec.pool, "account created");
        Ok(Response::new(account_to_wire(&record)))
    }

    async fn update_account(
        &self,
        request: Request<pb::UpdateAccountRequest>,
    ) -> Result<Response<pb::Account>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let Some(patch) = req.account else {
            return Err(invalid("account", "is required").into());
        };
        let paths = req.update_mask.map(|m| m.paths).unwrap_or_default();
        if paths.is_empty() {
            return Err(invalid("update_mask", "name at least one field to change").into());
        }
        let Some(current) = self
            .store
            .get_account(&ns, &patch.id)
            .await
            .map_err(Error::from)?
        else {
            return Err(Error::NotFound(format!("account {}", patch.id)).into());
        };
        let mut merged = account_to_wire(&current);
        // An offline account keeps that state unless the mask sets the state.
        if current.spec.state == AccountState::Offline && !paths.iter().any(|p| p == "state") {
            merged.state = pb::AccountState::Active as i32;
        }
        merge(&mut merged, &patch, &paths)?;
        let mut v = Violations::default();
        let spec = account_spec(&merged, "account", &mut v);
        let mut spec = match (spec, v.is_empty()) {
            (Some(s), true) => s,
            _ => return Err(Error::InvalidArgument(v.0).into()),
        };
        if current.spec.state == AccountState::Offline && !paths.iter().any(|p| p == "state") {
            spec.state = AccountState::Offline;
        }
        let record = self
            .store
            .update_account(&ns, &spec)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(account_to_wire(&record)))
    }

    async fn get_account(
        &self,
        request: Request<pb::GetAccountRequest>,
    ) -> Result<Response<pb::Account>, Status> {
        let ns = namespace_of(&request)?;
        let id = request.into_inner().id;
        if let Some(p) = queue_name_problem(&id) {
            return Err(invalid("id", p).into());
        }
        let record = self
            .store
            .get_account(&ns, &id)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("account {id}")))?;
        Ok(Response::new(account_to_wire(&record)))
    }

    async fn list_accounts(
        &self,
        request: Request<pb::ListAccountsRequest>,
    ) -> Result<Response<pb::ListAccountsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let limit = match req.page_size {
            0 => 100,
            n @ 1..=1000 => i64::from(n),
            _ => return Err(invalid("page_size", "must be between 0 and 1000").into()),
        };
        let after = if req.page_token.is_empty() {
            None
        } else {
            let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(&req.page_token)
                .ok()
                .and_then(|b| String::from_utf8(b).ok());
            match decoded {
                Some(id) => Some(id),
                None => {
                    return Err(
                        invalid("page_token", "is not a token returned by ListAccounts").into(),
                    )
                }
            }
        };
        let pool = (!req.pool.is_empty()).then_some(req.pool.as_str());
        let records = self
            .store
            .list_accounts(&ns, pool, after.as_deref(), limit)
            .await
            .map_err(Error::from)?;
        let next_page_token = match records.last() {
            Some(last) if records.len() as i64 == limit => {
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&last.spec.id)
            }
            _ => String::new(),
        };
        Ok(Response::new(pb::ListAccountsResponse {
            accounts: records.iter().map(account_to_wire).collect(),
            next_page_token,
        }))
    }

    async fn delete_account(
        &self,
        request: Request<pb::DeleteAccountRequest>,
    ) -> Result<Response<pb::DeleteAccountResponse>, Status> {
        let ns = namespace_of(&request)?;
        let id = request.into_inner().id;
        if let Some(p) = queue_name_problem(&id) {
            return Err(invalid("id", p).into());
        }
        self.store
            .delete_account(&ns, &id)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::DeleteAccountResponse {}))
    }

    async fn create_pool(
        &self,
        request: Request<pb::CreatePoolRequest>,
    ) -> Result<Response<pb::Pool>, Status> {
        let ns = namespace_of(&request)?;
        let Some(pool) = request.into_inner().pool else {
            return Err(invalid("pool", "is required").into());
        };
        if let Some(p) = queue_name_problem(&pool.name) {
            return Err(invalid("pool.name", p).into());
        }
        if pool.description.chars().count() > 1024 {
            return Err(invalid("pool.description", "must be at most 1024 characters").into());
        }
        let record = self
            .store
            .create_pool(&ns, &pool.name, &pool.description)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pool_to_wire(&record)))
    }

    async fn update_pool(
        &self,
        request: Request<pb::UpdatePoolRequest>,
    ) -> Result<Response<pb::Pool>, Status> {
        let ns = namespace_of(&request)?;
        let Some(pool) = request.into_inner().pool else {
            return Err(invalid("pool", "is required").into());
        };
        if pool.description.chars().count() > 1024 {
            return Err(invalid("pool.description", "must be at most 1024 characters").into());
        }
        let record = self
            .store
            .update_pool(&ns, &pool.name, &pool.description)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pool_to_wire(&record)))
    }

    async fn get_pool(
        &self,
        request: Request<pb::GetPoolRequest>,
    ) -> Result<Response<pb::Pool>, Status> {
        let ns = namespace_of(&request)?;
        let name = request.into_inner().name;
        if let Some(p) = queue_name_problem(&name) {
            return Err(invalid("name", p).into());
        }
        let record = self
            .store
            .get_pool(&ns, &name)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("pool {name}")))?;
        Ok(Response::new(pool_to_wire(&record)))
    }

    async fn list_pools(
        &self,
        request: Request<pb::ListPoolsRequest>,
    ) -> Result<Response<pb::ListPoolsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let pools = self
            .store
            .list_pools(&ns, None)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::ListPoolsResponse {
            pools: pools.iter().map(pool_to_wire).collect(),
        }))
    }

    async fn delete_pool(
        &self,
        request: Request<pb::DeletePoolRequest>,
    ) -> Result<Response<pb::DeletePoolResponse>, Status> {
        let ns = namespace_of(&request)?;
        let name = request.into_inner().name;
        if let Some(p) = queue_name_problem(&name) {
            return Err(invalid("name", p).into());
        }
        self.store
            .delete_pool(&ns, &name)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::DeletePoolResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> pb::Account {
        pb::Account {
            id: "wa-1".into(),
            sender_kind: "whatsapp_cloud".into(),
            pool: "wa".into(),
            time_zone: "Asia/Shanghai".into(),
            limits: Some(pb::AccountLimits {
                rate_per_second: 80.0,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn fills_defaults() {
        let mut v = Violations::default();
        let spec = account_spec(&wire(), "account", &mut v).unwrap();
        assert!(v.is_empty());
        assert_eq!(spec.credentials_ref, "wa-1");
        assert_eq!(spec.limits.burst, 80);
        assert_eq!(spec.state, AccountState::Active);
        assert_eq!(spec.limits.offline_cooldown_ms, 300_000);
    }

    #[test]
    fn accepts_every_sender_kind_executors_implement() {
        for kind in SenderKind::ALL {
            let mut a = wire();
            a.sender_kind = kind.as_str().into();
            let mut v = Violations::default();
            assert!(account_spec(&a, "account", &mut v).is_some(), "{kind}");
            assert!(v.is_empty(), "{kind}");
        }
    }

    #[test]
    fn names_bad_fields() {
        let mut a = wire();
        a.time_zone = "Mars/Olympus".into();
        a.sender_kind = "fax".into();
        a.limits = Some(pb::AccountLimits {
            rate_per_second: 0.0,
            high_priority_reserve: 0.5,
            quiet_hours: Some(pb::QuietHours {
                start: "25:00".into(),
                end: "08:00".into(),
            }),
            ..Default::default()
        });
        let mut v = Violations::default();
        account_spec(&a, "account", &mut v);
        let fields: Vec<_> = v.0.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "account.sender_kind",
                "account.time_zone",
                "account.limits.rate_per_second",
                "account.limits.quiet_hours",
                "account.limits.high_priority_reserve"
            ]
        );
    }

    #[test]
    fn merges_only_masked_paths() {
        let mut current = wire();
        let mut patch = wire();
        patch.pool = "other".into();
        patch.limits = Some(pb::AccountLimits {
            rate_per_second: 10.0,
            daily_cap: Some(5),
            ..Default::default()
        });
        merge(&mut current, &patch, &["limits.daily_cap".to_string()]).unwrap();
        assert_eq!(current.pool, "wa");
        let l = current.limits.unwrap();
        assert_eq!((l.rate_per_second, l.daily_cap), (80.0, Some(5)));
        assert!(merge(&mut wire(), &patch, &["status".to_string()]).is_err());
    }
}
