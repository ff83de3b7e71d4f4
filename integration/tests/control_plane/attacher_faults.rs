//! attacher cases the real driver cannot show, with the fault driver (which
//! logs every ControllerPublishVolume call): two replicas with the leader
//! killed mid-burst, inline (migrated) volume specs, detach after the CSINode
//! is gone, readonly publishing, a delete during a publish, the retry backoff
//! of a failing publish and status written after a success.

use std::{collections::BTreeMap, time::Duration};

use csi_sidecar_integration::{
    bench::parse_metrics,
    failover::{assert_lease_held, fast_leader_election, kill_leader, wait_one_leader},
    fault_driver::{CallKind, CallOutcome, ControllerCall, FaultDriver, FaultEnv, Script, Transport},
    free_port,
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
use tonic::Code;

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

    /// The attacher with `/metrics` on `addr` and exactly `module_args`.
    fn attacher_serving(&self, name: &str, addr: &str, module_args: &[&str]) -> Proc {
        let endpoint = format!("--http-endpoint={addr}");
        let args: Vec<&str> = [endpoint.as_str(), "attacher"].into_iter().chain(module_args.iter().copied()).collect();
        self.sidecar(name, &sidecar_bin(), &args)
    }

    /// `count` PVs (volume `vol-<name>`) with a VolumeAttachment each to
    /// `node`, created at once; returns the names (PV = VA name).
    async fn attachments(&self, tag: &str, count: usize, node: &str) -> Vec<String> {
        let (vas, pvs) = (self.vas(), self.pvs());
        let names: Vec<String> = (0..count).map(|i| format!("{}-{tag}-{i:02}", self.ns.name())).collect();
        join_all(names.iter().map(|n| {
            let (pvs, pv) = (pvs.clone(), csi_pv(n, &self.driver_name, &format!("vol-{n}"), "1Mi"));
            async move { create(&pvs, &pv).await }
        }))
        .await;
        join_all(names.iter().map(|n| {
            let (vas, va) = (vas.clone(), volume_attachment(n, &self.driver_name, node, n));
            async move { create(&vas, &va).await }
        }))
        .await;
        names
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

/// Whether every call on a key has ended and the one that ended last is a
/// successful unpublish.
fn ends_unpublished(calls: &[ControllerCall]) -> bool {
    let last_to_end = calls.iter().max_by_key(|c| c.end);
    calls.iter().all(|c| c.end.is_some())
        && last_to_end.is_some_and(|c| c.kind == CallKind::Unpublish && c.outcome == Some(CallOutcome::Ok))
}

fn describe_calls(calls: &[ControllerCall]) -> Vec<String> {
    let t0 = calls.first().map(|c| c.start);
    let ms = |t: std::time::Instant| t0.map_or(0, |t0| t.saturating_duration_since(t0).as_millis());
    calls.iter().map(|c| format!("{:?} {}..{:?} {:?}", c.kind, ms(c.start), c.end.map(ms), c.outcome)).collect()
}

/// VolumeAttachments deleted while their (slow) publish is in flight: the
/// detach must wait for the publish instead of running beside it, and the
/// volume must end unpublished (not published again by the late attach).
#[tokio::test]
async fn a_delete_during_a_publish_ends_unpublished_without_overlap() {
    const N: usize = 6;
    let env = Env::new("attdel").await;
    let driver = env.driver(|s| s.publish_delay = Duration::from_secs(4));
    let node = env.node("n", "del-node").await;
    let _attacher = env.attacher("attacher", &[]);
    let names = env.attachments("va", N, &node).await;
    let vol = |n: &str| format!("vol-{n}");
    wait_until("every publish in flight", T, async || {
        let started: Vec<usize> = names.iter().map(|n| driver.calls_for(&vol(n), "del-node").len()).collect();
        (started.iter().all(|&c| c > 0), started)
    })
    .await;
    let (vas, dp) = (env.vas(), DeleteParams::default());
    join_all(names.iter().map(|n| vas.delete(n, &dp))).await;
    for n in &names {
        wait_deleted(&vas, n, T).await;
    }
    // The last call may come after the VA is gone: wait until every key's
    // calls have ended and either the volume is unpublished or the calls
    // stopped changing for lack of anything left to do.
    let settled = |driver: &FaultDriver| {
        names.iter().all(|n| {
            let calls = driver.calls_for(&vol(n), "del-node");
            calls.iter().all(|c| c.end.is_some())
        })
    };
    wait_until("every call on the keys ended", T, async || (settled(&driver), driver.controller_calls().len())).await;
    let unpublished =
        |driver: &FaultDriver| names.iter().all(|n| ends_unpublished(&driver.calls_for(&vol(n), "del-node")));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !unpublished(&driver) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The sidecar had the chance to do more: a fresh attachment on the same
    // node goes through attach and detach, then the keys are checked again.
    let probe = env.attachments("probe", 1, &node).await.remove(0);
    wait_for(&vas, &probe, T, |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
    vas.delete(&probe, &DeleteParams::default()).await.expect("delete probe");
    wait_deleted(&vas, &probe, T).await;

    let overlaps = driver.overlaps();
    let not_unpublished: Vec<(String, Vec<String>)> = names
        .iter()
        .map(|n| (vol(n), driver.calls_for(&vol(n), "del-node")))
        .filter(|(_, calls)| !ends_unpublished(calls))
        .map(|(v, calls)| (v, describe_calls(&calls)))
        .collect();
    let published = driver.published.lock().expect("published").clone();
    let left: Vec<&String> = names
        .iter()
        .map(|n| vol(n))
        .filter_map(|v| published.get_key_value(&v).filter(|(_, nodes)| !nodes.is_empty()).map(|(k, _)| k))
        .collect();
    assert!(
        overlaps.is_empty() && not_unpublished.is_empty() && left.is_empty(),
        "{} overlapping call pairs on one (volume, node): {:?}\nkeys whose last call is not a successful unpublish: {not_unpublished:#?}\nleft published: {left:?}",
        overlaps.len(),
        overlaps.iter().map(|(a, b)| format!("{} {:?}+{:?}", a.volume_id, a.kind, b.kind)).collect::<Vec<_>>(),
    );
}

/// A publish that always fails is retried with `--retry-interval-start=1s`
/// doubling up to the default maximum: about 6 calls in 60 s (t = 0, 1, 3,
/// 7, 15, 31), never two at once. Status writes (`attachError`) must not
/// re-run it.
#[tokio::test]
async fn a_failing_publish_is_retried_no_faster_than_the_backoff() {
    const WINDOW: Duration = Duration::from_secs(60);
    const MAX_CALLS: usize = 7;
    let env = Env::new("attbo").await;
    let driver = env.driver(|s| s.publish_error = Some((Code::Internal, "the backend refuses".into())));
    let node = env.node("n", "bo-node").await;
    let addr = format!("127.0.0.1:{}", free_port());
    let _attacher = env.attacher_serving("attacher", &addr, &["--retry-interval-start=1s", "-v=4"]);
    let name = env.attachments("va", 1, &node).await.remove(0);
    let volume = format!("vol-{name}");
    wait_until("the first publish", T, async || {
        let n = driver.calls_for(&volume, "bo-node").len();
        (n > 0, n)
    })
    .await;
    let first = driver.calls_for(&volume, "bo-node")[0].start;
    while first.elapsed() < WINDOW {
        let calls = driver.calls_for(&volume, "bo-node");
        let in_window: Vec<_> = calls.iter().filter(|c| c.start.duration_since(first) < WINDOW).collect();
        assert!(
            in_window.len() <= MAX_CALLS,
            "{} publish calls within {:.1} s of the first (backoff 1 s doubling allows {MAX_CALLS} in 60 s): {:?}",
            in_window.len(),
            first.elapsed().as_secs_f64(),
            describe_calls(&calls)
        );
        let overlaps = driver.overlaps();
        assert!(overlaps.is_empty(), "two publishes at once: {:?}", describe_calls(&calls));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let calls = driver.calls_for(&volume, "bo-node");
    let in_window = calls.iter().filter(|c| c.start.duration_since(first) < WINDOW).count();
    assert!(in_window >= 4, "the failing publish is retried at all: {:?}", describe_calls(&calls));
    let va = env.vas().get(&name).await.expect("va");
    assert!(va.status.and_then(|s| s.attach_error).is_some(), "the failure is recorded in attachError");
}

/// `workqueue_depth` summed over the attacher's queues (None if unreadable).
async fn queue_depth(addr: &str) -> Option<f64> {
    let text = csi_sidecar_integration::http::get(addr, "/metrics").await.ok()?.body;
    let samples = parse_metrics(&text, &["workqueue_depth"]);
    (!samples.is_empty()).then(|| samples.iter().map(|s| s.value).sum())
}

/// 20 attachments whose first publish fails once each: after all are
/// `attached: true`, none carries an `attachError` (a failure or a conflict
/// written after the success), also once the sidecar's queues are empty and
/// another attachment went through.
#[tokio::test]
async fn attached_volumes_carry_no_stale_attach_error() {
    const N: usize = 20;
    let env = Env::new("attstale").await;
    // The retry of the failed first attempt (200 ms) comes due while the
    // second attempt is still publishing (300 ms).
    let _driver = env.driver(|s| {
        s.publish_delay = Duration::from_millis(300);
        s.publish_failures_per_pair = 1;
    });
    let node = env.node("n", "stale-node").await;
    let addr = format!("127.0.0.1:{}", free_port());
    let _attacher =
        env.attacher_serving("attacher", &addr, &["--retry-interval-start=200ms", "--retry-interval-max=2s", "-v=4"]);
    let names = env.attachments("va", N, &node).await;
    let vas = env.vas();
    let prefix = format!("{}-va", env.ns.name());
    wait_until("all attached", Duration::from_secs(120), async || {
        let n = attached_count(&vas, &prefix).await;
        (n == N, n)
    })
    .await;
    let stale = async || -> Vec<(String, String)> {
        let list = vas.list(&ListParams::default()).await.expect("list").items;
        list.into_iter()
            .filter(|v| v.metadata.name.as_deref().is_some_and(|n| names.iter().any(|m| m == n)))
            .filter_map(|v| {
                let st = v.status?;
                let msg = st.attach_error?.message.unwrap_or_default();
                Some((v.metadata.name.unwrap_or_default(), format!("attached={} attachError={msg}", st.attached)))
            })
            .collect()
    };
    let at_attach = stale().await;
    // Give the sidecar the chance to write more: its queues drain, another
    // attachment goes through, the queues drain again.
    wait_until("empty work queues", T, async || {
        let d = queue_depth(&addr).await;
        (d == Some(0.0), d)
    })
    .await;
    let probe = env.attachments("probe", 1, &node).await.remove(0);
    wait_for(&vas, &probe, Duration::from_secs(60), |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
    wait_until("empty work queues again", T, async || {
        let d = queue_depth(&addr).await;
        (d == Some(0.0), d)
    })
    .await;
    let later = stale().await;
    assert!(
        at_attach.is_empty() && later.is_empty(),
        "attached VolumeAttachments with an attachError: when all were attached {at_attach:#?}; after the queues drained {later:#?}"
    );
}

/// At `-v=5` every gRPC response is logged: a publish context (it may carry
/// credentials) is stripped like a secret, and `--max-grpc-log-length` cuts
/// the line. Before, the whole response was logged, context values included.
#[tokio::test]
async fn logged_responses_are_redacted_and_cut_to_the_max_length() {
    let env = Env::new("attlog").await;
    let _driver = env.driver(|_| ());
    let node = env.node("n", "log-node-id").await;
    let attacher = env.attacher("attacher", &["-v=5", "--max-grpc-log-length=30"]);
    let names = env.attachments("log", 1, &node).await;
    let vas = env.vas();
    wait_for(&vas, &names[0], T, |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
    let logs = wait_until("the publish response in the log", T, async || {
        let logs = attacher.logs();
        (logs.lines().any(|l| l.contains("GRPC response") && l.contains("ControllerPublishVolume")), logs)
    })
    .await;
    let line = logs
        .lines()
        .find(|l| l.contains("GRPC response") && l.contains("ControllerPublishVolume"))
        .expect("response line");
    assert!(line.contains("response truncated"), "{line}");
    assert!(!logs.contains("/dev/fault"), "the publish context value reached the log:\n{logs}");
}

/// The publish secret cannot be read at detach time: the detach fails with
/// upstream's text and the driver is not called (before, it was called with
/// empty secrets, which a driver needing them rejects or, worse, accepts for
/// the wrong tenant). Once the secret is back, the detach goes through.
#[tokio::test]
async fn detach_fails_while_the_publish_secret_cannot_be_read() {
    use k8s_openapi::api::core::v1::{Secret, SecretReference};
    let env = Env::new("attsec").await;
    let driver = env.driver(|_| ());
    let node = env.node("n", "sec-node-id").await;
    let _attacher = env.attacher("attacher", &[]);
    let secrets: Api<Secret> = env.ns.api();
    let secret = Secret {
        metadata: kube::api::ObjectMeta { name: Some("publish".into()), ..Default::default() },
        string_data: Some([("token".to_string(), "t0k3n".to_string())].into()),
        ..Default::default()
    };
    create(&secrets, &secret).await;
    let name = format!("{}-sec", env.ns.name());
    let mut pv = csi_pv(&name, &env.driver_name, &format!("vol-{name}"), "1Mi");
    if let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
        csi.controller_publish_secret_ref =
            Some(SecretReference { name: Some("publish".into()), namespace: Some(env.ns.name().to_string()) });
    }
    create(&env.pvs(), &pv).await;
    let vas = env.vas();
    create(&vas, &volume_attachment(&name, &env.driver_name, &node, &name)).await;
    wait_for(&vas, &name, T, |v| v.status.as_ref().is_some_and(|s| s.attached)).await;

    secrets.delete("publish", &DeleteParams::default()).await.expect("delete secret");
    wait_deleted(&secrets, "publish", T).await;
    vas.delete(&name, &DeleteParams::default()).await.expect("delete va");
    let failed = wait_for(&vas, &name, T, |v| {
        v.status.as_ref().and_then(|s| s.detach_error.as_ref()).is_some_and(|e| {
            e.message.as_deref().is_some_and(|m| m.contains("error getting secret publish in namespace"))
        })
    })
    .await;
    assert!(failed.metadata.deletion_timestamp.is_some());
    let unpublishes = |d: &FaultDriver| d.controller_calls().iter().filter(|c| c.kind == CallKind::Unpublish).count();
    assert_eq!(unpublishes(&driver), 0, "no ControllerUnpublish without the secret");

    create(&secrets, &secret).await;
    wait_deleted(&vas, &name, T).await;
    assert_eq!(unpublishes(&driver), 1);
}

/// A PV deleted while attached (a Retain or static PV with a running pod)
/// loses the attacher's finalizer with its last VolumeAttachment, even with
/// `--resync=0` and when the watch delivers the attachment's deletion only
/// after the PV was synced. The order is forced: a finalizer of the test
/// holds the detached attachment until the attacher has synced the PV's
/// final version with the attachment still there; then the attachment
/// goes, and only its deletion can tell the attacher. Before, the handler
/// ignored deletions and the PV stayed until the next resync (here: never).
#[tokio::test]
async fn a_pv_deleted_while_attached_loses_the_finalizer_with_its_last_attachment() {
    const HOLD: &str = "example.com/hold";
    let env = Env::new("attpvfin").await;
    let _driver = env.driver(|_| ());
    let node = env.node("n", "pvfin-node").await;
    let attacher = env.attacher("attacher", &["--resync=0"]);
    let name = format!("{}-va", env.ns.name());
    let (pvs, vas) = (env.pvs(), env.vas());
    create(&pvs, &csi_pv(&name, &env.driver_name, "vol-pvfin", "1Mi")).await;
    let mut va = volume_attachment(&name, &env.driver_name, &node, &name);
    va.metadata.finalizers = Some(vec![HOLD.into()]);
    create(&vas, &va).await;
    let fin = format!("external-attacher/{}", env.driver_name.replace('.', "-"));
    let has = |f: &Option<Vec<String>>, which: &str| f.iter().flatten().any(|x| x == which);
    wait_for(&vas, &name, T, |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
    wait_for(&pvs, &name, T, |p| has(&p.metadata.finalizers, &fin)).await;

    // Deleted while attached: the PV stays, held by the attacher.
    pvs.delete(&name, &DeleteParams::default()).await.expect("delete pv");
    // The attachment is deleted: detached, the attacher's finalizer goes,
    // the test's keeps the object.
    vas.delete(&name, &DeleteParams::default()).await.expect("delete va");
    wait_for(&vas, &name, T, |v| !has(&v.metadata.finalizers, &fin) && v.status.as_ref().is_some_and(|s| !s.attached))
        .await;
    // The PV's final version (only the attacher's finalizer left) was
    // synced by the attacher, which kept the finalizer: the attachment
    // still referenced it.
    let pv = wait_for(&pvs, &name, T, |p| {
        p.metadata.deletion_timestamp.is_some() && p.metadata.finalizers.as_deref() == Some(std::slice::from_ref(&fin))
    })
    .await;
    let kept = format!("resource_version={}", pv.metadata.resource_version.expect("resourceVersion"));
    wait_until("the attacher's sync of the PV's final version", T, async || {
        let logs = attacher.logs();
        let seen = logs
            .lines()
            .any(|l| l.contains("PersistentVolume finalizer kept") && l.split_whitespace().any(|w| w == kept));
        (seen, kept.clone())
    })
    .await;

    let release = serde_json::json!({"metadata": {"finalizers": null}});
    vas.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&release)).await.expect("release");
    wait_deleted(&vas, &name, T).await;
    wait_deleted(&pvs, &name, Duration::from_secs(30)).await;
}
