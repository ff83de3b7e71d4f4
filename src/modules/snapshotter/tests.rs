//! What the content sync files in `/debug/objects`.

use super::*;
use crate::{
    debug::{Registry, WaitingFor},
    k8s::queue::Outcome,
    modules::testing::{cache_of, failing_client, reconciled},
};

const KIND_CONTENT: &str = "VolumeSnapshotContent";

/// A snapshotter over hand-filled caches, with a driver that is never
/// dialled and an apiserver that fails every request.
fn snapshotter(contents: &[serde_json::Value]) -> Snapshotter {
    let cfg: SnapshotterFlags = argh::FromArgs::from_args(&["snapshotter"], &[]).expect("default flags");
    Snapshotter {
        naming: Naming { prefix: cfg.snapshot_name_prefix.clone(), uuid_length: -1, extra_metadata: false },
        driver: Arc::new(DriverInfo::with_capabilities("driver", &[], &[Rpc::CreateDeleteSnapshot])),
        csi: Connection::new("unix:///nonexistent/csi.sock").expect("address"),
        client: failing_client(),
        events: Recorder::new(failing_client(), "test", "test", "", &CancellationToken::new()),
        contents: cache_of(contents),
        classes: Cache::default(),
        written: Written::default(),
        cfg,
    }
}

fn content(uid: Option<&str>) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": "snapcontent-1"},
        "spec": {"driver": "driver", "deletionPolicy": "Delete", "volumeSnapshotClassName": "gold",
                 "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": uid},
                 "source": {"volumeHandle": "vol-1"}},
    })
}

/// A dynamic content whose class is missing waits for the class, with the
/// creation-failed event's text as its last error; one that is gone files
/// nothing.
#[tokio::test]
async fn a_content_without_its_class_waits_for_the_class() {
    let ledger = Registry::default().ledger(NAME);
    let s = snapshotter(&[content(Some("uid-1"))]);
    let (outcome, entry) =
        reconciled(&ledger, KIND_CONTENT, "snapcontent-1", s.sync(ObjectKey::named("snapcontent-1"))).await;
    assert_eq!(outcome, Outcome::Retry);
    let entry = entry.expect("filed");
    assert_eq!(entry.waiting_for, WaitingFor::Class);
    let error = entry.last_error.unwrap_or_default();
    assert!(error.starts_with("Failed to create snapshot: ") && error.contains("gold"), "{error}");
    let s = snapshotter(&[]);
    let (outcome, entry) =
        reconciled(&ledger, KIND_CONTENT, "snapcontent-1", s.sync(ObjectKey::named("snapcontent-1"))).await;
    assert_eq!((outcome, entry.is_none()), (Outcome::Done, true));
}
