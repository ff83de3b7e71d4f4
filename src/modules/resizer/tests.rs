//! What the resize and modify syncs file in `/debug/objects`.

use super::*;

const KIND: &str = "PersistentVolumeClaim";
use crate::{
    debug::{Registry, WaitingFor},
    k8s::queue::Outcome,
    modules::testing::{answering_client, cache_of, failing_client, reconciled},
};

const DRIVER: &str = "driver";

/// A resizer over hand-filled caches, a driver that is never dialled,
/// events sent nowhere and the apiserver `client`.
fn resizer(client: Client, claims: &[serde_json::Value], pvs: &[serde_json::Value], modifies: bool) -> Resizer {
    let csi = Connection::new("unix:///nonexistent/csi.sock").expect("address");
    resizer_with(client, csi, claims, pvs, modifies.then(Cache::default))
}

/// A resizer over hand-filled caches (`vacs`: the modify controller runs),
/// the driver at `csi`, events sent nowhere and the apiserver `client`.
fn resizer_with(
    client: Client,
    csi: Connection,
    claims: &[serde_json::Value],
    pvs: &[serde_json::Value],
    vacs: Option<Cache<VolumeAttributesClass>>,
) -> Resizer {
    use crate::csi::proto::csi::v1::plugin_capability::service::Type as Svc;
    let cfg: ResizerFlags = argh::FromArgs::from_args(&["resizer"], &[]).expect("default flags");
    let rpcs = [Rpc::ExpandVolume, Rpc::ModifyVolume];
    Resizer {
        gates: cfg.validate().expect("gates"),
        expander: Expander::Csi,
        csi,
        events: Recorder::new(failing_client(), "test", "test", "", &CancellationToken::new()),
        client,
        claims: cache_of(claims),
        pvs: cache_of(pvs),
        pods: None,
        final_errors: Mutex::default(),
        slow: SlowSet::default(),
        in_use_errors: feed::InUseErrors::default(),
        modify: vacs.map(|vacs| ModifyState { vacs, uncertain: Mutex::default(), slow: SlowSet::default() }),
        own_writes: OwnWrites::default(),
        driver: Arc::new(DriverInfo::with_capabilities(DRIVER, &[Svc::ControllerService], &rpcs)),
        cfg,
    }
}

fn claim() -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": "data", "namespace": "ns", "uid": "uid-1", "resourceVersion": "5",
                     "annotations": {"volume.kubernetes.io/storage-provisioner": DRIVER}},
        "spec": {"volumeName": "pv-1", "volumeAttributesClassName": "gold",
                 "resources": {"requests": {"storage": "2Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}},
    })
}

fn pv() -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": "pv-1"},
        "spec": {"csi": {"driver": DRIVER, "volumeHandle": "vol-1"}, "capacity": {"storage": "1Gi"},
                 "accessModes": ["ReadWriteOnce"], "claimRef": {"namespace": "ns", "name": "data", "uid": "uid-1"}},
    })
}

/// A claim asking for a class that does not exist is done (pending, as
/// upstream) but waits for the class; while its pending mark cannot be
/// written it is retried, still waiting for the class.
#[tokio::test]
async fn a_modification_to_a_missing_class_waits_for_the_class() {
    let ledger = Registry::default().ledger(NAME);
    let written = answering_client(200, claim());
    let r = resizer(written, &[claim()], &[pv()], true);
    let (outcome, entry) =
        reconciled(&ledger, KIND, "ns/data", r.sync_modify(ClaimKey::namespaced("ns", "data"))).await;
    assert_eq!(outcome, Outcome::Done);
    let entry = entry.expect("done, yet waiting");
    assert_eq!((entry.waiting_for, entry.attempts), (WaitingFor::Class, 0));
    assert_eq!(entry.last_error.as_deref(), Some("VAC \"gold\" does not exist."), "the Warning event's text");

    let ledger = Registry::default().ledger(NAME);
    let r = resizer(failing_client(), &[claim()], &[pv()], true);
    let (outcome, entry) =
        reconciled(&ledger, KIND, "ns/data", r.sync_modify(ClaimKey::namespaced("ns", "data"))).await;
    assert_eq!(outcome, Outcome::Retry);
    assert_eq!(entry.map(|e| e.waiting_for), Some(WaitingFor::Class));
}

/// A claim of the driver asking for more while its PV is not cached waits
/// for the PV; a claim that is gone files nothing.
#[tokio::test]
async fn a_resize_without_its_pv_waits_for_it() {
    let ledger = Registry::default().ledger(NAME);
    let r = resizer(failing_client(), &[claim()], &[], false);
    let (outcome, entry) = reconciled(&ledger, KIND, "ns/data", r.sync(ClaimKey::namespaced("ns", "data"))).await;
    assert_eq!(outcome, Outcome::Retry);
    let entry = entry.expect("filed");
    assert_eq!(entry.waiting_for, WaitingFor::Dependent);
    assert!(entry.last_error.as_deref().is_some_and(|e| e.contains("pv-1")), "{entry:?}");
    let r = resizer(failing_client(), &[], &[], false);
    let (outcome, entry) = reconciled(&ledger, KIND, "ns/data", r.sync(ClaimKey::namespaced("ns", "data"))).await;
    assert_eq!((outcome, entry.is_none()), (Outcome::Done, true), "gone: the entry goes");
}

mod stale_copy;
