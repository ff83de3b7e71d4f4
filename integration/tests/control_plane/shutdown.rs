//! SIGTERM while a CSI call is in flight, with the fault driver (which logs
//! every ControllerPublishVolume call and whether another one of the same
//! volume and node was still running): the call completes, its result is
//! written, and only then is the Lease released.

use std::time::{Duration, Instant};

use csi_sidecar::compat::{attacher::lease_lock_name, sanitize_lease_name};
use csi_sidecar_integration::{
    failover::{fast_leader_election, leads, wait_one_leader},
    fault_driver::{FaultDriver, FaultEnv, Script, Transport},
    kube_support::{create, csi_node, csi_pv, volume_attachment},
    process::Proc,
    sidecar_bin, wait_until,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::PersistentVolume,
    storage::v1::{CSINode, VolumeAttachment},
};
use kube::Api;
use nix::sys::signal::Signal;

const T: Duration = Duration::from_secs(60);

/// A fault driver that publishes slowly, one node with a CSINode and one PV
/// of the driver; `attach` creates the VolumeAttachment.
struct Setup {
    env: FaultEnv,
    driver: FaultDriver,
    node: String,
    pv: String,
}

impl Setup {
    async fn new(prefix: &str, publish_delay: Duration) -> Setup {
        let env = FaultEnv::new(prefix).await;
        let script = Script { publish: true, publish_delay, ..env.script() };
        let driver = FaultDriver::start(&env.socket(), Transport::Grpc, script);
        let node = format!("{}-n", env.ns.name());
        let client = env.ns.client().clone();
        create(&Api::<CSINode>::all(client.clone()), &csi_node(&node, &env.driver_name, "node-id", &[])).await;
        let pv = format!("{}-pv", env.ns.name());
        create(&Api::<PersistentVolume>::all(client), &csi_pv(&pv, &env.driver_name, "vol-1", "1Mi")).await;
        Setup { env, driver, node, pv }
    }

    fn attacher(&self, name: &str, extra: &[&str]) -> Proc {
        let le = fast_leader_election(self.env.ns.name());
        let mut args = vec!["attacher", "--retry-interval-start=200ms", "-v=4"];
        args.extend(le.iter().map(String::as_str));
        args.extend(extra);
        self.env.sidecar(name, &sidecar_bin(), &args)
    }

    fn vas(&self) -> Api<VolumeAttachment> {
        Api::all(self.env.ns.client().clone())
    }

    /// Creates the VolumeAttachment and waits until its publish call runs.
    async fn attach_and_wait_for_the_call(&self) -> String {
        let va = format!("{}-va", self.env.ns.name());
        create(&self.vas(), &volume_attachment(&va, &self.env.driver_name, &self.node, &self.pv)).await;
        wait_until("the publish call to start", T, async || {
            let n = self.driver.publish_calls().len();
            (n >= 1, n)
        })
        .await;
        va
    }

    async fn attached(&self, va: &str) -> bool {
        let va = self.vas().get(va).await.expect("read the VolumeAttachment");
        va.status.is_some_and(|s| s.attached)
    }

    async fn lease_holder(&self, lease: &str) -> Option<String> {
        let lease = Api::<Lease>::namespaced(self.env.ns.client().clone(), self.env.ns.name())
            .get(lease)
            .await
            .expect("read the Lease");
        lease.spec.and_then(|s| s.holder_identity)
    }
}

/// ControllerPublish takes 8 s with `--timeout=15s`; SIGTERM 0-1 s into it.
/// The process waits for the call (more than the old fixed 5 s grace),
/// writes the attachment and releases its Lease before it exits.
#[tokio::test]
async fn sigterm_during_a_csi_call_lets_it_finish_write_its_result_and_release_the_lease() {
    let s = Setup::new("shutgr", Duration::from_secs(8)).await;
    let mut attacher = s.attacher("attacher", &["--timeout=15s"]);
    wait_until("the attacher to lead", T, async || (leads(&attacher), ())).await;
    let va = s.attach_and_wait_for_the_call().await;

    attacher.signal(Signal::SIGTERM);
    let signalled = Instant::now();
    let status = attacher.wait_exit(Duration::from_secs(30)).await.expect("exit within 30 s of SIGTERM");
    let took = signalled.elapsed();
    assert!(status.success(), "exit status {status:?}");
    assert!(s.attached(&va).await, "the publish that was in flight at SIGTERM was written (exited after {took:?})");
    let lease = sanitize_lease_name(&lease_lock_name(&s.env.driver_name));
    assert_eq!(s.lease_holder(&lease).await.as_deref(), Some(""), "the Lease was released before the exit");
    assert!(attacher.logs().contains("released leader lease"), "logs:\n{}", attacher.logs());
}

/// Two replicas on one `--leader-election-shared-lease`; ControllerPublish
/// takes 4 s (within the shutdown grace). SIGTERM to the leader during the
/// call: the standby takes over only after the call returned, so no publish
/// of the volume to the node ever runs twice at once.
#[tokio::test]
async fn the_shared_lease_is_released_only_after_the_calls_in_flight_returned() {
    let s = Setup::new("shutsh", Duration::from_secs(4)).await;
    let shared = ["--leader-election-shared-lease=shutdown-test"];
    let mut a = s.attacher("attacher-a", &shared);
    let mut b = s.attacher("attacher-b", &shared);
    wait_one_leader(&a, &b).await;
    let va = s.attach_and_wait_for_the_call().await;

    let (leader, standby) = if leads(&a) { (&mut a, &b) } else { (&mut b, &a) };
    leader.signal(Signal::SIGTERM);
    let status = leader.wait_exit(Duration::from_secs(30)).await.expect("exit within 30 s of SIGTERM");
    assert!(status.success(), "exit status {status:?}");
    wait_until("the standby to lead and sync", T, async || {
        (leads(standby) && standby.logs().contains("Caches synced; attaching"), ())
    })
    .await;
    wait_until("the attachment to be attached", T, async || (s.attached(&va).await, ())).await;

    let calls = s.driver.publish_calls();
    let overlapping: Vec<_> = calls.iter().filter(|c| c.concurrent).collect();
    assert!(overlapping.is_empty(), "the standby published while the old leader's call was still running: {calls:?}");
    assert!(leader.logs().contains("released leader lease"), "logs:\n{}", leader.logs());
}
