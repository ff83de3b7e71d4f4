//! The pure part of leader election: what a round does with the Lease it
//! read, the released spec, the health answer and the retry jitter.

use std::{collections::hash_map::RandomState, hash::BuildHasher, time::Duration};

use k8s_openapi::{api::coordination::v1::LeaseSpec, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp};

// tokio's clock: std's monotonic clock, except in tests that pause it.
use tokio::time::Instant;

use super::config::LeaderElectionConfig;
use crate::{compat::leader_election as upstream, healthz::HealthReport};

/// The last Lease record seen and when this process first saw it, on the
/// local monotonic clock.
///
/// Why not compare the Lease's `renewTime` with our clock: `renewTime` was
/// written with the holder's clock, and the candidates' clocks may disagree by
/// more than the lease duration. Like client-go, a candidate therefore judges
/// expiry by how long the record has stayed *unchanged in its own
/// observation*: a holder that renews changes `renewTime`, which this
/// candidate sees as a new record and restarts its local countdown; a holder
/// that stopped renewing leaves the record unchanged, and after
/// `leaseDurationSeconds` of local time the Lease is expired. Only durations
/// on one clock are compared, so clock skew between nodes does not matter. The
/// cost: a fresh candidate waits a full lease duration before taking over a
/// dead holder's Lease, however old its `renewTime`.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// The Lease's spec as read (or as written by us).
    pub spec: LeaseSpec,
    /// When this process first saw this exact spec.
    pub at: Instant,
}

/// Records the spec just read: the observation time is kept when the record
/// is unchanged and restarts when it changed.
pub fn observe(prev: Option<Observed>, current: &LeaseSpec, now: Instant) -> Observed {
    match prev {
        Some(p) if p.spec == *current => p,
        _ => Observed { spec: current.clone(), at: now },
    }
}

/// Why a candidate takes over a Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TakeOver {
    /// The holder is empty (released on shutdown).
    Released,
    /// The holder has not renewed for its lease duration, by our observation.
    Expired {
        /// The previous holder.
        holder: String,
    },
}

/// What to do with the Lease just read.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// There is no Lease: create it with this spec.
    Create(LeaseSpec),
    /// Replace the Lease's spec with this one, taking it over.
    TakeOver {
        /// Why.
        reason: TakeOver,
        /// The new spec.
        spec: LeaseSpec,
    },
    /// The Lease is ours: replace its spec with this renewed one.
    Renew(LeaseSpec),
    /// Someone else holds a valid Lease.
    Wait {
        /// The holder.
        holder: String,
        /// How long until it expires, if it is not renewed meanwhile.
        expires_in: Duration,
    },
}

/// The holder of a spec (`""` when unset).
pub fn holder_of(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or("")
}

/// The pure core of client-go's `tryAcquireOrRenew`.
///
/// `lease` is the current Lease as [`observe`]d (`None`: it does not exist),
/// `now` the local monotonic time, `wall` the wall-clock time written into
/// `acquireTime`/`renewTime`. A Lease held by someone else is expired when
/// `observed.at + leaseDurationSeconds < now`, with the duration the holder
/// wrote (the local-observation form of client-go's `renewTime +
/// leaseDurationSeconds < now`; see [`Observed`]).
pub fn decide(
    lease: Option<&Observed>,
    now: Instant,
    wall: Timestamp,
    me: &str,
    config: &LeaderElectionConfig,
) -> Decision {
    let time = Some(MicroTime(wall));
    let mine = |mut spec: LeaseSpec| {
        spec.holder_identity = Some(me.to_string());
        spec.lease_duration_seconds = Some(config.lease_duration_seconds());
        spec.renew_time = time.clone();
        spec
    };
    let Some(observed) = lease else {
        return Decision::Create(LeaseSpec {
            acquire_time: time.clone(),
            lease_transitions: Some(0),
            ..mine(LeaseSpec::default())
        });
    };
    let old = &observed.spec;
    let holder = holder_of(old);
    if holder == me {
        return Decision::Renew(mine(old.clone()));
    }
    let reason = if holder.is_empty() {
        TakeOver::Released
    } else {
        let secs = u64::try_from(old.lease_duration_seconds.unwrap_or(0)).unwrap_or(0);
        let expires = observed.at + Duration::from_secs(secs);
        if expires >= now {
            return Decision::Wait { holder: holder.to_string(), expires_in: expires - now };
        }
        TakeOver::Expired { holder: holder.to_string() }
    };
    let spec = LeaseSpec {
        acquire_time: time.clone(),
        lease_transitions: Some(old.lease_transitions.unwrap_or(0).saturating_add(1)),
        ..mine(old.clone())
    };
    Decision::TakeOver { reason, spec }
}

/// The spec that releases a Lease: no holder, duration 1 s, times now, the
/// transition count kept (client-go's `release`).
pub fn released(old: &LeaseSpec, wall: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(upstream::RELEASED_LEASE_DURATION_SECONDS),
        acquire_time: Some(MicroTime(wall)),
        renew_time: Some(MicroTime(wall)),
        ..old.clone()
    }
}

/// The `/healthz/leader-election` answer: 200 `ok` unless this process leads
/// and its last successful renewal is more than lease duration + 20 s old.
pub fn leader_health(
    leading: bool,
    last_renewal: Option<Instant>,
    now: Instant,
    lease_duration: Duration,
    lease_name: &str,
) -> HealthReport {
    match last_renewal {
        Some(t) if leading && now.saturating_duration_since(t) > lease_duration + upstream::HEALTH_CHECK_TIMEOUT => {
            HealthReport::failed(500, upstream::body_renew_failed(lease_name))
        }
        _ => HealthReport::ok(),
    }
}

/// A wait of `base × (1 + factor × r)`, r uniform in [0, 1).
fn jittered_by(base: Duration, factor: f64) -> Duration {
    // A fresh `RandomState` has fresh keys: hashing anything yields a random word.
    let word = RandomState::new().hash_one(0u8);
    let r = (word >> 11) as f64 / (1u64 << 53) as f64;
    base + base.mul_f64(factor * r)
}

/// A wait of `base × (1 + 1.2 × r)`: client-go's jittered acquisition
/// retry, so candidates that started together spread out.
pub fn jittered(base: Duration) -> Duration {
    jittered_by(base, upstream::JITTER_FACTOR)
}

/// The jitter of a standby's polls: `base × (1 + 0.2 × r)`, not client-go's
/// 1.2. A standby times the holder's Lease from when it saw the last renewal,
/// so a poll up to 2.2 periods late makes the takeover up to that late
/// (measured: 6.5 s after a SIGKILL with 4 s leases and 1 s periods); the
/// polls still spread out.
pub const STANDBY_JITTER_FACTOR: f64 = 0.2;

/// Past the holder's expiry, so that the attempt at the wake-up finds it expired.
pub const EXPIRY_MARGIN: Duration = Duration::from_millis(10);

/// How long a standby waits before its next attempt: the jittered poll
/// period, or until just after the Lease expires if that is sooner (the
/// takeover then happens at the expiry, not up to a period later).
pub fn standby_wait(jitter: Duration, expires_in: Option<Duration>) -> Duration {
    match expires_in {
        Some(e) => jitter.min(e + EXPIRY_MARGIN),
        None => jitter,
    }
}

/// A standby's jittered poll period ([`STANDBY_JITTER_FACTOR`]).
pub fn standby_jittered(base: Duration) -> Duration {
    jittered_by(base, STANDBY_JITTER_FACTOR)
}
