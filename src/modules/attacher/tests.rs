//! The VolumeAttachment handler (what each change puts on which queue) and
//! what the syncs file in `/debug/objects`.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use super::*;
use crate::{
    k8s::queue::Outcome,
    modules::testing::{cache_of, failing_client, reconciled},
};

const KIND_VA: &str = "VolumeAttachment";
const KIND_PV: &str = "PersistentVolume";

const FIN: &str = "external-attacher/driver";

fn va(name: &str, pv: &str) -> CachedVa {
    let mut va = CachedVa::default();
    va.metadata.name = Some(name.into());
    va.metadata.finalizers = Some(vec![FIN.into()]);
    va.spec.node_name = "node".into();
    va.spec.source.persistent_volume_name = Some(pv.into());
    va
}

fn queues() -> Queues {
    let backoff = Backoff { start: Duration::from_millis(1), max: Duration::from_millis(10) };
    let attach = WorkQueue::new("test-attach", backoff);
    Queues { detach: attach.sibling("test-detach"), pv: WorkQueue::new("test-pv", backoff), attach }
}

/// A PV deleted while attached keeps its finalizer only as long as an
/// attachment references it: the attachment's deletion queues the PV (as
/// upstream's handler does), whatever the order of the detach's own re-queue
/// and the watch's delivery of the deletion.
#[tokio::test]
async fn a_deleted_attachment_queues_its_pv_and_is_forgotten() {
    let q = queues();
    let forced = Forced::default();
    forced.lock().insert("va-1".into());
    let mut gone = va("va-1", "pv-1");
    gone.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    gone.metadata.finalizers = None;
    q.va_changed(&Change::Deleted(&gone), FIN, &forced);
    assert_eq!(q.pv.take_ready().await, vec![PvKey::named("pv-1")], "the PV is synced again");
    assert!(q.attach.take_ready().await.is_empty() && q.detach.take_ready().await.is_empty());
    assert!(forced.lock().is_empty(), "a deleted attachment is no longer forced");

    // An inline volume has no PV to sync.
    let mut inline = va("va-2", "");
    inline.spec.source.persistent_volume_name = None;
    q.va_changed(&Change::Deleted(&inline), FIN, &forced);
    assert!(q.pv.take_ready().await.is_empty());
}

#[tokio::test]
async fn other_changes_queue_the_attachment_by_its_state() {
    let q = queues();
    let forced = Forced::default();
    let new = va("va-1", "pv-1");
    q.va_changed(&Change::Added(&new), FIN, &forced);
    assert_eq!(q.attach.take_ready().await, vec![VaKey::named("va-1")]);
    let mut deleting = va("va-1", "pv-1");
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    q.va_changed(&Change::Updated { old: &new, new: &deleting }, FIN, &forced);
    assert_eq!(q.detach.take_ready().await, vec![VaKey::named("va-1")]);
    assert!(q.attach.take_ready().await.is_empty() && q.pv.take_ready().await.is_empty());
    // Our own write (a resourceVersion only): nothing.
    let mut ours = new.clone();
    ours.metadata.resource_version = Some("2".into());
    q.va_changed(&Change::Updated { old: &new, new: &ours }, FIN, &forced);
    q.va_changed(&Change::Resync(&ours), FIN, &forced);
    assert_eq!(q.attach.take_ready().await, vec![VaKey::named("va-1")], "only the resync queues it");
}

/// An attacher over hand-filled caches, with a driver that is never
/// dialled and an apiserver that fails every write.
fn attacher(vas: &[serde_json::Value], pvs: &[serde_json::Value]) -> Attacher {
    use crate::csi::proto::csi::v1::plugin_capability::service::Type as Svc;
    let vas = cache_of::<CachedVa>(vas);
    vas.add_index(crate::modules::views::VA_BY_PV, CachedVa::pv_name);
    let backoff = Backoff { start: Duration::from_millis(1), max: Duration::from_millis(10) };
    Attacher {
        cfg: argh::FromArgs::from_args(&["attacher"], &[]).expect("default flags"),
        gates: config::Gates { error_code: true },
        driver: Arc::new(DriverInfo::with_capabilities(
            "driver",
            &[Svc::ControllerService],
            &[Rpc::PublishUnpublishVolume],
        )),
        handler: Handler::Csi,
        finalizer: FIN.into(),
        csi: Connection::new("unix:///nonexistent/csi.sock").expect("address"),
        client: failing_client(),
        vas,
        pvs: cache_of::<CachedPv>(pvs),
        csinodes: Cache::default(),
        forced: Forced::default(),
        settling: settling::Settling::new(true),
        pv_queue: WorkQueue::new("test-pv", backoff),
    }
}

fn va_json(deleting: bool) -> serde_json::Value {
    let mut va = serde_json::json!({
        "metadata": {"name": "va-1", "finalizers": [FIN]},
        "spec": {"attacher": "driver", "nodeName": "node", "source": {"persistentVolumeName": "pv-1"}},
    });
    if deleting {
        va["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
    }
    va
}

fn pv_json(deleting: bool) -> serde_json::Value {
    let mut pv = serde_json::json!({
        "metadata": {"name": "pv-1", "finalizers": [FIN]},
        "spec": {"accessModes": ["ReadWriteOnce"], "csi": {"driver": "driver", "volumeHandle": "vol-1"}},
    });
    if deleting {
        pv["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
    }
    pv
}

/// An attachment whose node has no CSINode waits for the node, with the
/// error written into its status as its last error.
#[tokio::test]
async fn an_attach_without_the_nodes_csinode_waits_for_the_node() {
    let a = attacher(&[va_json(false)], &[pv_json(false)]);
    let ledger = crate::debug::Registry::default().ledger(NAME);
    let (outcome, entry) = reconciled(&ledger, KIND_VA, "va-1", a.sync(VaKey::named("va-1"))).await;
    assert_eq!(outcome, Outcome::Retry);
    let entry = entry.expect("the attachment is filed");
    assert_eq!(entry.waiting_for, crate::debug::WaitingFor::Node);
    assert_eq!(entry.last_error.as_deref(), Some("csinode.storage.k8s.io \"node\" not found"));
}

/// A deleted PV still attached is done for now but waits for its
/// attachment; once that is gone, the failing finalizer write waits for
/// the apiserver; a sync of a PV that is gone files nothing.
#[tokio::test]
async fn a_deleted_pv_waits_for_its_attachment_then_for_the_apiserver() {
    use crate::debug::WaitingFor;
    let ledger = crate::debug::Registry::default().ledger(NAME);
    let a = attacher(&[va_json(false)], &[pv_json(true)]);
    let (outcome, entry) = reconciled(&ledger, KIND_PV, "pv-1", a.sync_pv(PvKey::named("pv-1"))).await;
    assert_eq!(outcome, Outcome::Done);
    assert_eq!(entry.map(|e| e.waiting_for), Some(WaitingFor::Dependent), "done, yet waiting");
    let a = attacher(&[], &[pv_json(true)]);
    let (outcome, entry) = reconciled(&ledger, KIND_PV, "pv-1", a.sync_pv(PvKey::named("pv-1"))).await;
    assert_eq!(outcome, Outcome::Retry);
    assert_eq!(entry.map(|e| e.waiting_for), Some(WaitingFor::ApiServer));
    let a = attacher(&[], &[]);
    let (outcome, entry) = reconciled(&ledger, KIND_PV, "pv-1", a.sync_pv(PvKey::named("pv-1"))).await;
    assert_eq!(outcome, Outcome::Done);
    assert!(entry.is_none(), "a PV that is gone leaves the ledger");
}

/// An attachment being deleted loses its attach queue's entry (what the
/// attach waited for no longer matters); once gone, every queue's entry
/// goes at once (it may wait for nothing that will come).
#[tokio::test]
async fn a_deleted_attachment_leaves_the_ledger() {
    use crate::debug::WaitingFor;
    let ledger = crate::debug::Registry::default().ledger(NAME);
    let backoff = Backoff { start: Duration::from_millis(1), max: Duration::from_millis(10) };
    let attach = WorkQueue::new("test-attach", backoff).tracked(&ledger, KIND_VA);
    let q = Queues {
        detach: attach.sibling("test-detach").tracked(&ledger, KIND_VA),
        pv: WorkQueue::new("test-pv", backoff),
        attach,
    };
    let file = |queue: &'static str, w: WaitingFor| {
        let scope = ledger.scope(queue, KIND_VA, "va-1".into());
        let filed = scope.clone();
        async move {
            filed.run(async { crate::debug::waiting_for(w) }).await;
            scope.finish(crate::debug::Finish::Again { delay: Duration::from_secs(1), attempts: 1 });
        }
    };
    let queues = || ledger.entries().into_iter().map(|(_, e)| (e.queue, e.waiting_for)).collect::<Vec<_>>();
    file("test-attach", WaitingFor::Node).await;
    // The deletion starts: the attach's wait is over, the detach's begins.
    let live = va("va-1", "pv-1");
    let mut deleting = live.clone();
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    q.va_changed(&Change::Updated { old: &live, new: &deleting }, FIN, &Forced::default());
    assert!(queues().is_empty(), "{:?}", queues());
    file("test-detach", WaitingFor::Driver).await;
    assert_eq!(queues(), [("test-detach", WaitingFor::Driver)]);
    q.va_changed(&Change::Deleted(&deleting), FIN, &Forced::default());
    assert!(ledger.is_empty(), "{:?}", queues());
}
