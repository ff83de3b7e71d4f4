//! The election loop against [`FakeApi`]: short timings (lease 2 s, renew
//! deadline 1 s, retry period 200 ms), on tokio's paused clock: the fake
//! apiserver answers in-process, so time advances only by the loop's own
//! sleeps and timeouts, and every duration asserted here is exact however
//! busy the machine is.

use parking_lot::Mutex;
use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::fake_api::{FakeApi, config, elector, elector_with, wait_for};
use crate::k8s::leader::{LeaderElectionConfig, LeaderElector, LeaderError, LostReason};

type Running = tokio::task::JoinHandle<(Result<(), LeaderError>, bool)>;

/// What the work in hand gets to finish after a lost Lease.
const DRAIN: Duration = Duration::from_secs(1);

/// Runs `e` until `shutdown`; the result says whether the token given
/// to `lead` was cancelled by the time `run` returned.
fn spawn(e: &LeaderElector, shutdown: &CancellationToken) -> Running {
    let (e, shutdown) = (e.clone(), shutdown.clone());
    tokio::spawn(async move {
        let given: Arc<Mutex<Option<CancellationToken>>> = Arc::default();
        let slot = given.clone();
        let r = e
            .run(shutdown, DRAIN, |token| async move {
                *slot.lock() = Some(token.clone());
                token.cancelled().await;
            })
            .await;
        let cancelled = given.lock().as_ref().is_some_and(CancellationToken::is_cancelled);
        (r, cancelled)
    })
}

#[tokio::test(start_paused = true)]
async fn one_leader_then_release_hands_over_at_once() {
    let api = Arc::new(FakeApi::default());
    let (a, b) = (elector(&api, "a"), elector(&api, "b"));
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let (run_a, run_b) = (spawn(&a, &stop_a), spawn(&b, &stop_b));
    wait_for("a leader", Duration::from_secs(3), || a.is_leader() || b.is_leader()).await;
    // Several renewals later there is still exactly one.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(a.is_leader() ^ b.is_leader());
    let (leader, stop_leader, run_leader, other, stop_other, run_other) =
        if a.is_leader() { (a, stop_a, run_a, b, stop_b, run_b) } else { (b, stop_b, run_b, a, stop_a, run_a) };
    let spec = api.spec().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(leader.config().identity.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(2));
    assert_eq!(spec.lease_transitions, Some(0));
    let labels = api.lease.lock().clone().unwrap().metadata.labels.unwrap();
    assert_eq!(labels.get("app").map(String::as_str), Some("csi-sidecar"));
    assert!(leader.health_check().check().await.is_healthy());

    stop_leader.cancel();
    let (result, lead_cancelled) = run_leader.await.unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert!(lead_cancelled && !leader.is_leader());
    let took = wait_for("take-over", Duration::from_secs(2), || other.is_leader()).await;
    assert!(took < Duration::from_secs(1), "released lease taken over in {took:?}");
    let spec = api.spec().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(other.config().identity.as_str()));
    assert_eq!(spec.lease_transitions, Some(1));

    stop_other.cancel();
    assert!(run_other.await.unwrap().0.is_ok());
    assert_eq!(api.holder().as_deref(), Some(""), "released on shutdown");
    assert_eq!(api.spec().unwrap().lease_duration_seconds, Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_renewed_foreign_lease_keeps_us_standby_until_it_expires() {
    let api = Arc::new(FakeApi::default());
    api.write_as("foreign");
    let e = elector(&api, "me");
    let stop = CancellationToken::new();
    let run = spawn(&e, &stop);
    // The foreign holder renews for 3 s (longer than the 2 s lease).
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        api.write_as("foreign");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!e.is_leader(), "took a lease that is being renewed");
    }
    // It stops renewing: we take over after ~2 s of unchanged record.
    let took = wait_for("expiry take-over", Duration::from_secs(4), || e.is_leader()).await;
    assert!(took >= Duration::from_millis(1500), "took over after only {took:?}");
    assert_eq!(api.holder().as_deref(), Some("me"));
    assert_eq!(api.spec().unwrap().lease_transitions, Some(1));
    stop.cancel();
    assert!(run.await.unwrap().0.is_ok());
}

#[tokio::test(start_paused = true)]
async fn shutdown_while_standby_returns_without_leading() {
    let api = Arc::new(FakeApi::default());
    api.write_as("foreign");
    let e = elector(&api, "me");
    let stop = CancellationToken::new();
    let run = spawn(&e, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    let (result, lead_ran) = run.await.unwrap();
    assert!(result.is_ok() && !lead_ran);
    assert_eq!(api.holder().as_deref(), Some("foreign"), "not ours to release");
}

#[tokio::test(start_paused = true)]
async fn unreachable_apiserver_loses_leadership_within_the_renew_deadline() {
    let api = Arc::new(FakeApi::default());
    let e = elector(&api, "me");
    let run = spawn(&e, &CancellationToken::new());
    wait_for("leader", Duration::from_secs(2), || e.is_leader()).await;
    api.down.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let (result, lead_cancelled) = run.await.unwrap();
    // At most one retry period until the round starts, plus the deadline.
    assert!(start.elapsed() < Duration::from_millis(1200 + 500), "{:?}", start.elapsed());
    assert!(matches!(&result, Err(LeaderError::Lost { reason: LostReason::RenewDeadline { .. }, .. })), "{result:?}");
    assert!(lead_cancelled && !e.is_leader());
    assert!(e.health_check().check().await.is_healthy(), "not leading: healthy");
}

#[tokio::test(start_paused = true)]
async fn another_writer_taking_the_lease_stops_us_at_once() {
    let api = Arc::new(FakeApi::default());
    let e = elector(&api, "me");
    let run = spawn(&e, &CancellationToken::new());
    wait_for("leader", Duration::from_secs(2), || e.is_leader()).await;
    api.write_as("intruder");
    let start = Instant::now();
    let (result, lead_cancelled) = run.await.unwrap();
    assert!(start.elapsed() < Duration::from_millis(500), "{:?}", start.elapsed());
    match result {
        Err(LeaderError::Lost { lease, reason: LostReason::HeldByOther { holder } }) => {
            assert_eq!((lease.as_str(), holder.as_str()), ("ns/lease", "intruder"))
        }
        other => panic!("{other:?}"),
    }
    assert!(lead_cancelled);
    assert_eq!(api.holder().as_deref(), Some("intruder"), "a lost lease is not released");
}

/// On a lost Lease the work in hand finishes (a CSI call in flight gets
/// its answer recorded, as on shutdown) within the drain time; work that
/// would take longer is dropped when it ends.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_lets_the_work_in_hand_finish_within_the_drain_time() {
    for (work_after_cancel, finished) in [(Duration::from_millis(300), true), (DRAIN * 3, false)] {
        let api = Arc::new(FakeApi::default());
        let e = elector(&api, "me");
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let run = {
            let (e, done) = (e.clone(), done.clone());
            tokio::spawn(async move {
                e.run(CancellationToken::new(), DRAIN, |token| async move {
                    token.cancelled().await;
                    tokio::time::sleep(work_after_cancel).await;
                    done.store(true, Ordering::SeqCst);
                })
                .await
            })
        };
        wait_for("leader", Duration::from_secs(2), || e.is_leader()).await;
        api.write_as("intruder");
        let result = run.await.unwrap();
        assert!(matches!(result, Err(LeaderError::Lost { .. })), "{result:?}");
        assert_eq!(done.load(Ordering::SeqCst), finished, "work of {work_after_cancel:?} after the loss");
        assert!(!e.is_leader());
    }
}

#[tokio::test(start_paused = true)]
async fn the_leader_renews_without_reading_first() {
    let api = Arc::new(FakeApi::default());
    let e = elector(&api, "me");
    let stop = CancellationToken::new();
    let run = spawn(&e, &stop);
    wait_for("leader", Duration::from_secs(2), || e.is_leader()).await;
    let (gets, puts) = (api.gets.load(Ordering::SeqCst), api.puts.load(Ordering::SeqCst));
    let renewed_before = api.spec().unwrap().renew_time.unwrap().0;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(api.gets.load(Ordering::SeqCst), gets, "fast path: no GET while renewing");
    assert!(api.puts.load(Ordering::SeqCst) >= puts + 3, "a renewal every 200 ms");
    let renewed = api.spec().unwrap().renew_time.unwrap().0;
    assert!(renewed > renewed_before, "renewTime advances with each renewal");
    stop.cancel();
    assert!(run.await.unwrap().0.is_ok());
}

#[tokio::test(start_paused = true)]
async fn same_identity_after_restart_resumes_at_once() {
    let api = Arc::new(FakeApi::default());
    api.write_as("me");
    let e = elector(&api, "me");
    let stop = CancellationToken::new();
    let run = spawn(&e, &stop);
    wait_for("leader", Duration::from_millis(500), || e.is_leader()).await;
    stop.cancel();
    assert!(run.await.unwrap().0.is_ok());
}

#[tokio::test(start_paused = true)]
async fn invalid_config_is_refused_before_any_call() {
    let api = Arc::new(FakeApi::default());
    let e = elector_with(&api, LeaderElectionConfig { renew_deadline: Duration::from_secs(5), ..config("me") });
    let r = e.run(CancellationToken::new(), DRAIN, |_| async {}).await;
    assert!(matches!(r, Err(LeaderError::Config(_))), "{r:?}");
    assert!(api.lease.lock().is_none());
}
