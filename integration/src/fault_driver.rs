//! An in-process CSI driver that misbehaves on purpose, for what a real
//! driver cannot be made to show: Probe not ready, Probe slower than the
//! timeout, errors, a socket that accepts and never answers, garbage bytes.
//!
//! It serves the Identity and Controller services, counts connections and
//! calls so tests can prove that csi-sidecar shares one connection and one
//! Probe, and records every ControllerPublish/ControllerUnpublish with its
//! start, end and outcome so tests can find calls on one (volume, node) that
//! overlapped ([`FaultDriver::overlaps`]); ControllerExpandVolume calls are
//! recorded the same way with their requested size ([`FaultDriver::expand_calls`]).
//! CreateSnapshot, DeleteSnapshot and ListSnapshots keep a backend of
//! snapshots ([`FaultDriver::snapshots`], idempotent by name) and record every
//! call with its secrets and parameters ([`FaultDriver::snapshot_calls`]).
//! The GroupController service (with `Script::group_snapshots`) keeps group
//! snapshots the same way ([`FaultDriver::groups`], [`FaultDriver::group_calls`]);
//! without it every group call answers `Unimplemented`.
//! GetCapacity answers per topology segment, less what the created volumes
//! in that segment take, with an optional maximum volume size and garbage
//! on demand ([`Script::capacity`]).
//! Volume health, in the v1.12 form (conditions in `ListVolumes` and
//! `ControllerGetVolume`) and the v1.13 one (`ControllerListVolumeHealth`,
//! `ControllerGetVolumeHealth`), is in [`health`]: [`Script::health`] and
//! [`FaultDriver::set_volume_health`].

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use std::collections::BTreeMap;

use csi_sidecar::csi::proto::csi::v1::{
    self as csi, GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, ProbeRequest, ProbeResponse,
    controller_server::Controller,
    group_controller_server::{GroupController, GroupControllerServer},
    identity_server::{Identity, IdentityServer},
    node_server::{Node, NodeServer},
};
use tokio::{io::AsyncWriteExt, net::UnixListener};
use tokio_stream::{StreamExt, wrappers::UnixListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

pub mod health;

pub use health::{HealthBook, HealthForms};

/// What `Probe` answers.
#[derive(Clone, Debug, PartialEq)]
pub enum ProbeAnswer {
    /// `ready: true`.
    Ready,
    /// `ready: false`.
    NotReady,
    /// `ready` absent (means ready).
    Absent,
    /// A gRPC error.
    Fail(Code, String),
}

/// The driver's scripted behaviour; change it while it runs.
#[derive(Clone, Debug)]
pub struct Script {
    /// `GetPluginInfo.name` (may be empty to test validation).
    pub name: String,
    /// `Probe` answer.
    pub probe: ProbeAnswer,
    /// Delay before answering `Probe`.
    pub probe_delay: Duration,
    /// `GetPluginInfo` fails with this while set.
    pub plugin_info_error: Option<(Code, String)>,
    /// Advertise the controller service with CREATE_DELETE_VOLUME.
    pub controller: bool,
    /// Delay before `CreateVolume` creates the volume and answers (the
    /// volume is created even if the caller gave up meanwhile, like a real
    /// backend).
    pub create_delay: Duration,
    /// `CreateVolume` fails with this (before creating anything) while set.
    pub create_error: Option<(Code, String)>,
    /// `CreateVolume` answers `required_bytes` minus this (a volume smaller
    /// than asked: an answer the provisioner cannot use).
    pub create_shortfall: i64,
    /// `DeleteVolume` fails with this (deleting nothing) while set.
    pub delete_error: Option<(Code, String)>,
    /// Advertise PUBLISH_UNPUBLISH_VOLUME (with `controller`).
    pub publish: bool,
    /// Advertise VOLUME_ACCESSIBILITY_CONSTRAINTS (topology).
    pub topology: bool,
    /// Delay of `ControllerPublishVolume`.
    pub publish_delay: Duration,
    /// Delay of `ControllerUnpublishVolume`.
    pub unpublish_delay: Duration,
    /// `ControllerUnpublishVolume` fails with this (after its delay) while set.
    pub unpublish_error: Option<(Code, String)>,
    /// Advertise PUBLISH_READONLY (with `publish`).
    pub publish_readonly: bool,
    /// `CreateVolume` and `DeleteVolume` fail with `Unauthenticated`
    /// unless their secrets hold this key and value (a backend that needs
    /// credentials for both).
    pub required_secret: Option<(String, String)>,
    /// `ControllerPublishVolume` fails with this (after its delay) while set.
    pub publish_error: Option<(Code, String)>,
    /// The publish context a successful `ControllerPublishVolume` answers
    /// (`None`: `device=/dev/fault`).
    pub publish_context: Option<BTreeMap<String, String>>,
    /// `ListVolumes` never ends: every page answers a new `next_token`.
    pub list_volumes_endless: bool,
    /// `NodeGetInfo` answers this node ID and accessible topology (the
    /// Node service's other calls answer `Unimplemented`); `None`: it
    /// answers `Unimplemented` too.
    pub node_info: Option<(String, BTreeMap<String, String>)>,
    /// The first this many `ControllerPublishVolume` calls of each
    /// (volume, node) fail with `Internal` (after the delay).
    pub publish_failures_per_pair: u32,
    /// Advertise EXPAND_VOLUME (with `controller`).
    pub expand: bool,
    /// Delay of `ControllerExpandVolume`.
    pub expand_delay: Duration,
    /// `ControllerExpandVolume` fails with this (after its delay) while set.
    pub expand_error: Option<(Code, String)>,
    /// `ControllerExpandVolume` above this many bytes fails with `OutOfRange`.
    pub expand_limit: Option<i64>,
    /// `ControllerExpandVolume` answers `required_bytes` minus this (a
    /// driver that gives less than asked).
    pub expand_shortfall: i64,
    /// `ControllerExpandVolume` answers `node_expansion_required`.
    pub node_expansion_required: bool,
    /// Advertise MODIFY_VOLUME (with `controller`).
    pub modify: bool,
    /// `ControllerModifyVolume` fails with this while set.
    pub modify_error: Option<(Code, String)>,
    /// `ControllerModifyVolume` does not answer while set (a slow backend
    /// the test releases).
    pub modify_hold: bool,
    /// Advertise CREATE_DELETE_SNAPSHOT (with `controller`).
    pub snapshots: bool,
    /// Advertise LIST_SNAPSHOTS (with `snapshots`).
    pub list_snapshots: bool,
    /// Delay of `CreateSnapshot` (the snapshot is made even if the caller
    /// gave up meanwhile).
    pub create_snapshot_delay: Duration,
    /// `CreateSnapshot` fails with this (before creating anything) while set.
    pub create_snapshot_error: Option<(Code, String)>,
    /// `CreateSnapshot` answers without a snapshot (nonsense) while set.
    pub create_snapshot_empty: bool,
    /// `CreateSnapshot` answers `ready_to_use: false` while set.
    pub snapshot_not_ready: bool,
    /// `DeleteSnapshot` fails with this while set.
    pub delete_snapshot_error: Option<(Code, String)>,
    /// `ListSnapshots` fails with this while set.
    pub list_snapshots_error: Option<(Code, String)>,
    /// Advertise CLONE_VOLUME (with `controller`); a created volume's
    /// answer echoes the request's `volume_content_source`.
    pub clone: bool,
    /// Advertise CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT and serve the
    /// group calls (else they answer `Unimplemented`).
    pub group_snapshots: bool,
    /// `CreateVolumeGroupSnapshot` fails with this while set.
    pub create_group_snapshot_error: Option<(Code, String)>,
    /// Advertise GET_CAPACITY (with `controller`). `GetCapacity` answers
    /// per segment ([`segment_key`] of `accessible_topology`): the
    /// segment's total from `capacity_segments`, else `capacity_total`,
    /// minus the bytes of the volumes created in it (`CreateVolume` puts a
    /// volume in the first preferred, else requisite, segment and answers
    /// it as the volume's accessible topology, with `topology`); a segment
    /// with neither fails with NotFound.
    pub capacity: bool,
    /// The total of a segment not in `capacity_segments`.
    pub capacity_total: Option<i64>,
    /// Totals by [`segment_key`].
    pub capacity_segments: BTreeMap<String, i64>,
    /// `maximum_volume_size` of every answer.
    pub capacity_maximum: Option<i64>,
    /// Garbage: `available_capacity` is this instead (e.g. negative).
    pub capacity_garbage: Option<i64>,
    /// The volume-health forms advertised and served (none by default).
    pub health: HealthForms,
}

/// A segment as `k=v,k2=v2`, keys sorted (`""`: no topology).
pub fn segment_key<'a>(segment: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    let sorted: BTreeMap<&String, &String> = segment.into_iter().collect();
    sorted.into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

impl Default for Script {
    fn default() -> Self {
        Script {
            name: "fault.csi.example.com".into(),
            probe: ProbeAnswer::Ready,
            probe_delay: Duration::ZERO,
            plugin_info_error: None,
            controller: false,
            create_delay: Duration::ZERO,
            create_error: None,
            create_shortfall: 0,
            delete_error: None,
            publish: false,
            topology: false,
            publish_delay: Duration::ZERO,
            unpublish_delay: Duration::ZERO,
            unpublish_error: None,
            list_volumes_endless: false,
            node_info: None,
            publish_readonly: false,
            required_secret: None,
            publish_error: None,
            publish_context: None,
            publish_failures_per_pair: 0,
            expand: false,
            expand_delay: Duration::ZERO,
            expand_error: None,
            expand_limit: None,
            expand_shortfall: 0,
            node_expansion_required: false,
            modify: false,
            modify_error: None,
            modify_hold: false,
            snapshots: false,
            list_snapshots: true,
            create_snapshot_delay: Duration::ZERO,
            create_snapshot_error: None,
            create_snapshot_empty: false,
            snapshot_not_ready: false,
            delete_snapshot_error: None,
            list_snapshots_error: None,
            clone: false,
            group_snapshots: false,
            create_group_snapshot_error: None,
            capacity: false,
            capacity_total: None,
            capacity_segments: BTreeMap::new(),
            capacity_maximum: None,
            capacity_garbage: None,
            health: HealthForms::NONE,
        }
    }
}

/// How the socket behaves at the transport level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A proper gRPC server.
    Grpc,
    /// Accepts connections and never reads or answers.
    Silent,
    /// Writes garbage bytes on every connection and closes it.
    Garbage,
}

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
    running: BTreeMap<(String, String), usize>,
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
    /// `ControllerModifyVolume` (`node_id` empty; parameters in [`FaultDriver::modify_parameters`]).
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
type CallLog = Arc<Mutex<Vec<ControllerCall>>>;

/// Records a call on creation and its end when finished or dropped.
struct CallRecord {
    log: CallLog,
    index: usize,
    outcome: Option<CallOutcome>,
}

impl CallRecord {
    fn begin(log: &CallLog, kind: CallKind, volume_id: &str, node_id: &str, bytes: i64) -> CallRecord {
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

    fn finish<T>(mut self, result: Result<T, Status>) -> Result<T, Status> {
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

#[derive(Clone)]
struct Service {
    groups: Groups,
    group_log: Arc<Mutex<Vec<GroupCall>>>,
    snapshots: Snapshots,
    snapshot_log: Arc<Mutex<Vec<SnapshotCall>>>,
    script: Arc<Mutex<Script>>,
    counters: Arc<Counters>,
    volumes: Volumes,
    published: Published,
    publish_log: Arc<Mutex<PublishLog>>,
    calls: CallLog,
    modify_log: ModifyLog,
    allocations: Allocations,
    health: HealthBook,
}

/// The `mutable_parameters` of every ControllerModifyVolume call.
type ModifyLog = Arc<Mutex<Vec<BTreeMap<String, String>>>>;

impl Service {
    fn script(&self) -> Script {
        self.script.lock().expect("script lock").clone()
    }

    async fn publish(
        &self,
        req: csi::ControllerPublishVolumeRequest,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let pair = (req.volume_id.clone(), req.node_id.clone());
        let attempt = {
            let mut log = self.publish_log.lock().expect("publish log");
            let running = log.running.entry(pair.clone()).or_default();
            *running += 1;
            let concurrent = *running > 1;
            log.calls.push(PublishCall {
                volume_id: req.volume_id.clone(),
                node_id: req.node_id.clone(),
                readonly: req.readonly,
                volume_context: req.volume_context.clone().into_iter().collect(),
                concurrent,
            });
            log.calls.iter().filter(|c| c.volume_id == pair.0 && c.node_id == pair.1).count()
        };
        // Counted as running until it returns, also when the caller gives up.
        let log = self.publish_log.clone();
        let _done = scopeguard(move || {
            let mut log = log.lock().expect("publish log");
            if let Some(n) = log.running.get_mut(&pair) {
                *n -= 1;
            }
        });
        let s = self.script();
        tokio::time::sleep(s.publish_delay).await;
        if let Some((code, msg)) = s.publish_error {
            return Err(Status::new(code, msg));
        }
        if attempt <= s.publish_failures_per_pair as usize {
            return Err(Status::internal(format!("injected failure of publish attempt {attempt}")));
        }
        let mut published = self.published.lock().expect("published");
        let nodes = published.entry(req.volume_id).or_default();
        if !nodes.contains(&req.node_id) {
            nodes.push(req.node_id);
        }
        let publish_context = match s.publish_context {
            Some(c) => c.into_iter().collect(),
            None => [("device".to_string(), "/dev/fault".to_string())].into(),
        };
        Ok(Response::new(csi::ControllerPublishVolumeResponse { publish_context }))
    }

    async fn unpublish(
        &self,
        req: csi::ControllerUnpublishVolumeRequest,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let s = self.script();
        tokio::time::sleep(s.unpublish_delay).await;
        match s.unpublish_error {
            Some((code, msg)) => Err(Status::new(code, msg)),
            None => {
                if let Some(nodes) = self.published.lock().expect("published").get_mut(&req.volume_id) {
                    nodes.retain(|n| *n != req.node_id);
                }
                Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
            }
        }
    }
}

#[tonic::async_trait]
impl Identity for Service {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        self.counters.plugin_infos.fetch_add(1, Ordering::SeqCst);
        let s = self.script();
        if let Some((code, msg)) = s.plugin_info_error {
            return Err(Status::new(code, msg));
        }
        Ok(Response::new(GetPluginInfoResponse {
            name: s.name,
            vendor_version: "0.0.1-fault".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{Service as Svc, Type, service::Type as SvcType};
        let s = self.script();
        let service = |t: SvcType| csi::PluginCapability { r#type: Some(Type::Service(Svc { r#type: t as i32 })) };
        let mut capabilities = Vec::new();
        if s.controller {
            capabilities.push(service(SvcType::ControllerService));
        }
        if s.topology {
            capabilities.push(service(SvcType::VolumeAccessibilityConstraints));
        }
        Ok(Response::new(GetPluginCapabilitiesResponse { capabilities }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.counters.probes.fetch_add(1, Ordering::SeqCst);
        let s = self.script();
        tokio::time::sleep(s.probe_delay).await;
        match s.probe {
            ProbeAnswer::Ready => Ok(Response::new(ProbeResponse { ready: Some(true) })),
            ProbeAnswer::NotReady => Ok(Response::new(ProbeResponse { ready: Some(false) })),
            ProbeAnswer::Absent => Ok(Response::new(ProbeResponse { ready: None })),
            ProbeAnswer::Fail(code, msg) => Err(Status::new(code, msg)),
        }
    }
}

#[tonic::async_trait]
impl Controller for Service {
    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use csi::controller_service_capability::{Rpc, Type, rpc::Type as RpcType};
        let mut rpcs = vec![RpcType::CreateDeleteVolume];
        // The legacy VOLUME_CONDITION has no name in v1.13: raw values.
        let mut raw = Vec::new();
        let s = self.script();
        if s.publish {
            rpcs.extend([RpcType::PublishUnpublishVolume, RpcType::ListVolumes, RpcType::ListVolumesPublishedNodes]);
            if s.publish_readonly {
                rpcs.push(RpcType::PublishReadonly);
            }
        }
        if s.expand {
            rpcs.push(RpcType::ExpandVolume);
        }
        if s.modify {
            rpcs.push(RpcType::ModifyVolume);
        }
        if s.snapshots {
            rpcs.push(RpcType::CreateDeleteSnapshot);
            if s.list_snapshots {
                rpcs.push(RpcType::ListSnapshots);
            }
        }
        if s.clone {
            rpcs.push(RpcType::CloneVolume);
        }
        if s.capacity {
            rpcs.push(RpcType::GetCapacity);
        }
        raw.extend(rpcs.into_iter().map(|r| r as i32));
        s.health.add_capabilities(&mut raw);
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: raw
                .into_iter()
                .map(|r| csi::ControllerServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: r })) })
                .collect(),
        }))
    }

    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.counters.creates.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let s = self.script();
        if let Some((code, msg)) = s.create_error {
            return Err(Status::new(code, msg));
        }
        check_secret(&s, &req.secrets)?;
        // The backend finishes the operation even if the caller gives up
        // (tonic drops this handler when the client cancels).
        let (volumes, name, delay) = (self.volumes.clone(), req.name.clone(), s.create_delay);
        let id = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let id = format!("fault-{name}");
            volumes.lock().expect("volumes").entry(name).or_insert(id).clone()
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        let bytes = req.capacity_range.map_or(0, |c| c.required_bytes);
        let content_source = req.volume_content_source;
        let segment = req.accessibility_requirements.as_ref().and_then(|r| r.preferred.first().or(r.requisite.first()));
        let accessible_topology = segment.filter(|_| s.topology).cloned().into_iter().collect();
        let key = segment.map(|t| segment_key(&t.segments)).unwrap_or_default();
        self.allocations.lock().expect("allocations").entry(id.clone()).or_insert((key, bytes));
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                volume_id: id,
                capacity_bytes: bytes - s.create_shortfall,
                content_source,
                accessible_topology,
                ..Default::default()
            }),
        }))
    }

    async fn controller_publish_volume(
        &self,
        req: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        self.counters.publishes.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let record = CallRecord::begin(&self.calls, CallKind::Publish, &req.volume_id, &req.node_id, 0);
        let result = self.publish(req).await;
        record.finish(result)
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.counters.unpublishes.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let record = CallRecord::begin(&self.calls, CallKind::Unpublish, &req.volume_id, &req.node_id, 0);
        let result = self.unpublish(req).await;
        record.finish(result)
    }

    async fn controller_expand_volume(
        &self,
        req: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let req = req.into_inner();
        let bytes = req.capacity_range.map_or(0, |c| c.required_bytes);
        let record = CallRecord::begin(&self.calls, CallKind::Expand, &req.volume_id, "", bytes);
        let s = self.script();
        tokio::time::sleep(s.expand_delay).await;
        let result = match (&s.expand_error, s.expand_limit) {
            (Some((code, msg)), _) => Err(Status::new(*code, msg.clone())),
            (None, Some(limit)) if bytes > limit => {
                Err(Status::out_of_range(format!("{bytes} bytes exceed the backend's limit of {limit}")))
            }
            _ => Ok(Response::new(csi::ControllerExpandVolumeResponse {
                capacity_bytes: bytes - s.expand_shortfall,
                node_expansion_required: s.node_expansion_required,
            })),
        };
        record.finish(result)
    }

    async fn controller_modify_volume(
        &self,
        req: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        let req = req.into_inner();
        let record = CallRecord::begin(&self.calls, CallKind::Modify, &req.volume_id, "", 0);
        self.modify_log.lock().expect("modify log").push(req.mutable_parameters.clone().into_iter().collect());
        while self.script().modify_hold {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let result = match self.script().modify_error {
            Some((code, msg)) => Err(Status::new(code, msg)),
            None => Ok(Response::new(csi::ControllerModifyVolumeResponse {})),
        };
        record.finish(result)
    }

    // ListVolumes and ControllerGetVolume: `health::ControllerWithLegacy`.

    async fn controller_list_volume_health(
        &self,
        req: Request<csi::ControllerListVolumeHealthRequest>,
    ) -> Result<Response<csi::ControllerListVolumeHealthResponse>, Status> {
        self.list_volume_health(req.into_inner()).map(Response::new)
    }

    async fn controller_get_volume_health(
        &self,
        req: Request<csi::ControllerGetVolumeHealthRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeHealthResponse>, Status> {
        self.get_volume_health(req.into_inner()).map(Response::new)
    }

    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.do_create_snapshot(req.into_inner()).await
    }

    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let req = req.into_inner();
        self.log_snapshot_call(SnapshotMethod::Delete, &req.snapshot_id, &req.secrets, &Default::default());
        let s = self.script();
        if let Some((code, msg)) = s.delete_snapshot_error {
            return Err(Status::new(code, msg));
        }
        check_secret(&s, &req.secrets)?;
        self.snapshots.lock().expect("snapshots").retain(|_, (id, _)| *id != req.snapshot_id);
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let req = req.into_inner();
        self.log_snapshot_call(SnapshotMethod::List, &req.snapshot_id, &req.secrets, &Default::default());
        let s = self.script();
        if let Some((code, msg)) = s.list_snapshots_error {
            return Err(Status::new(code, msg));
        }
        let mut found: Vec<(String, String)> = self
            .snapshots
            .lock()
            .expect("snapshots")
            .values()
            .filter(|(id, _)| req.snapshot_id.is_empty() || *id == req.snapshot_id)
            .cloned()
            .collect();
        // Members of group snapshots are snapshots too.
        found.extend(
            self.groups
                .lock()
                .expect("groups")
                .values()
                .flat_map(|(_, members)| members.iter())
                .filter(|(id, _)| req.snapshot_id.is_empty() || *id == req.snapshot_id)
                .cloned(),
        );
        Ok(Response::new(csi::ListSnapshotsResponse {
            entries: found
                .iter()
                .map(|(id, src)| csi::list_snapshots_response::Entry { snapshot: Some(self.snapshot(id, src, true)) })
                .collect(),
            next_token: String::new(),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.counters.deletes.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let s = self.script();
        if let Some((code, msg)) = s.delete_error {
            return Err(Status::new(code, msg));
        }
        check_secret(&s, &req.secrets)?;
        let id = req.volume_id;
        self.volumes.lock().expect("volumes").retain(|_, v| *v != id);
        self.allocations.lock().expect("allocations").remove(&id);
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn get_capacity(
        &self,
        req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        self.counters.get_capacities.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let s = self.script();
        let key = req.accessible_topology.as_ref().map(|t| segment_key(&t.segments)).unwrap_or_default();
        let Some(total) = s.capacity_segments.get(&key).copied().or(s.capacity_total) else {
            return Err(Status::not_found(format!("unknown topology segment {key:?}")));
        };
        let used: i64 =
            self.allocations.lock().expect("allocations").values().filter(|(k, _)| *k == key).map(|(_, b)| b).sum();
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: s.capacity_garbage.unwrap_or(total - used),
            maximum_volume_size: s.capacity_maximum,
            minimum_volume_size: None,
        }))
    }
}

impl Service {
    fn log_snapshot_call(
        &self,
        method: SnapshotMethod,
        target: &str,
        secrets: &std::collections::HashMap<String, String>,
        parameters: &std::collections::HashMap<String, String>,
    ) {
        self.snapshot_log.lock().expect("snapshot log").push(SnapshotCall {
            method,
            target: target.to_string(),
            secrets: secrets.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            parameters: parameters.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            at: Instant::now(),
        });
    }

    fn snapshot(&self, id: &str, source: &str, ready: bool) -> csi::Snapshot {
        csi::Snapshot {
            size_bytes: 1 << 20,
            snapshot_id: id.to_string(),
            source_volume_id: source.to_string(),
            creation_time: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 123_456_789 }),
            ready_to_use: ready,
            group_snapshot_id: String::new(),
            accessible_topology: Vec::new(),
        }
    }

    async fn do_create_snapshot(
        &self,
        req: csi::CreateSnapshotRequest,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.log_snapshot_call(SnapshotMethod::Create, &req.name, &req.secrets, &req.parameters);
        let s = self.script();
        if let Some((code, msg)) = s.create_snapshot_error {
            return Err(Status::new(code, msg));
        }
        check_secret(&s, &req.secrets)?;
        let (snapshots, name, source, delay) =
            (self.snapshots.clone(), req.name.clone(), req.source_volume_id.clone(), s.create_snapshot_delay);
        let (id, source) = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let id = format!("fault-snap-{name}");
            snapshots.lock().expect("snapshots").entry(name).or_insert((id, source)).clone()
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        if s.create_snapshot_empty {
            return Ok(Response::new(csi::CreateSnapshotResponse { snapshot: None }));
        }
        Ok(Response::new(csi::CreateSnapshotResponse {
            snapshot: Some(self.snapshot(&id, &source, !s.snapshot_not_ready)),
        }))
    }
}

#[tonic::async_trait]
impl GroupController for Service {
    async fn group_controller_get_capabilities(
        &self,
        _: Request<csi::GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::GroupControllerGetCapabilitiesResponse>, Status> {
        use csi::group_controller_service_capability::{Rpc, Type, rpc::Type as RpcType};
        if !self.script().group_snapshots {
            return Err(Status::unimplemented("unknown service csi.v1.GroupController"));
        }
        let rpc = Rpc { r#type: RpcType::CreateDeleteGetVolumeGroupSnapshot as i32 };
        Ok(Response::new(csi::GroupControllerGetCapabilitiesResponse {
            capabilities: vec![csi::GroupControllerServiceCapability { r#type: Some(Type::Rpc(rpc)) }],
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        req: Request<csi::CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::CreateVolumeGroupSnapshotResponse>, Status> {
        let req = req.into_inner();
        self.log_group_call(GroupMethod::Create, &req.name, &req.source_volume_ids, &req.secrets, &req.parameters);
        let s = self.script();
        if !s.group_snapshots {
            return Err(Status::unimplemented("unknown service csi.v1.GroupController"));
        }
        if let Some((code, msg)) = s.create_group_snapshot_error {
            return Err(Status::new(code, msg));
        }
        check_secret(&s, &req.secrets)?;
        let (id, members) = self
            .groups
            .lock()
            .expect("groups")
            .entry(req.name.clone())
            .or_insert_with(|| {
                let members = req
                    .source_volume_ids
                    .iter()
                    .map(|v| (format!("fault-gsnap-{}-{v}", req.name), v.clone()))
                    .collect();
                (format!("fault-group-{}", req.name), members)
            })
            .clone();
        Ok(Response::new(csi::CreateVolumeGroupSnapshotResponse { group_snapshot: Some(self.group(&id, &members)) }))
    }

    async fn delete_volume_group_snapshot(
        &self,
        req: Request<csi::DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::DeleteVolumeGroupSnapshotResponse>, Status> {
        let req = req.into_inner();
        let no = Default::default();
        self.log_group_call(GroupMethod::Delete, &req.group_snapshot_id, &req.snapshot_ids, &req.secrets, &no);
        let s = self.script();
        if !s.group_snapshots {
            return Err(Status::unimplemented("unknown service csi.v1.GroupController"));
        }
        check_secret(&s, &req.secrets)?;
        self.groups.lock().expect("groups").retain(|_, (id, _)| *id != req.group_snapshot_id);
        Ok(Response::new(csi::DeleteVolumeGroupSnapshotResponse {}))
    }

    async fn get_volume_group_snapshot(
        &self,
        req: Request<csi::GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::GetVolumeGroupSnapshotResponse>, Status> {
        let req = req.into_inner();
        let no = Default::default();
        self.log_group_call(GroupMethod::Get, &req.group_snapshot_id, &req.snapshot_ids, &req.secrets, &no);
        if !self.script().group_snapshots {
            return Err(Status::unimplemented("unknown service csi.v1.GroupController"));
        }
        let found = self.groups.lock().expect("groups").values().find(|(id, _)| *id == req.group_snapshot_id).cloned();
        match found {
            Some((id, members)) => Ok(Response::new(csi::GetVolumeGroupSnapshotResponse {
                group_snapshot: Some(self.group(&id, &members)),
            })),
            None => Err(Status::not_found(format!("no group snapshot {}", req.group_snapshot_id))),
        }
    }
}

impl Service {
    fn log_group_call(
        &self,
        method: GroupMethod,
        target: &str,
        ids: &[String],
        secrets: &std::collections::HashMap<String, String>,
        parameters: &std::collections::HashMap<String, String>,
    ) {
        self.group_log.lock().expect("group log").push(GroupCall {
            method,
            target: target.to_string(),
            ids: ids.to_vec(),
            secrets: secrets.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            parameters: parameters.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        });
    }

    fn group(&self, id: &str, members: &[(String, String)]) -> csi::VolumeGroupSnapshot {
        csi::VolumeGroupSnapshot {
            group_snapshot_id: id.to_string(),
            snapshots: members
                .iter()
                .map(|(sid, vol)| csi::Snapshot { group_snapshot_id: id.to_string(), ..self.snapshot(sid, vol, true) })
                .collect(),
            creation_time: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 }),
            ready_to_use: true,
        }
    }
}

fn check_secret(s: &Script, secrets: &std::collections::HashMap<String, String>) -> Result<(), Status> {
    match &s.required_secret {
        Some((k, v)) if secrets.get(k) != Some(v) => {
            Err(Status::unauthenticated(format!("secret {k} missing or wrong")))
        }
        _ => Ok(()),
    }
}

/// A running fault driver; stopped (and its socket removed) on drop.
pub struct FaultDriver {
    socket: PathBuf,
    script: Arc<Mutex<Script>>,
    /// Counters.
    pub counters: Arc<Counters>,
    /// The volumes that exist in the backend.
    pub volumes: Volumes,
    /// Where volumes are published.
    pub published: Published,
    /// Every publish call.
    pub publish_log: Arc<Mutex<PublishLog>>,
    calls: CallLog,
    modify_log: ModifyLog,
    /// The snapshots that exist in the backend.
    pub snapshots: Snapshots,
    snapshot_log: Arc<Mutex<Vec<SnapshotCall>>>,
    /// The group snapshots that exist in the backend.
    pub groups: Groups,
    group_log: Arc<Mutex<Vec<GroupCall>>>,
    /// Bytes of the created volumes by segment.
    pub allocations: Allocations,
    /// The conditions set by [`FaultDriver::set_volume_health`].
    pub health: HealthBook,
    stop: CancellationToken,
}

/// Runs `f` when dropped.
struct Guard<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for Guard<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

fn scopeguard<F: FnOnce()>(f: F) -> Guard<F> {
    Guard(Some(f))
}

#[tonic::async_trait]
impl Node for Service {
    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        match self.script().node_info {
            Some((node_id, segments)) => Ok(Response::new(csi::NodeGetInfoResponse {
                node_id,
                accessible_topology: Some(csi::Topology { segments: segments.into_iter().collect() }),
                ..Default::default()
            })),
            None => Err(Status::unimplemented("the fault driver has no node service in this script")),
        }
    }
}

impl FaultDriver {
    /// Listens on `socket` (replacing a stale one).
    pub fn start(socket: &Path, transport: Transport, script: Script) -> FaultDriver {
        Self::start_with(socket, transport, script, Arc::default())
    }

    /// Like [`FaultDriver::start`], over an existing backend: a driver
    /// process restart that keeps its storage.
    pub fn start_with(socket: &Path, transport: Transport, script: Script, volumes: Volumes) -> FaultDriver {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).expect("bind fault driver socket");
        let script = Arc::new(Mutex::new(script));
        let counters = Arc::new(Counters::default());
        let stop = CancellationToken::new();
        let published: Published = Arc::default();
        let publish_log: Arc<Mutex<PublishLog>> = Arc::default();
        let calls: CallLog = Arc::default();
        let modify_log: ModifyLog = Arc::default();
        let snapshots: Snapshots = Arc::default();
        let snapshot_log: Arc<Mutex<Vec<SnapshotCall>>> = Arc::default();
        let groups: Groups = Arc::default();
        let group_log: Arc<Mutex<Vec<GroupCall>>> = Arc::default();
        let allocations: Allocations = Arc::default();
        let health: HealthBook = Arc::default();
        let svc = Service {
            health: health.clone(),
            allocations: allocations.clone(),
            groups: groups.clone(),
            group_log: group_log.clone(),
            snapshots: snapshots.clone(),
            snapshot_log: snapshot_log.clone(),
            modify_log: modify_log.clone(),
            script: script.clone(),
            counters: counters.clone(),
            volumes: volumes.clone(),
            published: published.clone(),
            publish_log: publish_log.clone(),
            calls: calls.clone(),
        };
        let (stop2, counters2) = (stop.clone(), counters.clone());
        tokio::spawn(async move {
            let mut held = Vec::new();
            let incoming = UnixListenerStream::new(listener).map(move |c| {
                counters2.connections.fetch_add(1, Ordering::SeqCst);
                c
            });
            match transport {
                Transport::Grpc => {
                    let _ = tonic::transport::Server::builder()
                        .add_service(IdentityServer::new(svc.clone()))
                        .add_service(GroupControllerServer::new(svc.clone()))
                        .add_service(NodeServer::new(svc.clone()))
                        .add_service(health::ControllerWithLegacy::new(svc))
                        .serve_with_incoming_shutdown(incoming, stop2.cancelled_owned())
                        .await;
                }
                Transport::Silent | Transport::Garbage => {
                    tokio::pin!(incoming);
                    loop {
                        tokio::select! {
                            _ = stop2.cancelled() => break,
                            conn = incoming.next() => match conn {
                                Some(Ok(mut c)) if transport == Transport::Garbage => {
                                    let _ = c.write_all(b"\x00\xffHTTP/0.9 garbage \x13\x37 not a gRPC server\r\n\r\n").await;
                                    let _ = c.shutdown().await;
                                }
                                Some(Ok(c)) => held.push(c),
                                _ => break,
                            }
                        }
                    }
                }
            }
        });
        FaultDriver {
            socket: socket.to_path_buf(),
            script,
            counters,
            volumes,
            published,
            publish_log,
            calls,
            modify_log,
            snapshots,
            snapshot_log,
            groups,
            group_log,
            allocations,
            health,
            stop,
        }
    }

    /// Changes the script.
    pub fn update(&self, f: impl FnOnce(&mut Script)) {
        f(&mut self.script.lock().expect("script lock"));
    }

    /// `Probe` calls so far.
    pub fn probes(&self) -> u64 {
        self.counters.probes.load(Ordering::SeqCst)
    }

    /// Names of the volumes that exist in the backend.
    pub fn volume_names(&self) -> Vec<String> {
        self.volumes.lock().expect("volumes").keys().cloned().collect()
    }

    /// `GetCapacity` calls so far.
    pub fn get_capacities(&self) -> u64 {
        self.counters.get_capacities.load(Ordering::SeqCst)
    }

    /// `CreateVolume` calls so far.
    pub fn creates(&self) -> u64 {
        self.counters.creates.load(Ordering::SeqCst)
    }

    /// The publish calls so far.
    pub fn publish_calls(&self) -> Vec<PublishCall> {
        self.publish_log.lock().expect("publish log").calls.clone()
    }

    /// Every ControllerPublishVolume and ControllerUnpublishVolume call so
    /// far, in arrival order, with start, end and outcome.
    pub fn controller_calls(&self) -> Vec<ControllerCall> {
        self.calls.lock().expect("call log").clone()
    }

    /// The controller calls on one (volume, node), in arrival order.
    pub fn calls_for(&self, volume_id: &str, node_id: &str) -> Vec<ControllerCall> {
        let calls = self.calls.lock().expect("call log");
        calls.iter().filter(|c| c.volume_id == volume_id && c.node_id == node_id).cloned().collect()
    }

    /// The snapshot calls so far (with their secrets), in arrival order.
    pub fn snapshot_calls(&self) -> Vec<SnapshotCall> {
        self.snapshot_log.lock().expect("snapshot log").clone()
    }

    /// The snapshot calls of `method` so far.
    pub fn snapshot_calls_of(&self, method: SnapshotMethod) -> Vec<SnapshotCall> {
        self.snapshot_calls().into_iter().filter(|c| c.method == method).collect()
    }

    /// The group snapshot calls so far (with their secrets), in arrival order.
    pub fn group_calls(&self) -> Vec<GroupCall> {
        self.group_log.lock().expect("group log").clone()
    }

    /// The group calls of `method` so far.
    pub fn group_calls_of(&self, method: GroupMethod) -> Vec<GroupCall> {
        self.group_calls().into_iter().filter(|c| c.method == method).collect()
    }

    /// The ControllerExpandVolume calls so far, in arrival order.
    pub fn expand_calls(&self) -> Vec<ControllerCall> {
        let calls = self.calls.lock().expect("call log");
        calls.iter().filter(|c| c.kind == CallKind::Expand).cloned().collect()
    }

    /// The `mutable_parameters` of every ControllerModifyVolume call so far.
    pub fn modify_parameters(&self) -> Vec<BTreeMap<String, String>> {
        self.modify_log.lock().expect("modify log").clone()
    }

    /// Pairs of calls on one (volume, node) that ran at the same time.
    pub fn overlaps(&self) -> Vec<(ControllerCall, ControllerCall)> {
        overlapping_calls(&self.controller_calls())
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.counters.connections.load(Ordering::SeqCst)
    }
}

impl FaultDriver {
    /// Stops serving and removes the socket now (a driver process exiting),
    /// so another driver can take the socket while this value lives on.
    pub fn stop(&self) {
        if !self.stop.is_cancelled() {
            self.stop.cancel();
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

impl Drop for FaultDriver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a fault-driver test needs around the driver: a namespace on the
/// shared control plane, a fresh driver name and a directory for the sockets
/// and logs.
pub struct FaultEnv {
    /// Sockets and logs.
    pub dir: tempfile::TempDir,
    /// `<unique>.fault.example.com`.
    pub driver_name: String,
    /// The test's namespace (deleted on drop).
    pub ns: crate::kube_support::TestNamespace,
    /// The admin kubeconfig of the control plane the sidecars talk to.
    pub kubeconfig: PathBuf,
}

impl FaultEnv {
    /// A namespace and a driver name, both from `prefix`, on the shared control plane.
    pub async fn new(prefix: &str) -> FaultEnv {
        Self::on(crate::cluster::ControlPlane::shared(), prefix).await
    }

    /// Like [`FaultEnv::new`], on the control plane `cp` (e.g. a dedicated one
    /// a test restarts components of).
    pub async fn on(cp: &crate::cluster::ControlPlane, prefix: &str) -> FaultEnv {
        let ns = crate::kube_support::TestNamespace::new(&cp.client().await, prefix).await;
        let driver_name = format!("{}.fault.example.com", crate::kube_support::unique_name(prefix));
        FaultEnv { dir: tempfile::tempdir().expect("tempdir"), driver_name, ns, kubeconfig: cp.kubeconfig().into() }
    }

    /// The driver's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("csi.sock")
    }

    /// A script for this driver name with the controller service.
    pub fn script(&self) -> Script {
        Script { name: self.driver_name.clone(), controller: true, ..Script::default() }
    }

    /// Starts csi-sidecar (`program`: the binary or an upstream-named
    /// symlink) on the driver's socket and the env's control plane, with
    /// `args` after those two flags.
    pub fn sidecar(&self, name: &str, program: &Path, args: &[&str]) -> crate::process::Proc {
        self.sidecar_env(name, program, args, &[])
    }

    /// Like [`FaultEnv::sidecar`], with environment variables.
    pub fn sidecar_env(&self, name: &str, program: &Path, args: &[&str], env: &[(&str, &str)]) -> crate::process::Proc {
        let mut all = vec![
            format!("--csi-address={}", self.socket().display()),
            format!("--kubeconfig={}", self.kubeconfig.display()),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let env: Vec<(&str, Option<&str>)> = env.iter().map(|(k, v)| (*k, Some(*v))).collect();
        crate::process::Proc::spawn_env(name, program, &all, &env, self.dir.path())
    }

    /// Starts the driver (gRPC, `script`) and csi-sidecar running the
    /// provisioner and `module` at `-v=5` with retries from 200 ms to 2 s,
    /// `args` after those.
    pub fn start_with_provisioner(
        &self,
        module: &str,
        script: Script,
        args: &[&str],
    ) -> (FaultDriver, crate::process::Proc) {
        let driver = FaultDriver::start(&self.socket(), Transport::Grpc, script);
        let mut all = vec!["-v=5", "provisioner", module, "--retry-interval-start=200ms", "--retry-interval-max=2s"];
        all.extend(args);
        (driver, self.sidecar("csi-sidecar", &crate::sidecar_bin(), &all))
    }

    /// Creates a StorageClass of the driver named `name` scoped to the
    /// namespace (after `edit`); its name.
    pub async fn storage_class(
        &self,
        name: &str,
        edit: impl FnOnce(&mut k8s_openapi::api::storage::v1::StorageClass),
    ) -> String {
        let mut sc = crate::kube_support::storage_class(&self.ns.scoped(name), &self.driver_name);
        edit(&mut sc);
        crate::kube_support::create(&kube::Api::all(self.ns.client().clone()), &sc).await;
        sc.metadata.name.unwrap_or_default()
    }

    /// Creates the 1Mi claim `name` of class `sc` and waits up to `timeout`
    /// for it to be Bound; its PV's name.
    pub async fn bound_claim(&self, name: &str, sc: &str, timeout: Duration) -> String {
        let pvcs: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = self.ns.api();
        crate::kube_support::create(&pvcs, &crate::kube_support::pvc(name, Some(sc), "1Mi")).await;
        let c = crate::kube_support::wait_for(&pvcs, name, timeout, |c| {
            c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
        })
        .await;
        c.spec.and_then(|s| s.volume_name).expect("volumeName")
    }
}

/// Implements `Deref<Target = FaultEnv>` for a test's environment struct
/// that keeps its [`FaultEnv`] in the field `base`.
#[macro_export]
macro_rules! deref_fault_env {
    ($ty:ty) => {
        impl ::std::ops::Deref for $ty {
            type Target = $crate::fault_driver::FaultEnv;
            fn deref(&self) -> &$crate::fault_driver::FaultEnv {
                &self.base
            }
        }
    };
}

#[cfg(test)]
mod tests {
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
