//! Leader-election scaffolding shared by the tests that run two replicas:
//! fast Lease flags, who leads, and a timed hand-over.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::{kube_support::TestNamespace, process::Proc, wait_until};

/// `--leader-election` in `ns` with 4 s leases (renew deadline 3 s, retry 1 s).
pub fn fast_leader_election(ns: &str) -> Vec<String> {
    vec![
        "--leader-election".into(),
        format!("--leader-election-namespace={ns}"),
        "--leader-election-lease-duration=4s".into(),
        "--leader-election-renew-deadline=3s".into(),
        "--leader-election-retry-period=1s".into(),
    ]
}

/// Whether a csi-sidecar process logged that it acquired its Lease.
pub fn leads(p: &Proc) -> bool {
    p.logs().contains("successfully acquired lease")
}

/// Waits until one of two replicas leads and asserts it is only one.
pub async fn wait_one_leader(a: &Proc, b: &Proc) {
    wait_until("one leader", Duration::from_secs(60), async || (leads(a) || leads(b), ())).await;
    assert!(!(leads(a) && leads(b)), "exactly one replica leads");
}

/// Asserts that `lease` exists in the test namespace and has a holder.
pub async fn assert_lease_held(ns: &TestNamespace, lease: &str) {
    let held = Api::<Lease>::namespaced(ns.client().clone(), ns.name())
        .get(lease)
        .await
        .unwrap_or_else(|e| panic!("Lease {lease} (upstream's name): {e}"));
    assert!(held.spec.and_then(|s| s.holder_identity).is_some_and(|h| !h.is_empty()), "Lease {lease} has no holder");
}

/// SIGKILLs whichever of the two replicas leads, waits for the other to take
/// over and asserts that it did within 10 s (4 s leases); returns the time.
pub async fn kill_leader(a: &mut Proc, b: &mut Proc) -> Duration {
    let (leader, standby) = if leads(a) { (a, &*b) } else { (b, &*a) };
    leader.signal(nix::sys::signal::Signal::SIGKILL);
    let killed_at = Instant::now();
    wait_until("the standby to take over", Duration::from_secs(60), async || (leads(standby), ())).await;
    let handover = killed_at.elapsed();
    assert!(handover < Duration::from_secs(10), "took over after {handover:?} (lease 4s, retry 1s)");
    handover
}
