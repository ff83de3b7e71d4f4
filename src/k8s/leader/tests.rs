//! Table tests of the pure parts; `elector` runs the I/O loop against the
//! in-memory apiserver of `fake_api`.

mod elector;
mod fake_api;
mod shared;

use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::{api::coordination::v1::LeaseSpec, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp};

use super::{elector::wall_now, *};
use crate::healthz::HealthReport;

const ME: &str = "me";
const OTHER: &str = "other";

fn cfg() -> LeaderElectionConfig {
    LeaderElectionConfig::new("lease", "ns", ME)
}

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).unwrap()
}

fn t(secs: i64) -> Option<MicroTime> {
    Some(MicroTime(ts(secs)))
}

fn spec(holder: Option<&str>, duration: i32, renew: i64, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: holder.map(String::from),
        lease_duration_seconds: Some(duration),
        acquire_time: t(0),
        renew_time: t(renew),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

#[test]
fn config_sanitizes_and_uses_upstream_defaults() {
    let c = LeaderElectionConfig::new("hostpath.csi.k8s.io", "kube-system", "node.1");
    assert_eq!(c.lease_name, "hostpath-csi-k8s-io");
    assert_eq!(c.identity, "node-1");
    assert_eq!(
        (c.lease_duration, c.renew_deadline, c.retry_period),
        (Duration::from_secs(15), Duration::from_secs(10), Duration::from_secs(5))
    );
    assert!(c.validate().is_ok());
}

#[test]
fn validation_follows_client_go() {
    let with = |f: fn(&mut LeaderElectionConfig)| {
        let mut c = cfg();
        f(&mut c);
        c.validate().is_ok()
    };
    assert!(!with(|c| c.renew_deadline = c.lease_duration));
    // renew deadline must exceed 1.2 × retry period: 10 s vs 8.4 s is fine, 6 s is not.
    assert!(with(|c| c.retry_period = Duration::from_secs(7)));
    assert!(!with(|c| c.retry_period = Duration::from_secs(9)));
    assert!(!with(|c| c.lease_duration = Duration::from_millis(500)));
    assert!(!with(|c| c.retry_period = Duration::ZERO));
    assert!(!with(|c| c.identity.clear()));
    assert!(!with(|c| c.lease_name.clear()));
}

#[test]
fn namespace_resolution_order() {
    let cases = [
        ((Some("flag"), Some("env"), Some("file")), "flag"),
        ((Some(""), Some("env"), Some("file")), "env"),
        ((None, Some(""), Some(" file\n")), "file"),
        ((None, None, Some("  \n")), "default"),
        ((None, None, None), "default"),
    ];
    for ((flag, env, file), want) in cases {
        assert_eq!(choose_namespace(flag, env, file), want, "{flag:?} {env:?} {file:?}");
    }
}

#[test]
fn observation_restarts_only_when_the_record_changes() {
    let t0 = Instant::now();
    let s = spec(Some(OTHER), 15, 0, 0);
    let first = observe(None, &s, t0);
    assert_eq!(first.at, t0);
    let same = observe(Some(first.clone()), &s, t0 + Duration::from_secs(9));
    assert_eq!(same.at, t0, "unchanged record keeps the first observation time");
    let renewed = spec(Some(OTHER), 15, 9, 0);
    let changed = observe(Some(same), &renewed, t0 + Duration::from_secs(10));
    assert_eq!(changed.at, t0 + Duration::from_secs(10));
    assert_eq!(changed.spec, renewed);
}

/// One row: the Lease as observed `ago` seconds before now (None: absent)
/// → the expected decision.
#[test]
fn decision_table() {
    let t0 = Instant::now();
    let now = t0 + Duration::from_secs(100);
    let wall = ts(1000);
    let at = |ago_ms: u64| now - Duration::from_millis(ago_ms);
    let mine_new = |transitions: i32| LeaseSpec {
        holder_identity: Some(ME.into()),
        lease_duration_seconds: Some(15),
        acquire_time: Some(MicroTime(wall)),
        renew_time: Some(MicroTime(wall)),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    };
    let expired = |h: &str| TakeOver::Expired { holder: h.to_string() };
    let cases: Vec<(&str, Option<Observed>, Decision)> = vec![
        ("no lease: create it, 0 transitions", None, Decision::Create(mine_new(0))),
        (
            "holder unset: released, take over",
            Some(Observed { spec: spec(None, 1, 50, 3), at: at(0) }),
            Decision::TakeOver { reason: TakeOver::Released, spec: mine_new(4) },
        ),
        (
            "holder empty string: released (client-go's ReleaseOnCancel)",
            Some(Observed { spec: spec(Some(""), 1, 50, 3), at: at(0) }),
            Decision::TakeOver { reason: TakeOver::Released, spec: mine_new(4) },
        ),
        (
            "someone else's, observed 1 s ago: wait 14 s",
            Some(Observed { spec: spec(Some(OTHER), 15, 99, 2), at: at(1_000) }),
            Decision::Wait { holder: OTHER.into(), expires_in: Duration::from_secs(14) },
        ),
        (
            "someone else's, renewTime ancient by their clock, but just observed: wait (clock skew)",
            Some(Observed { spec: spec(Some(OTHER), 15, -100_000, 2), at: at(0) }),
            Decision::Wait { holder: OTHER.into(), expires_in: Duration::from_secs(15) },
        ),
        (
            "someone else's, renewTime in our future, unchanged for 16 s: expired (clock skew)",
            Some(Observed { spec: spec(Some(OTHER), 15, 100_000, 2), at: at(16_000) }),
            Decision::TakeOver { reason: expired(OTHER), spec: mine_new(3) },
        ),
        (
            "someone else's, unchanged exactly the lease duration: still valid",
            Some(Observed { spec: spec(Some(OTHER), 15, 99, 2), at: at(15_000) }),
            Decision::Wait { holder: OTHER.into(), expires_in: Duration::ZERO },
        ),
        (
            "someone else's, unchanged 1 ms past the lease duration: expired, transitions + 1",
            Some(Observed { spec: spec(Some(OTHER), 15, 99, 2), at: at(15_001) }),
            Decision::TakeOver { reason: expired(OTHER), spec: mine_new(3) },
        ),
        (
            "the holder's own duration counts, not ours: 60 s, 20 s ago: wait",
            Some(Observed { spec: spec(Some(OTHER), 60, 80, 0), at: at(20_000) }),
            Decision::Wait { holder: OTHER.into(), expires_in: Duration::from_secs(40) },
        ),
        (
            "no duration written: expired as soon as time passes",
            Some(Observed {
                spec: LeaseSpec { lease_duration_seconds: None, ..spec(Some(OTHER), 0, 99, 0) },
                at: at(1),
            }),
            Decision::TakeOver { reason: expired(OTHER), spec: mine_new(1) },
        ),
        (
            "mine: renew, keeping acquireTime and transitions",
            Some(Observed { spec: spec(Some(ME), 15, 95, 7), at: at(5_000) }),
            Decision::Renew(LeaseSpec { acquire_time: t(0), lease_transitions: Some(7), ..mine_new(0) }),
        ),
        (
            "mine even though expired (e.g. restarted with the same pod name): renew",
            Some(Observed { spec: spec(Some(ME), 15, 0, 7), at: at(60_000) }),
            Decision::Renew(LeaseSpec { acquire_time: t(0), lease_transitions: Some(7), ..mine_new(0) }),
        ),
        (
            "mine with another duration: renewed with ours",
            Some(Observed { spec: spec(Some(ME), 30, 95, 1), at: at(0) }),
            Decision::Renew(LeaseSpec { acquire_time: t(0), lease_transitions: Some(1), ..mine_new(0) }),
        ),
    ];
    for (name, lease, want) in cases {
        assert_eq!(decide(lease.as_ref(), now, wall, ME, &cfg()), want, "{name}");
    }
}

#[test]
fn take_over_keeps_fields_we_do_not_own() {
    let now = Instant::now() + Duration::from_secs(100);
    let old = LeaseSpec {
        strategy: Some("OldestEmulationVersion".into()),
        preferred_holder: Some("p".into()),
        ..spec(None, 15, 0, 0)
    };
    let Decision::TakeOver { spec, .. } = decide(Some(&Observed { spec: old, at: now }), now, ts(5), ME, &cfg()) else {
        panic!("expected a take-over");
    };
    assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
    assert_eq!(spec.preferred_holder.as_deref(), Some("p"));
}

#[test]
fn release_empties_the_holder_and_keeps_transitions() {
    let r = released(&spec(Some(ME), 15, 10, 4), ts(20));
    assert_eq!(r.holder_identity.as_deref(), Some(""));
    assert_eq!(r.lease_duration_seconds, Some(1));
    assert_eq!(r.lease_transitions, Some(4));
    assert_eq!((r.acquire_time, r.renew_time), (t(20), t(20)));
    // A candidate that reads it takes over at once, counting a transition.
    let now = Instant::now();
    let d = decide(
        Some(&Observed { spec: released(&spec(Some(OTHER), 15, 10, 4), ts(20)), at: now }),
        now,
        ts(21),
        ME,
        &cfg(),
    );
    assert!(matches!(d, Decision::TakeOver { reason: TakeOver::Released, spec } if spec.lease_transitions == Some(5)));
}

#[test]
fn health_check_semantics() {
    let t0 = Instant::now();
    let lease = Duration::from_secs(15);
    let ok = HealthReport::ok();
    let failed = HealthReport::failed(
        500,
        "internal server error: failed election to renew leadership on lease external-attacher-leader-x",
    );
    let name = "external-attacher-leader-x";
    let cases = [
        ("standby", false, Some(t0), t0 + Duration::from_secs(3600), &ok),
        ("never renewed", true, None, t0 + Duration::from_secs(3600), &ok),
        ("fresh", true, Some(t0), t0 + Duration::from_secs(5), &ok),
        ("exactly lease duration + 20 s", true, Some(t0), t0 + Duration::from_secs(35), &ok),
        ("just past it", true, Some(t0), t0 + Duration::from_millis(35_001), &failed),
    ];
    for (what, leading, last, now, want) in cases {
        assert_eq!(&leader_health(leading, last, now, lease, name), want, "{what}");
    }
}

#[test]
fn jitter_stays_within_client_go_bounds() {
    let base = Duration::from_secs(5);
    let samples: Vec<_> = (0..200).map(|_| jittered(base)).collect();
    assert!(samples.iter().all(|d| *d >= base && *d < base.mul_f64(2.2)));
    assert!(samples.iter().any(|d| *d != samples[0]), "jitter varies");
}

#[test]
fn a_standby_polls_with_a_small_jitter_and_wakes_at_the_expiry() {
    let base = Duration::from_secs(2);
    let samples: Vec<_> = (0..200).map(|_| standby_jittered(base)).collect();
    assert!(samples.iter().all(|d| *d >= base && *d < base.mul_f64(1.2)), "within 1-1.2 periods");
    assert!(samples.iter().any(|d| *d != samples[0]), "jitter varies");
    let s = Duration::from_secs;
    let cases = [
        ("expiry far off: the poll period", s(2), Some(s(30)), s(2)),
        (
            "expiry before the next poll: just after it",
            s(2),
            Some(Duration::from_millis(700)),
            Duration::from_millis(710),
        ),
        ("expired already: right away", s(2), Some(Duration::ZERO), EXPIRY_MARGIN),
        ("holder unknown (a conflict): the poll period", s(2), None, s(2)),
    ];
    for (what, jitter, expires_in, want) in cases {
        assert_eq!(standby_wait(jitter, expires_in), want, "{what}");
    }
}

#[test]
fn wall_clock_has_microsecond_precision() {
    let w = wall_now();
    assert_eq!(w.subsec_nanosecond() % 1000, 0);
    assert!(w > ts(0));
}

#[test]
fn lost_reasons_read_well() {
    assert_eq!(LostReason::HeldByOther { holder: "b".into() }.to_string(), "the lease is held by b");
    let e = LeaderError::Lost { lease: "ns/l".into(), reason: LostReason::RenewDeadline { last_error: None } };
    assert_eq!(e.to_string(), "leader election lost on lease ns/l: renewal did not succeed within the deadline");
}
