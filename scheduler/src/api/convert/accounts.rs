//! Accounts and pools on the wire, and the update mask of UpdateAccount. A limit crosses the
//! wire here.

use herald_proto::v1 as pb;

use super::{duration_from_ms, duration_ms, timestamp};
use crate::accounts::model::{AccountLimits, AccountRecord, AccountSpec, AccountState, PoolRecord};
use crate::error::{Error, Violations};
use crate::rules::parse_clock;
use chrono::NaiveDate;

/// A wire account as a domain definition, defaults filled in; wire problems are recorded
/// under `path` (missing limits among them, with stand-ins in the definition).
pub fn account_spec(a: &pb::Account, path: &str, v: &mut Violations) -> AccountSpec {
    let f = |name: &str| format!("{path}.{name}");
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
            // Stand-in limits, their own problems not reported, so that the account's other
            // fields are still checked and named in the same answer.
            let stand_in = pb::AccountLimits {
                rate_per_second: 1.0,
                ..Default::default()
            };
            limits(&stand_in, &f("limits"), &mut Violations::default())
        }
        Some(l) => limits(l, &f("limits"), v),
    };
    AccountSpec {
        id: a.id.clone(),
        sender_kind: a.sender_kind.clone(),
        pool: a.pool.clone(),
        time_zone: if a.time_zone.is_empty() {
            "UTC".to_string()
        } else {
            a.time_zone.clone()
        },
        credentials_ref: if a.credentials_ref.is_empty() {
            a.id.clone()
        } else {
            a.credentials_ref.clone()
        },
        state,
        limits,
    }
}

/// Wire limits with their defaults filled in. A malformed duration becomes a negative one,
/// which the domain refuses with the field's own rule.
fn limits(l: &pb::AccountLimits, path: &str, v: &mut Violations) -> AccountLimits {
    let ms = |d: &prost_types::Duration| duration_ms(d).unwrap_or(-1);
    let (quiet_start, quiet_end) = match &l.quiet_hours {
        None => (None, None),
        Some(q) => match (parse_clock(&q.start), parse_clock(&q.end)) {
            (Some(s), Some(e)) => (Some(s), Some(e)),
            _ => {
                v.add(format!("{path}.quiet_hours"), "start and end must be HH:MM");
                (None, None)
            }
        },
    };
    let warm_up = l.warm_up.as_ref();
    // A warm-up with neither initial nor per_day would be dropped as no ramp at all: the
    // account would send at its full rate from the first day, which is what a ramp is set to
    // prevent.
    if warm_up.is_some_and(|w| w.initial.is_none() && w.per_day.is_empty()) {
        v.add(
            format!("{path}.warm_up.initial"),
            "is required unless per_day is set",
        );
    }
    AccountLimits {
        rate_per_sec: l.rate_per_second,
        burst: l
            .burst
            .unwrap_or_else(|| AccountLimits::default_burst(l.rate_per_second)),
        daily_cap: l.daily_cap,
        max_in_flight: l.max_in_flight,
        recipient_interval_ms: l.recipient_interval.as_ref().map(ms),
        quiet_start,
        quiet_end,
        high_priority_reserve: l.high_priority_reserve,
        high_priority_min: l
            .high_priority_min
            .map_or(AccountLimits::DEFAULT_HIGH_PRIORITY_MIN, |m| {
                i16::try_from(m).unwrap_or(i16::MAX)
            }),
        adaptive_floor: l
            .adaptive_floor
            .unwrap_or(AccountLimits::DEFAULT_ADAPTIVE_FLOOR),
        recovery_successes: l
            .recovery_successes
            .unwrap_or(AccountLimits::DEFAULT_RECOVERY_SUCCESSES),
        offline_cooldown_ms: l
            .offline_cooldown
            .as_ref()
            .map_or(AccountLimits::DEFAULT_OFFLINE_COOLDOWN_MS, ms),
        ramp_start: warm_up.and_then(|w| {
            if w.start_date.is_empty() {
                return None;
            }
            let day = NaiveDate::parse_from_str(&w.start_date, "%Y-%m-%d").ok();
            if day.is_none() {
                v.add(format!("{path}.warm_up.start_date"), "must be YYYY-MM-DD");
            }
            day
        }),
        ramp_initial: warm_up.and_then(|w| w.initial),
        ramp_step: warm_up.and_then(|w| w.step),
        ramp_ceiling: warm_up.and_then(|w| w.ceiling),
        ramp_table: warm_up
            .filter(|w| !w.per_day.is_empty())
            .map(|w| w.per_day.clone()),
        gap_min_ms: l.gaps.as_ref().map(|g| g.min.as_ref().map_or(-1, ms)),
        gap_max_ms: l.gaps.as_ref().and_then(|g| g.max.as_ref().map(ms)),
        tier_limit: tier_limit(l.messaging_tier, &format!("{path}.messaging_tier"), v),
        pause_failure_rate: l.pause_failure_rate,
    }
}

/// The most unique recipients a tier allows per rolling 24 hours (None: no tier limit).
pub fn tier_limit(tier: i32, path: &str, v: &mut Violations) -> Option<i32> {
    match pb::MessagingTier::try_from(tier) {
        Ok(pb::MessagingTier::Unspecified) => None,
        Ok(pb::MessagingTier::Limit50) => Some(50),
        Ok(pb::MessagingTier::Limit250) => Some(250),
        Ok(pb::MessagingTier::Limit1k) => Some(1_000),
        Ok(pb::MessagingTier::Limit2k) => Some(2_000),
        Ok(pb::MessagingTier::Limit10k) => Some(10_000),
        Ok(pb::MessagingTier::Limit100k) => Some(100_000),
        Ok(pb::MessagingTier::Unlimited) => Some(i32::MAX),
        Err(_) => {
            v.add(path.to_owned(), "is not a messaging tier");
            None
        }
    }
}

fn tier_to_wire(limit: Option<i32>) -> pb::MessagingTier {
    match limit {
        None => pb::MessagingTier::Unspecified,
        Some(50) => pb::MessagingTier::Limit50,
        Some(250) => pb::MessagingTier::Limit250,
        Some(1_000) => pb::MessagingTier::Limit1k,
        Some(2_000) => pb::MessagingTier::Limit2k,
        Some(10_000) => pb::MessagingTier::Limit10k,
        Some(100_000) => pb::MessagingTier::Limit100k,
        Some(_) => pb::MessagingTier::Unlimited,
    }
}

/// A wire account checked against every rule: INVALID_ARGUMENT naming each bad field.
pub fn checked_account(a: &pb::Account) -> Result<AccountSpec, Error> {
    let mut v = Violations::default();
    let spec = account_spec(a, "account", &mut v);
    spec.check("account", &mut v);
    v.into_result(spec)
}

fn limits_to_wire(l: &AccountLimits) -> pb::AccountLimits {
    pb::AccountLimits {
        rate_per_second: l.rate_per_sec,
        burst: Some(l.burst),
        daily_cap: l.daily_cap,
        max_in_flight: l.max_in_flight,
        recipient_interval: l.recipient_interval_ms.map(duration_from_ms),
        quiet_hours: l.quiet_hours().map(|(s, e)| pb::QuietHours {
            start: s.format("%H:%M").to_string(),
            end: e.format("%H:%M").to_string(),
        }),
        high_priority_reserve: l.high_priority_reserve,
        high_priority_min: Some(i32::from(l.high_priority_min)),
        adaptive_floor: Some(l.adaptive_floor),
        recovery_successes: Some(l.recovery_successes),
        offline_cooldown: Some(duration_from_ms(l.offline_cooldown_ms)),
        warm_up: (l.ramp_initial.is_some() || l.ramp_table.is_some()).then(|| pb::WarmUp {
            start_date: l
                .ramp_start
                .map(|d| d.format("%Y-%m-%d").to_string())
                .unwrap_or_default(),
            initial: l.ramp_initial,
            step: l.ramp_step,
            ceiling: l.ramp_ceiling,
            per_day: l.ramp_table.clone().unwrap_or_default(),
        }),
        gaps: l.gap_min_ms.map(|min| pb::SendGaps {
            min: Some(duration_from_ms(min)),
            max: l.gap_max_ms.map(duration_from_ms),
        }),
        messaging_tier: tier_to_wire(l.tier_limit) as i32,
        pause_failure_rate: l.pause_failure_rate,
    }
}

/// A stored account on the wire.
pub fn account(r: &AccountRecord) -> pb::Account {
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
            rate_changed_at: Some(timestamp(r.rate_changed_at)),
            today_count: r.today_count,
            in_flight: r.in_flight,
            offline_until: r.offline_until.map(timestamp),
            state_reason: r.state_reason.clone(),
            throttled_until: r.throttled_until.map(timestamp),
            today_cap: r.today_cap,
            ramp_day: r.ramp_day.map(|d| d.max(0)),
            tier_used: r.tier_used,
            health: r.health,
            quality: r.quality.clone(),
            next_send_at: r.next_send_at.map(timestamp),
        }),
        created_at: Some(timestamp(r.created_at)),
        updated_at: Some(timestamp(r.updated_at)),
    }
}

/// A pool on the wire.
pub fn pool(p: &PoolRecord) -> pb::Pool {
    pb::Pool {
        name: p.name.clone(),
        description: p.description.clone(),
        account_ids: p.account_ids.clone(),
        effective_rate: p.effective_rate,
        scheduled_tasks: p.scheduled_tasks,
        created_at: Some(timestamp(p.created_at)),
        sticky: p.sticky,
    }
}

/// Applies an update mask's paths from `patch` onto `current` (both wire accounts).
pub fn merge(
    current: &mut pb::Account,
    patch: &pb::Account,
    paths: &[String],
) -> Result<(), Error> {
    let mut limits = current.limits.clone().unwrap_or_default();
    let new = patch.limits.clone().unwrap_or_default();
    for path in paths {
        match path.as_str() {
            // The tasks waiting on the account were checked against what its kind can send (a
            // location, a WhatsApp template): another kind would fail them at send time.
            "sender_kind" if patch.sender_kind != current.sender_kind => {
                return Err(Error::invalid(
                    "account.sender_kind",
                    "cannot change: another provider is another account; create one",
                ))
            }
            "sender_kind" => {}
            "pool" => current.pool.clone_from(&patch.pool),
            "time_zone" => current.time_zone.clone_from(&patch.time_zone),
            "credentials_ref" => current.credentials_ref.clone_from(&patch.credentials_ref),
            // UNSPECIFIED is a create's default, ACTIVE: named in an update's mask it would
            // resume a paused account the caller did not ask to resume.
            "state" if patch.state == pb::AccountState::Unspecified as i32 => {
                return Err(Error::invalid(
                    "account.state",
                    "name ACCOUNT_STATE_ACTIVE or ACCOUNT_STATE_PAUSED to change the state",
                ))
            }
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
            "limits.warm_up" => limits.warm_up = new.warm_up.clone(),
            "limits.gaps" => limits.gaps = new.gaps,
            "limits.messaging_tier" => limits.messaging_tier = new.messaging_tier,
            "limits.pause_failure_rate" => limits.pause_failure_rate = new.pause_failure_rate,
            other => {
                return Err(Error::invalid(
                    "update_mask",
                    format!("unknown or read-only path {other:?}"),
                ))
            }
        }
    }
    current.limits = Some(limits);
    Ok(())
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

    fn fields(a: &pb::Account) -> Vec<String> {
        match checked_account(a) {
            Err(Error::InvalidArgument(v)) => v.into_iter().map(|f| f.field).collect(),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn fills_defaults() {
        let spec = checked_account(&wire());
        let Ok(spec) = spec else {
            panic!("refused: {spec:?}")
        };
        assert_eq!(spec.credentials_ref, "wa-1");
        assert_eq!(spec.limits.burst, 80);
        assert_eq!(spec.state, AccountState::Active);
        assert_eq!(spec.limits.offline_cooldown_ms, 300_000);
    }

    #[test]
    fn accepts_every_sender_kind_executors_implement() {
        for kind in herald_proto::SenderKind::ALL {
            let mut a = wire();
            a.sender_kind = kind.as_str().into();
            assert!(checked_account(&a).is_ok(), "{kind}");
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
        assert_eq!(
            fields(&a),
            vec![
                "account.limits.quiet_hours",
                "account.sender_kind",
                "account.time_zone",
                "account.limits.rate_per_second",
                "account.limits.high_priority_reserve"
            ]
        );
    }

    #[test]
    fn names_bad_pacing_fields() {
        let mut a = wire();
        a.limits = Some(pb::AccountLimits {
            rate_per_second: 10.0,
            warm_up: Some(pb::WarmUp {
                start_date: "1 May".into(),
                initial: Some(0),
                ceiling: Some(-1),
                ..Default::default()
            }),
            gaps: Some(pb::SendGaps {
                min: Some(prost_types::Duration {
                    seconds: 5,
                    nanos: 0,
                }),
                max: Some(prost_types::Duration {
                    seconds: 2,
                    nanos: 0,
                }),
            }),
            messaging_tier: 99,
            pause_failure_rate: Some(1.5),
            ..Default::default()
        });
        assert_eq!(
            fields(&a),
            vec![
                "account.limits.warm_up.start_date",
                "account.limits.messaging_tier",
                "account.limits.warm_up.initial",
                "account.limits.warm_up.ceiling",
                "account.limits.gaps.max",
                "account.limits.pause_failure_rate"
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
        let merged = merge(&mut current, &patch, &["limits.daily_cap".to_string()]);
        assert!(merged.is_ok());
        assert_eq!(current.pool, "wa");
        let l = current.limits.unwrap_or_default();
        assert_eq!((l.rate_per_second, l.daily_cap), (80.0, Some(5)));
        assert!(merge(&mut wire(), &patch, &["status".to_string()]).is_err());
    }
}
