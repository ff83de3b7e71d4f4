//! A rollout from drop-in mode (each module on its upstream-named Lease, as
//! upstream's sidecars) to `--leader-election-shared-lease`, and the
//! rollback, while claims provision and volumes attach: the migration guard
//! (a module of the shared-Lease process also holds its upstream-named
//! Lease) keeps the two deployments from leading a module at once.

use std::time::Duration;

use csi_sidecar_integration::{
    failover::fast_leader_election,
    fault_driver::{FaultDriver, FaultEnv, Script, Transport},
    kube_support::{create, csi_node, csi_pv, volume_attachment, wait_for},
    process::Proc,
    sidecar_bin,
};
use futures::future::join_all;
use k8s_openapi::api::{
    core::v1::PersistentVolume,
    storage::v1::{CSINode, VolumeAttachment},
};
use kube::Api;

const CLAIMS: usize = 30;
const ATTACHMENTS: usize = 10;
const T: Duration = Duration::from_secs(120);

/// A replica of `provisioner attacher`: drop-in (per-module Leases) or with
/// the process's shared Lease.
fn replica(env: &FaultEnv, name: &str, shared: bool) -> Proc {
    let mut args = fast_leader_election(env.ns.name());
    if shared {
        args.push("--leader-election-shared-lease=sidecars".into());
    }
    args.extend(["--kube-api-qps=50", "--kube-api-burst=100", "-v=2", "provisioner", "attacher"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    env.sidecar(name, &sidecar_bin(), &args)
}

/// The timestamp of the first log line of `p` containing every one of
/// `needles` (RFC 3339 in UTC: they compare as strings).
fn logged_at(p: &Proc, needles: &[&str]) -> Option<String> {
    let logs = p.logs();
    let line = logs.lines().find(|l| needles.iter().all(|n| l.contains(n)))?;
    line.split_whitespace().next().map(str::to_string)
}

struct World {
    env: FaultEnv,
    driver: FaultDriver,
    sc: String,
    node: String,
    leases: [String; 2],
}

impl World {
    async fn new() -> World {
        let env = FaultEnv::new("roll").await;
        let driver = FaultDriver::start(
            &env.socket(),
            Transport::Grpc,
            Script { publish: true, create_delay: Duration::from_millis(100), ..env.script() },
        );
        let node = format!("{}-node", env.ns.name());
        create(&Api::<CSINode>::all(env.ns.client().clone()), &csi_node(&node, &env.driver_name, "node-id", &[])).await;
        let sc = env.storage_class("sc", |_| {}).await;
        let dashed = env.driver_name.replace('.', "-");
        let leases = [dashed.clone(), format!("external-attacher-leader-{dashed}")];
        World { env, driver, sc, node, leases }
    }

    /// Creates `CLAIMS` claims and `ATTACHMENTS` attachments named by `wave`.
    async fn start_wave(&self, wave: &str) -> (Vec<String>, Vec<String>) {
        let claims: Vec<String> = (0..CLAIMS).map(|i| format!("{wave}-c{i:02}")).collect();
        self.env.create_claims(&claims, &self.sc).await;
        let (pvs, vas): (Api<PersistentVolume>, Api<VolumeAttachment>) =
            (Api::all(self.env.ns.client().clone()), Api::all(self.env.ns.client().clone()));
        let names: Vec<String> = (0..ATTACHMENTS).map(|i| self.env.ns.scoped(&format!("{wave}-va{i:02}"))).collect();
        join_all(names.iter().map(|n| {
            let (pvs, vas, d) = (pvs.clone(), vas.clone(), self.env.driver_name.clone());
            let va = volume_attachment(n, &d, &self.node, n);
            async move {
                create(&pvs, &csi_pv(n, &d, &format!("vol-{n}"), "1Mi")).await;
                create(&vas, &va).await;
            }
        }))
        .await;
        (claims, names)
    }

    /// Every claim Bound and every attachment attached, each with exactly
    /// one CreateVolume or ControllerPublishVolume, none at once with another
    /// on the same volume.
    async fn assert_done_once(&self, claims: &[String], attachments: &[String], creates_before: u64) {
        self.env.wait_bound(claims, T).await;
        let vas: Api<VolumeAttachment> = Api::all(self.env.ns.client().clone());
        for a in attachments {
            wait_for(&vas, a, T, |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
        }
        assert_eq!(self.driver.creates() - creates_before, claims.len() as u64, "one CreateVolume per claim");
        let publishes = self.driver.publish_calls();
        for a in attachments {
            let n = publishes.iter().filter(|p| p.volume_id == format!("vol-{a}")).count();
            assert_eq!(n, 1, "one ControllerPublishVolume for {a}");
        }
        assert!(self.driver.overlaps().is_empty(), "{:?}", self.driver.overlaps());
    }

    /// `new` took each module's Lease only after `old` had released it.
    fn assert_handed_over(&self, old: &Proc, new: &Proc) {
        for lease in &self.leases {
            // `lease="<namespace>/<name>"`: the provisioner's name is a part
            // of the attacher's.
            let field = format!("/{lease}\"");
            let released = logged_at(old, &["Stopped leading", &field]).expect("the old replica released it");
            let acquired = logged_at(new, &["successfully acquired lease", &field]).expect("the new replica took it");
            assert!(released <= acquired, "{lease}: released at {released}, taken at {acquired}");
        }
    }
}

/// Drop-in → shared Lease while a wave provisions and attaches, then the
/// rollback while another does: at no moment do two replicas lead one
/// module, and nothing is done twice.
#[tokio::test]
async fn a_rollout_to_the_shared_lease_and_back_never_has_two_leaders_of_a_module() {
    let w = World::new().await;
    let mut old = replica(&w.env, "dropin", false);
    wait_for(&w.env.ns.api::<k8s_openapi::api::coordination::v1::Lease>(), &w.leases[1], T, |l| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).is_some_and(|h| !h.is_empty())
    })
    .await;

    // The rollout: the new replica starts (it takes the shared Lease, its
    // modules wait for theirs), the work arrives, the old one is stopped.
    let mut new = replica(&w.env, "shared", true);
    let creates = w.driver.creates();
    let (claims, attachments) = w.start_wave("out").await;
    old.terminate().await;
    w.assert_done_once(&claims, &attachments, creates).await;
    w.assert_handed_over(&old, &new);
    assert!(new.logs().contains("Caches synced; provisioning"), "{}", new.logs());

    // The rollback.
    let back = replica(&w.env, "rollback", false);
    let creates = w.driver.creates();
    let (claims, attachments) = w.start_wave("back").await;
    new.terminate().await;
    w.assert_done_once(&claims, &attachments, creates).await;
    w.assert_handed_over(&new, &back);
}
