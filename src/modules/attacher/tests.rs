//! The VolumeAttachment handler: what each change puts on which queue.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use super::*;

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
    assert_eq!(q.pv.take_ready().await, vec!["pv-1".to_string()], "the PV is synced again");
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
    assert_eq!(q.attach.take_ready().await, vec!["va-1".to_string()]);
    let mut deleting = va("va-1", "pv-1");
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    q.va_changed(&Change::Updated { old: &new, new: &deleting }, FIN, &forced);
    assert_eq!(q.detach.take_ready().await, vec!["va-1".to_string()]);
    assert!(q.attach.take_ready().await.is_empty() && q.pv.take_ready().await.is_empty());
    // Our own write (a resourceVersion only): nothing.
    let mut ours = new.clone();
    ours.metadata.resource_version = Some("2".into());
    q.va_changed(&Change::Updated { old: &new, new: &ours }, FIN, &forced);
    q.va_changed(&Change::Resync(&ours), FIN, &forced);
    assert_eq!(q.attach.take_ready().await, vec!["va-1".to_string()], "only the resync queues it");
}
