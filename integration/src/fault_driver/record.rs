//! What the driver keeps and records: counters, the backend, and every call
//! with its arguments, start, end and outcome.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, atomic::AtomicU64},
    time::Instant,
};

use tonic::{Code, Status};

/// Call and connection counters.
#[derive(Default, Debug)]
pub struct Counters {
    /// Accepted connections.
    pub connections: AtomicU64,
    /// `Probe` calls.
    pub probes: AtomicU64,
    /// `GetPluginInfo` calls.
    pub plugin_infos: AtomicU64,
    /// `CreateVolume` calls.
    pub creates: AtomicU64,
    /// `DeleteVolume` calls.
    pub deletes: AtomicU64,
    /// `ControllerPublishVolume` calls.
    pub publishes: AtomicU64,
    /// `ControllerUnpublishVolume` calls.
    pub unpublishes: AtomicU64,
    /// `GetCapacity` calls.
    pub get_capacities: AtomicU64,
    /// `ListVolumes` calls.
    pub list_volumes: AtomicU64,
    /// `ControllerGetVolume` calls.
    pub controller_get_volumes: AtomicU64,
    /// `ControllerListVolumeHealth` calls.
    pub list_volume_healths: AtomicU64,
    /// `ControllerGetVolumeHealth` calls.
    pub get_volume_healths: AtomicU64,
}

/// Bytes allocated by created volumes: volume id → (segment key, bytes).
pub type Allocations = Arc<Mutex<BTreeMap<String, (String, i64)>>>;

/// The backend: volumes by name (`CreateVolume` is idempotent by name).
pub type Volumes = Arc<Mutex<BTreeMap<String, String>>>;

/// The backend's snapshots: by name, (snapshot id, source volume id).
pub type Snapshots = Arc<Mutex<BTreeMap<String, (String, String)>>>;

/// The backend's group snapshots: by name, (group id, [(snapshot id, source volume id)]).
pub type Groups = Arc<Mutex<BTreeMap<String, (String, Vec<(String, String)>)>>>;

/// Which group call a [`GroupCall`] was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupMethod {
    /// `CreateVolumeGroupSnapshot` (`target` = the name, `ids` = the source volumes).
    Create,
    /// `DeleteVolumeGroupSnapshot` (`target` = the group id, `ids` = the snapshot ids).
    Delete,
    /// `GetVolumeGroupSnapshot` (`target` = the group id, `ids` = the snapshot ids).
    Get,
}

/// One group call as received.
#[derive(Clone, Debug)]
pub struct GroupCall {
    /// The method.
    pub method: GroupMethod,
    /// Name (create) or group snapshot id.
    pub target: String,
    /// Source volume ids (create) or snapshot ids.
    pub ids: Vec<String>,
    /// `secrets`.
    pub secrets: BTreeMap<String, String>,
    /// `parameters` (create).
    pub parameters: BTreeMap<String, String>,
}

/// Which snapshot call a [`SnapshotCall`] was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotMethod {
    /// `CreateSnapshot` (`target` = the name).
    Create,
    /// `DeleteSnapshot` (`target` = the snapshot id).
    Delete,
    /// `ListSnapshots` (`target` = the snapshot id asked about).
    List,
}

/// One snapshot call as received, with its secrets (tests check that the
/// secret reached the driver) and parameters.
#[derive(Clone, Debug)]
pub struct SnapshotCall {
    /// The method.
    pub method: SnapshotMethod,
    /// Name (create) or snapshot id (delete, list).
    pub target: String,
    /// `secrets`.
    pub secrets: BTreeMap<String, String>,
    /// `parameters` (create).
    pub parameters: BTreeMap<String, String>,
    /// Arrival.
    pub at: Instant,
}

/// Where each volume ID is published (ControllerPublish adds the node).
pub type Published = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

/// One `ControllerPublishVolume` call, as received.
#[derive(Clone, Debug)]
pub struct PublishCall {
    /// `volume_id`.
    pub volume_id: String,
    /// `node_id`.
    pub node_id: String,
    /// `readonly`.
    pub readonly: bool,
    /// `volume_context`.
    pub volume_context: BTreeMap<String, String>,
    /// Another publish of the same volume to the same node was still running
    /// when this one arrived (what two leaders at once would do).
    pub concurrent: bool,
}

/// Every `ControllerPublishVolume` call, in arrival order, and the
/// (volume, node) pairs being published right now.
#[derive(Default)]
pub struct PublishLog {
    /// The calls.
    pub calls: Vec<PublishCall>,
    pub(super) running: BTreeMap<(String, String), usize>,
}

/// Which controller call a [`ControllerCall`] was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// `ControllerPublishVolume`.
    Publish,
    /// `ControllerUnpublishVolume`.
    Unpublish,
    /// `ControllerExpandVolume` (`node_id` empty, `bytes` the required size).
    Expand,
    /// `ControllerModifyVolume` (`node_id` empty; parameters in [`FaultDriver::modify_parameters`](super::FaultDriver::modify_parameters)).
    Modify,
}

/// How a [`ControllerCall`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// Answered with success.
    Ok,
    /// Answered with this gRPC error.
    Failed(Code),
    /// The caller went away before the answer (the handler was dropped).
    Cancelled,
}

/// One `ControllerPublishVolume` or `ControllerUnpublishVolume` call: when it
/// arrived, when it ended (None: still running) and how.
#[derive(Clone, Debug)]
pub struct ControllerCall {
    /// Publish or unpublish.
    pub kind: CallKind,
    /// `volume_id`.
    pub volume_id: String,
    /// `node_id`.
    pub node_id: String,
    /// Expand: `capacity_range.required_bytes` (0 for the others).
    pub bytes: i64,
    /// Arrival.
    pub start: Instant,
    /// End (answer or cancellation); None while running.
    pub end: Option<Instant>,
    /// None while running.
    pub outcome: Option<CallOutcome>,
}

impl ControllerCall {
    /// Whether this call and `other` were running at the same time on the same
    /// (volume, node).
    pub fn overlaps(&self, other: &ControllerCall) -> bool {
        let same_key = self.volume_id == other.volume_id && self.node_id == other.node_id;
        let before = |a: &ControllerCall, b: &ControllerCall| a.end.is_some_and(|end| end <= b.start);
        same_key && !before(self, other) && !before(other, self)
    }
}

/// Every pair of calls on one (volume, node) that ran at the same time
/// (publish/publish, publish/unpublish, unpublish/unpublish), in arrival order.
pub fn overlapping_calls(calls: &[ControllerCall]) -> Vec<(ControllerCall, ControllerCall)> {
    let mut by_key: BTreeMap<(&str, &str), Vec<&ControllerCall>> = BTreeMap::new();
    for c in calls {
        by_key.entry((c.volume_id.as_str(), c.node_id.as_str())).or_default().push(c);
    }
    let mut out = Vec::new();
    for list in by_key.values_mut() {
        list.sort_by_key(|c| c.start);
        for (i, a) in list.iter().enumerate() {
            out.extend(list[i + 1..].iter().filter(|b| a.overlaps(b)).map(|b| ((*a).clone(), (*b).clone())));
        }
    }
    out.sort_by_key(|(a, b)| (a.start, b.start));
    out
}

/// The controller-call record, shared by the handlers.
pub(super) type CallLog = Arc<Mutex<Vec<ControllerCall>>>;

/// Records a call on creation and its end when finished or dropped.
pub(super) struct CallRecord {
    log: CallLog,
    index: usize,
    outcome: Option<CallOutcome>,
}

impl CallRecord {
    pub(super) fn begin(log: &CallLog, kind: CallKind, volume_id: &str, node_id: &str, bytes: i64) -> CallRecord {
        let mut calls = log.lock().expect("call log");
        calls.push(ControllerCall {
            kind,
            volume_id: volume_id.to_string(),
            node_id: node_id.to_string(),
            bytes,
            start: Instant::now(),
            end: None,
            outcome: None,
        });
        CallRecord { log: log.clone(), index: calls.len() - 1, outcome: None }
    }

    pub(super) fn finish<T>(mut self, result: Result<T, Status>) -> Result<T, Status> {
        self.outcome = Some(match &result {
            Ok(_) => CallOutcome::Ok,
            Err(status) => CallOutcome::Failed(status.code()),
        });
        result
    }
}

impl Drop for CallRecord {
    fn drop(&mut self) {
        if let Ok(mut calls) = self.log.lock()
            && let Some(call) = calls.get_mut(self.index)
        {
            call.end = Some(Instant::now());
            call.outcome = Some(self.outcome.take().unwrap_or(CallOutcome::Cancelled));
        }
    }
}

/// The `mutable_parameters` of every ControllerModifyVolume call.
pub(super) type ModifyLog = Arc<Mutex<Vec<BTreeMap<String, String>>>>;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn call(kind: CallKind, volume: &str, start_ms: u64, end_ms: Option<u64>) -> ControllerCall {
        let t0 = *EPOCH;
        ControllerCall {
            kind,
            volume_id: volume.into(),
            node_id: "n".into(),
            bytes: 0,
            start: t0 + Duration::from_millis(start_ms),
            end: end_ms.map(|e| t0 + Duration::from_millis(e)),
            outcome: end_ms.map(|_| CallOutcome::Ok),
        }
    }

    static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

    #[test]
    fn calls_on_one_key_overlap_only_while_both_run() {
        use CallKind::{Publish, Unpublish};
        let calls = [
            call(Publish, "v1", 0, Some(10)),
            call(Unpublish, "v1", 10, Some(20)), // starts as the first ends: no overlap
            call(Publish, "v1", 15, Some(30)),   // overlaps the unpublish
            call(Publish, "v2", 15, Some(30)),   // another key
            call(Unpublish, "v2", 40, None),     // still running
            call(Unpublish, "v2", 50, Some(60)), // overlaps the running one
        ];
        let found: Vec<(CallKind, CallKind, String)> =
            overlapping_calls(&calls).into_iter().map(|(a, b)| (a.kind, b.kind, a.volume_id)).collect();
        assert_eq!(found, [(Unpublish, Publish, "v1".to_string()), (Unpublish, Unpublish, "v2".to_string())]);
    }
}
