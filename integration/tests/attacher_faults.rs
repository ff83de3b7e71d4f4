//! attacher cases the real driver cannot show, with the fault driver (which
//! logs every ControllerPublishVolume call): two replicas with the leader
//! killed mid-burst, inline (migrated) volume specs, detach after the CSINode
//! is gone, and readonly publishing.

use std::{collections::BTreeMap, time::Duration};

use csi_sidecar_integration::{
    failover::{assert_lease_held, fast_leader_election, kill_leader, wait_one_leader},
    fault_driver::{FaultDriver, FaultEnv, Script, Transport},
    kube_support::{attached_count, create, csi_node, csi_pv, volume_attachment, wait_deleted, wait_for},
    process::Proc,
    sidecar_bin, wait_until,
};
use futures::future::join_all;
use k8s_openapi::api::{
    core::v1::{CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec},
    storage::v1::{CSINode, VolumeAttachment},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};

const T: Duration = Duration::from_secs(60);

struct Env(FaultEnv);

impl std::ops::Deref for Env {
    type Target = FaultEnv;
    fn deref(&self) -> &FaultEnv {
        &self.0
    }
}

impl Env {
    async fn new(prefix: &str) -> Env {
        Env(FaultEnv::new(prefix).await)
    }

    fn driver(&self, f: impl FnOnce(&mut Script)) -> FaultDriver {
        let mut script = Script { publish: true, ..self.script() };
        f(&mut script);
        FaultDriver::start(&self.socket(), Transport::Grpc, script)
    }

    fn attacher(&self, name: &str, extra: &[&str]) -> Proc {
        let base = ["attacher", "--retry-interval-start=200ms", "--retry-interval-max=2s", "-v=4"];
        let args: Vec<&str> = base.into_iter().chain(extra.iter().copied()).collect();
        self.sidecar(name, &sidecar_bin(), &args)
    }

    fn vas(&self) -> Api<VolumeAttachment> {
        Api::all(self.ns.client().clone())
    }

    fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.ns.client().clone())
    }

    /// A node with a CSINode whose node ID for the driver is `id`.
    async fn node(&self, suffix: &str, id: &str) -> String {
        let node = format!("{}-{suffix}", self.ns.name());
        create(&Api::<CSINode>::all(self.ns.client().clone()), &csi_node(&node, &self.driver_name, id, &[])).await;
        node
    }
}

/// Two replicas; the leader is killed with SIGKILL while 60 attachments over
/// 6 nodes are being published. The standby takes over, every attachment
/// ends attached and its volume published on exactly its node, no publish of
/// a (volume, node) pair ever ran twice at once, and repeats are limited to
/// the calls the dead leader had in flight. Then all are detached by the
/// new leader.
#[tokio::test]
async fn leader_killed_mid_burst_attaches_everything_once() {
    const N: usize = 60;
    const WORKERS: usize = 4;
    let env = Env::new("attha").await;
    let driver = env.driver(|s| s.publish_delay = Duration::from_millis(150));
    let mut nodes = Vec::new();
    for i in 0..6 {
        nodes.push(env.node(&format!("n{i}"), &format!("id-{i}")).await);
    }
    let mut le = fast_leader_election(env.ns.name());
    le.push(format!("--worker-threads={WORKERS}"));
    let le: Vec<&str> = le.iter().map(String::as_str).collect();
    let mut a = env.attacher("attacher-a", &le);
    let mut b = env.attacher("attacher-b", &le);
    wait_one_leader(&a, &b).await;
    assert_lease_held(&env.ns, &format!("external-attacher-leader-{}", env.driver_name.replace('.', "-"))).await;

    let (vas, pvs) = (env.vas(), env.pvs());
    let prefix = format!("{}-va", env.ns.name());
    let names: Vec<String> = (0..N).map(|i| format!("{prefix}-{i:02}")).collect();
    join_all(names.iter().map(|n| {
        let (pvs, pv) = (pvs.clone(), csi_pv(n, &env.driver_name, &format!("vol-{n}"), "1Mi"));
        async move { create(&pvs, &pv).await }
    }))
    .await;
    let numbered: Vec<(usize, &String)> = names.iter().enumerate().collect();
    for chunk in numbered.chunks(10) {
        join_all(chunk.iter().map(|&(i, n)| {
            let va = volume_attachment(n, &env.driver_name, &nodes[i % nodes.len()], n);
            let vas = vas.clone();
            async move { create(&vas, &va).await }
        }))
        .await;
    }
    wait_until("attaching under way", T, async || {
        let n = driver.publish_calls().len();
        (n >= 10, n)
    })
    .await;
    let handover = kill_leader(&mut a, &mut b).await;
    wait_until("all attached", Duration::from_secs(120), async || {
        let n = attached_count(&vas, &prefix).await;
        (n == N, n)
    })
    .await;

    let calls = driver.publish_calls();
    let concurrent: Vec<_> = calls.iter().filter(|c| c.concurrent).collect();
    assert!(concurrent.is_empty(), "the same volume was published to the same node twice at once: {concurrent:?}");
    let mut per_pair: BTreeMap<(String, String), usize> = BTreeMap::new();
    for c in &calls {
        *per_pair.entry((c.volume_id.clone(), c.node_id.clone())).or_default() += 1;
    }
    let repeated = per_pair.values().filter(|&&n| n > 1).count();
    assert!(
        repeated <= WORKERS,
        "{repeated} pairs published more than once; only the {WORKERS} calls in flight at the kill may repeat"
    );
    let all_vas = vas.list(&ListParams::default()).await.expect("list").items;
    let published = driver.published.lock().expect("published").clone();
    for (i, n) in names.iter().enumerate() {
        let expected_id = format!("id-{}", i % nodes.len());
        assert_eq!(published.get(&format!("vol-{n}")), Some(&vec![expected_id.clone()]), "{n}");
        let va = all_vas.iter().find(|v| v.metadata.name.as_deref() == Some(n.as_str())).expect("va");
        assert_eq!(
            va.metadata.annotations.as_ref().and_then(|a| a.get("csi.alpha.kubernetes.io/node-id")),
            Some(&expected_id)
        );
    }
    println!("FAILOVER: handover {:.1} s, {} publish calls for {N} attachments", handover.as_secs_f64(), calls.len());

    // The new leader detaches everything.
    let dp = DeleteParams::default();
    join_all(names.iter().map(|n| vas.delete(n, &dp))).await;
    for n in &names {
        wait_deleted(&vas, n, T).await;
    }
    let published = driver.published.lock().expect("published").clone();
    assert!(published.values().all(Vec::is_empty), "left published: {published:?}");
}

/// `spec.source.inlineVolumeSpec` (what the attach-detach controller
/// creates for an inline volume of a migrated in-tree plugin): published
/// with the inline CSI source, detached on deletion, no PV involved.
#[tokio::test]
async fn an_inline_volume_spec_is_attached_and_detached() {
    let env = Env::new("attinl").await;
    let driver = env.driver(|_| ());
    let node = env.node("n", "inline-node-id").await;
    let _attacher = env.attacher("attacher", &[]);
    let mut va = volume_attachment(&format!("{}-inline", env.ns.name()), &env.driver_name, &node, "");
    va.spec.source.persistent_volume_name = None;
    va.spec.source.inline_volume_spec = Some(PersistentVolumeSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        csi: Some(CSIPersistentVolumeSource {
            driver: env.driver_name.clone(),
            volume_handle: "inline-handle".into(),
            fs_type: Some("xfs".into()),
            volume_attributes: Some([("zone".to_string(), "z1".to_string())].into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let name = va.metadata.name.clone().expect("name");
    let vas = env.vas();
    create(&vas, &va).await;
    let attached = wait_for(&vas, &name, T, |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
    assert_eq!(
        attached.status.and_then(|s| s.attachment_metadata).unwrap_or_default().get("device").map(String::as_str),
        Some("/dev/fault")
    );
    let calls = driver.publish_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!((calls[0].volume_id.as_str(), calls[0].node_id.as_str()), ("inline-handle", "inline-node-id"));
    assert_eq!(calls[0].volume_context.get("zone").map(String::as_str), Some("z1"));

    vas.delete(&name, &DeleteParams::default()).await.expect("delete");
    wait_deleted(&vas, &name, T).await;
    assert_eq!(driver.published.lock().expect("published").get("inline-handle"), Some(&vec![]));
}

/// Detach after the node's CSINode was deleted: the node ID saved in the
/// `csi.alpha.kubernetes.io/node-id` annotation at attach time is used.
#[tokio::test]
async fn detach_without_the_csinode_uses_the_saved_node_id() {
    let env = Env::new("attcsn").await;
    let driver = env.driver(|_| ());
    let node = env.node("n", "saved-node-id").await;
    let _attacher = env.attacher("attacher", &[]);
    let name = format!("{}-va", env.ns.name());
    create(&env.pvs(), &csi_pv(&name, &env.driver_name, "vol-saved", "1Mi")).await;
    let vas = env.vas();
    create(&vas, &volume_attachment(&name, &env.driver_name, &node, &name)).await;
    wait_for(&vas, &name, T, |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
    assert_eq!(driver.published.lock().expect("published").get("vol-saved"), Some(&vec!["saved-node-id".into()]));

    let csinodes: Api<CSINode> = Api::all(env.ns.client().clone());
    csinodes.delete(&node, &DeleteParams::default()).await.expect("delete csinode");
    wait_deleted(&csinodes, &node, T).await;
    vas.delete(&name, &DeleteParams::default()).await.expect("delete va");
    wait_deleted(&vas, &name, T).await;
    assert_eq!(driver.published.lock().expect("published").get("vol-saved"), Some(&vec![]), "unpublished");
    // One call; a second, idempotent one if an update event re-queued the VA
    // before the cache saw the finalizer go (as upstream may).
    let unpublishes = driver.counters.unpublishes.load(std::sync::atomic::Ordering::SeqCst);
    assert!((1..=2).contains(&unpublishes), "{unpublishes} ControllerUnpublishVolume calls");
}

/// A PV with `csi.readOnly`: published readonly only when the driver has
/// PUBLISH_READONLY (upstream's rule); without it, read-write.
#[tokio::test]
async fn readonly_is_published_only_with_the_capability() {
    for capable in [true, false] {
        let env = Env::new(if capable { "attro" } else { "attrw" }).await;
        let driver = env.driver(|s| s.publish_readonly = capable);
        let node = env.node("n", "id").await;
        let attacher = env.attacher("attacher", &[]);
        let name = format!("{}-va", env.ns.name());
        let mut pv = csi_pv(&name, &env.driver_name, "vol-ro", "1Mi");
        if let Some(c) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
            c.read_only = Some(true);
        }
        create(&env.pvs(), &pv).await;
        let vas = env.vas();
        create(&vas, &volume_attachment(&name, &env.driver_name, &node, &name)).await;
        wait_for(&vas, &name, T, |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
        let calls = driver.publish_calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].readonly, capable, "PUBLISH_READONLY={capable}");
        drop(attacher);
        drop(driver);
    }
}
