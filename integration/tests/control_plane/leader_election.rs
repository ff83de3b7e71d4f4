//! Leader election against a real kube-apiserver: one leader among two
//! candidates, hand-over on release well within the lease duration, and a
//! Lease renewed by a foreign holder keeping a candidate standby.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use csi_sidecar::k8s::leader::{LeaderElectionConfig, LeaderElector, LeaderError};
use csi_sidecar_integration::{cluster::ControlPlane, kube_support::TestNamespace, wait_until};
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{PostParams, ResourceExt},
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "csi-sidecar-test-leader";
/// Short timings: lease 4 s, renew deadline 2 s, retry period 500 ms.
const LEASE_DURATION: Duration = Duration::from_secs(4);

fn config(namespace: &str, identity: &str) -> LeaderElectionConfig {
    let mut c = LeaderElectionConfig::new(LEASE, namespace, identity);
    c.lease_duration = LEASE_DURATION;
    c.renew_deadline = Duration::from_secs(2);
    c.retry_period = Duration::from_millis(500);
    c.labels = BTreeMap::from([("app.kubernetes.io/name".to_string(), "csi-sidecar".to_string())]);
    c
}

struct Candidate {
    elector: LeaderElector,
    shutdown: CancellationToken,
    run: JoinHandle<Result<(), LeaderError>>,
    /// The token `lead` received, once it runs.
    lead_token: Arc<Mutex<Option<CancellationToken>>>,
}

fn campaign(client: &Client, namespace: &str, identity: &str) -> Candidate {
    let elector = LeaderElector::new(client.clone(), config(namespace, identity));
    let shutdown = CancellationToken::new();
    let lead_token: Arc<Mutex<Option<CancellationToken>>> = Arc::default();
    let (e, s, slot) = (elector.clone(), shutdown.clone(), lead_token.clone());
    let run = tokio::spawn(async move {
        e.run(s, Duration::from_secs(1), |token| async move {
            *slot.lock().expect("token slot") = Some(token.clone());
            token.cancelled().await;
        })
        .await
    });
    Candidate { elector, shutdown, run, lead_token }
}

fn wall_now() -> MicroTime {
    let micros = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_micros();
    MicroTime(Timestamp::from_microsecond(i64::try_from(micros).expect("in range")).expect("in range"))
}

async fn spec(api: &Api<Lease>) -> LeaseSpec {
    api.get(LEASE).await.expect("read the lease").spec.unwrap_or_default()
}

#[tokio::test]
async fn one_leader_and_release_hands_over_within_the_lease_duration() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "leader").await;
    let leases: Api<Lease> = ns.api();

    let a = campaign(&client, ns.name(), "candidate-a");
    let b = campaign(&client, ns.name(), "candidate-b");
    wait_until("a leader", Duration::from_secs(10), async || (a.elector.is_leader() || b.elector.is_leader(), ()))
        .await;
    // Several renewal rounds later, still exactly one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(a.elector.is_leader() ^ b.elector.is_leader(), "exactly one leader");
    let (leader, other) = if a.elector.is_leader() { (a, b) } else { (b, a) };

    let lease = leases.get(LEASE).await.unwrap();
    assert_eq!(lease.labels().get("app.kubernetes.io/name").map(String::as_str), Some("csi-sidecar"));
    let s = lease.spec.unwrap();
    assert_eq!(s.holder_identity.as_deref(), Some(leader.elector.config().identity.as_str()));
    assert_eq!(s.lease_duration_seconds, Some(4));
    assert_eq!(s.lease_transitions, Some(0));
    assert!(leader.elector.health_check().check().await.is_healthy());

    leader.shutdown.cancel();
    let released_at = Instant::now();
    leader.run.await.unwrap().expect("clean shutdown");
    assert!(leader.lead_token.lock().unwrap().as_ref().unwrap().is_cancelled());
    assert!(!leader.elector.is_leader());
    wait_until("take-over", LEASE_DURATION, async || (other.elector.is_leader(), ())).await;
    let took = released_at.elapsed();
    // The standby retries every 0.5–1.1 s (jittered): far below the 4 s lease.
    assert!(took < Duration::from_secs(3), "take-over after release took {took:?}");
    let s = spec(&leases).await;
    assert_eq!(s.holder_identity.as_deref(), Some(other.elector.config().identity.as_str()));
    assert_eq!(s.lease_transitions, Some(1));

    other.shutdown.cancel();
    other.run.await.unwrap().expect("clean shutdown");
    let s = spec(&leases).await;
    assert_eq!(s.holder_identity.as_deref(), Some(""), "released on shutdown");
    assert_eq!(s.lease_duration_seconds, Some(1));
    ns.delete().await;
}

#[tokio::test]
async fn a_lease_renewed_by_a_foreign_holder_keeps_the_candidate_standby() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "leader-foreign").await;
    let leases: Api<Lease> = ns.api();
    let foreign = Lease {
        metadata: ObjectMeta { name: Some(LEASE.into()), ..Default::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some("foreign".into()),
            lease_duration_seconds: Some(4),
            acquire_time: Some(wall_now()),
            renew_time: Some(wall_now()),
            lease_transitions: Some(0),
            ..Default::default()
        }),
    };
    let mut current = leases.create(&PostParams::default(), &foreign).await.unwrap();

    let c = campaign(&client, ns.name(), "candidate");
    // The foreign holder renews every second for 8 s, twice the lease duration.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(8) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!c.elector.is_leader(), "took over a lease that is being renewed");
        current.spec.as_mut().unwrap().renew_time = Some(wall_now());
        current = leases.replace(LEASE, &PostParams::default(), &current).await.unwrap();
    }
    assert_eq!(spec(&leases).await.holder_identity.as_deref(), Some("foreign"));
    assert!(c.elector.health_check().check().await.is_healthy(), "a standby is healthy");

    // The holder stops renewing: the candidate takes over once the record has
    // stayed unchanged for the lease duration (by its own clock).
    let stopped_renewing = Instant::now();
    wait_until("take-over of the expired lease", Duration::from_secs(8), async || (c.elector.is_leader(), ())).await;
    let took = stopped_renewing.elapsed();
    assert!(took >= Duration::from_secs(3), "took over after {took:?}, before the lease expired");
    let s = spec(&leases).await;
    assert_eq!(s.holder_identity.as_deref(), Some("candidate"));
    assert_eq!(s.lease_transitions, Some(1));

    c.shutdown.cancel();
    c.run.await.unwrap().expect("clean shutdown");
    ns.delete().await;
}
