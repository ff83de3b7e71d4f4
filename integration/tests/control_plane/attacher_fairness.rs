//! Detach must not starve attach (external-attacher#761): 200 attaches are
//! queued behind 200 detaches that keep failing slowly, and still complete
//! promptly. The measured time is printed (`--nocapture`) and in the README.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use csi_sidecar_integration::{
    cluster::ControlPlane,
    fault_driver::{FaultDriver, Script, Transport},
    kube_support::{
        TestNamespace, attached_count, create, csi_node, csi_pv, server_keeps_error_code, unique_name,
        volume_attachment,
    },
    process::Proc,
    sidecar_bin, wait_until,
};
use futures::future::join_all;
use k8s_openapi::api::{
    core::v1::PersistentVolume,
    storage::v1::{CSINode, VolumeAttachment, VolumeAttachmentStatus},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};
use tonic::Code;

const N: usize = 200;
const NODES: usize = 20;

async fn create_batch(
    vas: &Api<VolumeAttachment>,
    pvs: &Api<PersistentVolume>,
    prefix: &str,
    driver: &str,
    nodes: &[String],
) -> Vec<String> {
    let names: Vec<String> = (0..N).map(|i| format!("{prefix}-{i}")).collect();
    for chunk in names.chunks(20) {
        join_all(
            chunk.iter().map(|n| async move { create(pvs, &csi_pv(n, driver, &format!("vol-{n}"), "1Mi")).await }),
        )
        .await;
    }
    for chunk in names.chunks(20) {
        join_all(
            chunk.iter().enumerate().map(|(i, n)| async move {
                create(vas, &volume_attachment(n, driver, &nodes[i % nodes.len()], n)).await
            }),
        )
        .await;
    }
    names
}

#[tokio::test]
async fn attaches_complete_while_detaches_keep_failing() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "fair").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("csi.sock");
    let driver_name = format!("{}.fault.example.com", unique_name("fair"));
    let driver = FaultDriver::start(
        &socket,
        Transport::Grpc,
        Script {
            name: driver_name.clone(),
            controller: true,
            publish: true,
            publish_delay: Duration::from_millis(20),
            ..Script::default()
        },
    );
    let nodes: Vec<String> = (0..NODES).map(|i| format!("{}-node-{i}", ns.name())).collect();
    let csinodes: Api<CSINode> = Api::all(client.clone());
    for n in &nodes {
        create(&csinodes, &csi_node(n, &driver_name, n, &[])).await;
    }
    let args = vec![
        format!("--csi-address={}", socket.display()),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        "attacher".to_string(),
        "--retry-interval-start=1s".to_string(),
        "--retry-interval-max=5s".to_string(),
        "--kube-api-qps=-1".to_string(),
    ];
    let _attacher = Proc::spawn("attacher", &sidecar_bin(), &args, dir.path());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());

    let a = format!("{}-a", ns.name());
    let batch_a = create_batch(&vas, &pvs, &a, &driver_name, &nodes).await;
    wait_until("batch A attached", Duration::from_secs(120), async || {
        let n = attached_count(&vas, &a).await;
        (n == N, n)
    })
    .await;

    // Every detach now takes 1 s and fails: the detach workers stay busy.
    driver.update(|s| {
        s.unpublish_delay = Duration::from_secs(1);
        s.unpublish_error = Some((Code::Internal, "backend busy".into()));
    });
    let dp = DeleteParams::default();
    join_all(batch_a.iter().map(|n| vas.delete(n, &dp))).await;
    wait_until("detaches failing", Duration::from_secs(30), async || {
        let n = driver.counters.unpublishes.load(std::sync::atomic::Ordering::SeqCst);
        (n >= 10, n)
    })
    .await;

    let b = format!("{}-b", ns.name());
    let start = Instant::now();
    create_batch(&vas, &pvs, &b, &driver_name, &nodes).await;
    wait_until("batch B attached behind failing detaches", Duration::from_secs(90), async || {
        let n = attached_count(&vas, &b).await;
        (n == N, n)
    })
    .await;
    let took = start.elapsed();
    let failing = driver.counters.unpublishes.load(std::sync::atomic::Ordering::SeqCst);
    println!(
        "FAIRNESS: {N} attaches behind {N} failing detaches completed in {:.1} s ({failing} failed unpublish calls meanwhile)",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(60), "attaches took {took:?}");

    // Let the detaches succeed: batch A goes away.
    driver.update(|s| s.unpublish_error = None);
    wait_until("batch A detached", Duration::from_secs(120), async || {
        let left = vas
            .list(&ListParams::default())
            .await
            .map(|l| l.items.iter().filter(|v| v.metadata.name.as_deref().is_some_and(|n| n.starts_with(&a))).count())
            .unwrap_or(usize::MAX);
        (left == 0, left)
    })
    .await;
}

/// An attacher with a 1 s ListVolumes reconciler and one attached volume.
struct Reconciled {
    // Dropped in this order: the attacher (printing its log on a failure)
    // before the directory holding the log.
    attacher: Proc,
    driver: FaultDriver,
    ns: TestNamespace,
    _dir: tempfile::TempDir,
    node: String,
    socket: std::path::PathBuf,
    driver_name: String,
}

impl Reconciled {
    async fn start(tag: &str, extra: &[&str]) -> Reconciled {
        Self::start_scripted(tag, extra, |s| s).await
    }

    /// [`Reconciled::start`] with a driver whose script `script` changes.
    async fn start_scripted(tag: &str, extra: &[&str], script: impl FnOnce(Script) -> Script) -> Reconciled {
        let cp = ControlPlane::shared();
        let client = cp.client().await;
        let ns = TestNamespace::new(&client, tag).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("csi.sock");
        let driver_name = format!("{}.fault.example.com", unique_name(tag));
        let driver = FaultDriver::start(
            &socket,
            Transport::Grpc,
            script(Script { name: driver_name.clone(), controller: true, publish: true, ..Script::default() }),
        );
        let node = format!("{}-node", ns.name());
        create(&Api::<CSINode>::all(client.clone()), &csi_node(&node, &driver_name, &node, &[])).await;
        let mut args = vec![
            format!("--csi-address={}", socket.display()),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            "attacher".to_string(),
            "--reconcile-sync=1s".to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let attacher = Proc::spawn("attacher", &sidecar_bin(), &args, dir.path());
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let name = format!("{}-va", ns.name());
        create(&pvs, &csi_pv(&name, &driver_name, "vol-recon", "1Mi")).await;
        create(&vas, &volume_attachment(&name, &driver_name, &node, &name)).await;
        wait_until("attached", Duration::from_secs(60), async || {
            let ok = vas.get(&name).await.ok().and_then(|v| v.status).is_some_and(|s| s.attached);
            (ok, ())
        })
        .await;
        let r = Reconciled { ns, _dir: dir, driver, attacher, node, socket, driver_name };
        assert_eq!(r.publishes(), 1);
        r
    }

    /// The attachment's status as last written.
    async fn status(&self) -> VolumeAttachmentStatus {
        let vas: Api<VolumeAttachment> = Api::all(self.ns.client().clone());
        vas.get(&format!("{}-va", self.ns.name())).await.ok().and_then(|v| v.status).unwrap_or_default()
    }

    /// Makes the driver forget the publication, then waits for the
    /// reconciler's publish number `n` to complete.
    async fn republish(&self, n: u64) {
        self.driver.published.lock().expect("published").insert("vol-recon".into(), vec![]);
        self.wait_published(n).await;
    }

    /// The counter moves when the call arrives; the publication is recorded
    /// when it completes.
    async fn wait_published(&self, n: u64) {
        wait_until("the reconciler to publish the volume again", Duration::from_secs(30), async || {
            let nodes = self.driver.published.lock().expect("published").get("vol-recon").cloned().unwrap_or_default();
            (self.publishes() >= n && nodes == vec![self.node.clone()], (self.publishes(), nodes))
        })
        .await;
    }

    fn publishes(&self) -> u64 {
        self.driver.counters.publishes.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn wait_republished(&self) {
        self.wait_published(2).await;
        assert!(self.attacher.logs().contains("Driver disagrees"), "{}", self.attacher.logs());
    }
}

/// The ListVolumes reconciler: the driver forgets a publication (reports the
/// volume detached from the node) → the attacher publishes it again.
#[tokio::test]
async fn the_reconciler_repairs_a_volume_the_driver_reports_detached() {
    let r = Reconciled::start("recon", &[]).await;
    r.driver.published.lock().expect("published").insert("vol-recon".into(), vec![]);
    r.wait_republished().await;
}

/// A re-attach whose publish context has other or fewer keys: the status
/// ends with exactly the new keys (the status is patched from the old
/// status to the new, as upstream's merge patch of the object and its
/// clone; the old keys used to stay beside the new ones).
#[tokio::test]
async fn a_republish_leaves_exactly_the_new_publish_context() {
    let r = Reconciled::start("recctx", &[]).await;
    let context = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let steps = [context(&[("devicePath", "/dev/sdb"), ("lun", "3")]), context(&[("devicePath", "/dev/sdc")])];
    for (n, want) in (2..).zip(steps) {
        r.driver.update(|s| s.publish_context = Some(want.clone()));
        r.republish(n).await;
        let got = wait_until("the status of the new publish", Duration::from_secs(30), async || {
            let s = r.status().await;
            let metadata = s.attachment_metadata.unwrap_or_default();
            (s.attached && metadata.get("devicePath") == want.get("devicePath"), metadata)
        })
        .await;
        assert_eq!(got, want, "publish {n}: only the keys of the last publish context");
    }
}

/// An attach error without a gRPC code (the CSINode is gone) after one with
/// a code: the old `errorCode` goes with the old error. (Only where the
/// apiserver keeps the field: 1.34 drops it, see docs/versions.md.)
#[tokio::test]
async fn a_later_error_without_a_code_drops_the_old_error_code() {
    let r = Reconciled::start("reccode", &["--retry-interval-max=2s"]).await;
    if !server_keeps_error_code(&Api::all(r.ns.client().clone()), &r.driver_name).await {
        eprintln!("skipped: this apiserver drops status.attachError.errorCode");
        return;
    }
    r.driver.update(|s| s.publish_error = Some((Code::Internal, "backend down".into())));
    r.driver.published.lock().expect("published").insert("vol-recon".into(), vec![]);
    wait_until("the driver's error in the status", Duration::from_secs(30), async || {
        let e = r.status().await.attach_error;
        (e.as_ref().is_some_and(|e| e.error_code == Some(Code::Internal as i32)), e)
    })
    .await;
    let csinodes: Api<CSINode> = Api::all(r.ns.client().clone());
    csinodes.delete(&r.node, &DeleteParams::default()).await.expect("delete csinode");
    let e = wait_until("the missing CSINode in the status", Duration::from_secs(30), async || {
        let e = r.status().await.attach_error;
        (e.as_ref().and_then(|e| e.message.as_deref()).is_some_and(|m| m.contains("not found")), e)
    })
    .await;
    assert_eq!(e.and_then(|e| e.error_code), None, "no gRPC code for this error");
}

/// A publish answered late: the passes during it see the driver publish a
/// volume whose attachment is not yet marked attached, and leave the attach
/// in flight alone; they used to force a second publish of the volume right
/// after the first (and so did passes between the status write and the
/// cache seeing it, a flake of `Reconciled::start`'s one-publish check).
#[tokio::test]
async fn the_reconciler_leaves_an_attach_in_flight_alone() {
    let late = |s| Script { publish_answer_delay: Duration::from_secs(3), ..s };
    let r = Reconciled::start_scripted("recfly", &[], late).await;
    let lists = || r.driver.counters.list_volumes.load(std::sync::atomic::Ordering::SeqCst);
    let after_attach = lists();
    wait_until("two passes over the attached volume", Duration::from_secs(30), async || {
        (lists() >= after_attach + 2, lists())
    })
    .await;
    assert_eq!(r.publishes(), 1, "{}", r.attacher.logs());
    assert!(!r.attacher.logs().contains("Driver disagrees"), "{}", r.attacher.logs());
}

/// A volume missing from the driver's answer is published nowhere, as
/// upstream reads it (it used to be skipped, so the loss went unrepaired).
#[tokio::test]
async fn the_reconciler_repairs_a_volume_missing_from_the_answer() {
    let r = Reconciled::start("recmiss", &[]).await;
    r.driver.published.lock().expect("published").remove("vol-recon");
    r.wait_republished().await;
}

/// A driver whose ListVolumes never stops returning `next_token`: each pass
/// ends at `--timeout` (upstream's one context for the pass) without acting
/// on the partial answer, and SIGTERM still stops the process at once (the
/// pass used to loop forever, out of shutdown's reach).
#[tokio::test]
async fn an_endless_list_volumes_is_cut_at_the_timeout_and_shutdown_still_works() {
    let mut r = Reconciled::start("recend", &["--timeout=2s"]).await;
    r.driver.update(|s| s.list_volumes_endless = true);
    r.driver.published.lock().expect("published").insert("vol-recon".into(), vec![]);
    wait_until("a pass cut at the timeout", Duration::from_secs(30), async || {
        (r.attacher.logs().contains("ListVolumes pass did not finish within --timeout"), ())
    })
    .await;
    assert_eq!(r.publishes(), 1, "a partial answer must not trigger repairs");
    let started = Instant::now();
    let status = r.attacher.terminate().await;
    assert_eq!(status.code(), Some(0), "{}", r.attacher.logs());
    assert!(started.elapsed() < Duration::from_secs(5), "shutdown took {:?}", started.elapsed());
}

/// A ListVolumes page slower than `--timeout`: the pass's deadline runs out
/// inside the call, which is the pass timing out (logged as such, nothing
/// acted on), not a failed ListVolumes (the log line
/// `an_endless_list_volumes_is_cut_at_the_timeout_and_shutdown_still_works`
/// waits for used to depend on where the deadline fell).
#[tokio::test]
async fn a_list_volumes_page_slower_than_the_timeout_is_the_pass_timing_out() {
    let r = Reconciled::start("recslow", &["--timeout=1s"]).await;
    r.driver.update(|s| s.list_volumes_delay = Duration::from_secs(3));
    r.driver.published.lock().expect("published").insert("vol-recon".into(), vec![]);
    // Every page takes 3 s: each pass's 1 s deadline runs out inside its
    // first call.
    wait_until("two passes cut inside ListVolumes", Duration::from_secs(30), async || {
        let cut = r.attacher.logs().matches("ListVolumes pass did not finish within --timeout").count();
        (cut >= 2, cut)
    })
    .await;
    let logs = r.attacher.logs();
    assert!(!logs.contains("ListVolumes failed"), "a deadline inside the call is the pass's timeout:\n{logs}");
    assert_eq!(r.publishes(), 1, "nothing acted on");
}

/// The driver restarts under another name: the attacher's Lease, finalizer
/// and objects belong to the first name, so the process exits 1 saying why
/// (it used to log a warning and go on serving the new driver as the old).
#[tokio::test]
async fn a_driver_back_under_another_name_stops_the_process() {
    let mut r = Reconciled::start("recren", &[]).await;
    let old = r.driver_name.clone();
    let renamed = format!("renamed-{old}");
    r.driver.stop();
    r.driver = FaultDriver::start(
        &r.socket,
        Transport::Grpc,
        Script { name: renamed.clone(), controller: true, publish: true, ..Script::default() },
    );
    // The 1 s reconciler's next ListVolumes reconnects.
    let status = wait_until("the attacher to exit", Duration::from_secs(30), async || {
        let s = r.attacher.try_exit();
        (s.is_some(), s)
    })
    .await
    .expect("exited");
    let logs = r.attacher.logs();
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(logs.contains("changed its name") && logs.contains(&renamed) && logs.contains(&old), "{logs}");
}
