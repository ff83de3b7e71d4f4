//! provisioner: external-provisioner parity.
//!
//! PVCs whose provisioner annotation names the driver get a volume from
//! `CreateVolume` and a PV; Released PVs with reclaim `Delete` get
//! `DeleteVolume` and are removed. Clones and snapshot restores get their
//! source checked and protected by a finalizer first; the
//! cloning-protection controller and the snapshot-finalizer sweep release
//! those. Decisions are in [`decide`], [`sources`] and [`params`]; this file
//! does the I/O: views of the shared cache, three work queues (`claims`,
//! `volumes`, `cloning-protection`), live reads of data sources, CSI calls
//! through the shared connection, events, and the optional Lease.

pub mod capacity;
pub mod config;
pub mod decide;
pub mod infeasible;
pub mod node_deployment;
pub mod params;
pub mod sources;
pub mod topology;
pub mod vac;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use ::kube::core::PartialObjectMeta;
use ::kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::reflector::ObjectRef,
};
use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim},
    storage::v1::{CSINode, StorageClass, VolumeAttributesClass},
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    compat::{self, provisioner as up},
    csi::{
        Connection, DriverInfo,
        proto::csi::v1::{
            self as csi, controller_service_capability::rpc::Type as Rpc, plugin_capability::service::Type as Svc,
        },
    },
    kube::{
        KubeContext,
        cache::Cache,
        cached::{CachedPv, CachedPvc, CachedVa},
        events::{EventType, Recorder, reference},
        queue::{Backoff, Outcome, WorkQueue},
        reference_grant::ReferenceGrant,
        snapshot_api::{VolumeSnapshot, VolumeSnapshotContent},
    },
    modules::{ModuleContext, ModuleError},
};
use config::ProvisionerFlags;
use decide::{ClaimDecision, CreateFailure, Plan, PlanError, Settings, VolumeDecision};
use params::SecretRef;
use sources::{CloneProtection, PlanSource, SourceKind};

const NAME: &str = "provisioner";
/// How long a deleted backend volume is remembered (stale cache events of
/// its PV arrive within seconds).
const DELETED_MEMORY: std::time::Duration = std::time::Duration::from_secs(600);

/// A CreateVolume that may still be running in the driver: retried to a
/// final answer even if its PVC is deleted meanwhile (no leaked volume).
/// Keyed by the claim's UID: a claim deleted and re-created under the same
/// name is another claim, with its own plan.
#[derive(Clone)]
struct InFlight {
    /// `namespace/name` of the claim (its work-queue key).
    key: String,
    plan: Plan,
    /// The provisioner secret as resolved for the first attempt: the
    /// cleanup of an orphaned volume needs it after the claim, its
    /// namespace and the secret may be gone. Memory only, never logged.
    secrets: Secrets,
}

/// Secret data for a CSI call; `Debug` prints only the keys' count.
#[derive(Clone, Default)]
struct Secrets(HashMap<String, String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} secret keys>", self.0.len())
    }
}

/// UIDs remembered for [`DELETED_MEMORY`] (pruned on insert).
#[derive(Default)]
struct RecentUids(Mutex<HashMap<String, std::time::Instant>>);

impl RecentUids {
    fn contains(&self, uid: &str) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).contains_key(uid)
    }

    fn insert(&self, uid: &str) {
        let mut uids = self.0.lock().unwrap_or_else(|e| e.into_inner());
        uids.retain(|_, at| at.elapsed() < DELETED_MEMORY);
        uids.insert(uid.to_string(), std::time::Instant::now());
    }
}

struct Provisioner {
    cfg: ProvisionerFlags,
    settings: Settings,
    driver: Arc<DriverInfo>,
    identity: String,
    csi: Connection,
    client: Client,
    /// The library's events (`<driver>_<host>_<uuid>`).
    events: Recorder,
    /// The provisioner's own (`external-provisioner`).
    own_events: Recorder,
    pvcs: Cache<CachedPvc>,
    pvs: Cache<CachedPv>,
    classes: Cache<StorageClass>,
    attachments: Option<Cache<CachedVa>>,
    /// Node labels (metadata-only watch) and CSINodes, with a topology-aware driver.
    topology: Option<(Cache<PartialObjectMeta<Node>>, Cache<CSINode>)>,
    /// By claim UID.
    in_flight: Mutex<HashMap<String, InFlight>>,
    /// Claims whose CreateVolume was infeasible: not called again before
    /// `--retry-interval-max` unless their class changes (shared with the
    /// class handler, which re-queues them on a change).
    infeasible: Arc<Mutex<infeasible::Infeasible>>,
    /// UIDs of PVs whose backend volume this process deleted: a later sync
    /// of the same (deleting) PV only drops the finalizer.
    /// Entries expire after [`DELETED_MEMORY`].
    volume_deleted: RecentUids,
    /// UIDs of PVs whose finalizer this process removed: the cache may
    /// still show it for a moment, and patching again is a wasted request.
    /// Entries expire after [`DELETED_MEMORY`].
    finalizer_released: RecentUids,
    /// Feature gate `CrossNamespaceVolumeDataSource`.
    cross_namespace: bool,
    /// Claims (any driver) waiting for a volume from a clone or restore
    /// source, when a protection controller runs.
    waiting: Option<Cache<CachedPvc>>,
    /// Clone sources carrying the cloning-protection finalizer, and their
    /// queue (only with a driver that can clone).
    clone_protection: Option<(Cache<CachedPvc>, WorkQueue<String>)>,
    /// VolumeSnapshots carrying the provisioner's source finalizer (only
    /// with the snapshot API installed, a driver that can snapshot and a
    /// sweep interval).
    protected_snapshots: Option<Cache<VolumeSnapshot>>,
    /// `--node-deployment`: this node, from `$NODE_NAME` and `NodeGetInfo`.
    node: Option<node_deployment::NodeDeployment>,
    /// With `node`: whether requests carry the node's topology (the
    /// `Topology` gate and a topology-aware driver).
    node_topology: bool,
    /// With `node`: the Immediate claims this instance races for.
    races: node_deployment::Races,
    /// The `VolumeAttributesClass` gate in effect.
    vac_gate: bool,
    /// Capacity tracking (`--enable-capacity`), told about provisioning
    /// and deletion.
    capacity: Option<capacity::Handle>,
}

/// A clone's or restore's source as read for its checks.
enum ReadSource {
    Claim(Box<PersistentVolumeClaim>),
    Snapshot(Box<VolumeSnapshot>),
}

use crate::kube::error_text as api_error_text;

/// A random RFC 4122 version-4 UUID (upstream's `uuid.NewUUID()` in the
/// event component), from the standard library's random hasher keys.
fn random_uuid() -> String {
    use std::hash::{BuildHasher, Hasher};
    let word = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
        h.finish()
    };
    let (hi, lo) = (word(1), word(2));
    let hi = (hi & !0xf000) | 0x4000; // version 4
    let lo = (lo & !(0xc << 60)) | (0x8 << 60); // variant 10
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

fn claim_key(pvc: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!("{}/{}", pvc.namespace.as_deref().unwrap_or_default(), pvc.name.as_deref().unwrap_or_default())
}

/// `<unix millis>-<0..9999>-<driver>`, upstream's provisioner identity.
fn identity(driver: &str) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}-{}-{driver}", now.as_millis(), now.subsec_nanos() % 10_000)
}

fn status_text(s: &tonic::Status) -> String {
    compat::grpc_error_text(s)
}

/// A class's `allowedTopologies` as (key, values) terms.
fn allowed_terms(sc: &StorageClass) -> Vec<Vec<(String, Vec<String>)>> {
    sc.allowed_topologies
        .iter()
        .flatten()
        .map(|t| t.match_label_expressions.iter().flatten().map(|e| (e.key.clone(), e.values.clone())).collect())
        .collect()
}

impl Provisioner {
    fn claim(&self, key: &str) -> Option<PersistentVolumeClaim> {
        let (ns, name) = key.split_once('/')?;
        self.pvcs.get(&ObjectRef::new(name).within(ns)).map(|c| c.to_full())
    }

    fn event_pvc(&self, pvc: &PersistentVolumeClaim, kind: EventType, reason: &str, message: &str) {
        self.events.publish(reference(pvc), kind, reason, message);
    }

    async fn secret(&self, r: &SecretRef) -> Result<HashMap<String, String>, String> {
        crate::kube::secrets::secret_data(&self.client, &r.name, &r.namespace).await
    }

    /// Accessibility requirements for a topology-aware driver.
    fn accessibility(
        &self,
        pvc: &PersistentVolumeClaim,
        sc: &StorageClass,
    ) -> Result<Option<csi::TopologyRequirement>, topology::TopologyError> {
        if let Some(nd) = &self.node {
            if !self.node_topology {
                return Ok(None);
            }
            let allowed = topology::flatten_allowed(&allowed_terms(sc));
            let name = pvc.metadata.name.as_deref().unwrap_or_default();
            return nd.requirements(name, &allowed, self.cfg.strict_topology, self.cfg.immediate_topology);
        }
        let Some((nodes, csinodes)) = &self.topology else { return Ok(None) };
        let driver = self.driver.name.to_string();
        let labels = |n: &str| nodes.get(&ObjectRef::new(n)).map(|m| m.metadata.labels.clone().unwrap_or_default());
        let keys_of = |c: &CSINode| {
            c.spec.drivers.iter().find(|d| d.name == driver).map(|d| d.topology_keys.clone().unwrap_or_default())
        };
        let keys = |n: &str| csinodes.get(&ObjectRef::new(n)).map(|c| keys_of(&c).unwrap_or_default());
        let driver_nodes =
            csinodes.state().iter().filter(|c| keys_of(c).is_some()).filter_map(|c| c.metadata.name.clone()).collect();
        let view = topology::ClusterView { node_labels: &labels, node_keys: &keys, driver_nodes };
        let allowed = topology::flatten_allowed(&allowed_terms(sc));
        let selected = pvc.metadata.annotations.as_ref().and_then(|a| a.get(up::ANN_SELECTED_NODE)).map(String::as_str);
        let req = topology::Request {
            late_binding: sc.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"),
            selected_node: selected,
            strict: self.cfg.strict_topology,
            immediate_topology: self.cfg.immediate_topology,
            allowed: &allowed,
            pvc_name: pvc.metadata.name.as_deref().unwrap_or_default(),
        };
        topology::requirements(&req, &view)
    }

    async fn create_volume(&self, req: csi::CreateVolumeRequest) -> Result<csi::CreateVolumeResponse, tonic::Status> {
        self.csi.create_volume(self.cfg.timeout, req).await
    }

    async fn delete_volume(&self, volume_id: &str, secrets: HashMap<String, String>) -> Result<(), tonic::Status> {
        let req = csi::DeleteVolumeRequest { volume_id: volume_id.to_string(), secrets };
        self.csi.delete_volume(self.cfg.timeout, req).await.map(|_| ())
    }

    /// Handles one PVC key.
    async fn sync_claim(&self, key: String) -> Outcome {
        let pvc = self.claim(&key);
        let live_uid =
            pvc.as_ref().filter(|p| p.metadata.deletion_timestamp.is_none()).and_then(|p| p.metadata.uid.clone());
        // Uncertain creates of claims by this name that are no longer the
        // live claim (deleted, or deleted and re-created): finish them first.
        for (uid, f) in self.orphans_named(&key, live_uid.as_deref()) {
            if self.finish_orphaned(&uid, &f).await != Outcome::Done {
                return Outcome::Retry;
            }
        }
        self.infeasible.lock().unwrap_or_else(|e| e.into_inner()).forget_named(&key, live_uid.as_deref());
        let Some(pvc) = pvc.filter(|_| live_uid.is_some()) else {
            self.races.forget(&key);
            return Outcome::Done;
        };
        let in_flight =
            live_uid.as_ref().and_then(|u| self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).get(u).cloned());
        let class_name = pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
        let sc = self.classes.get(&ObjectRef::new(&class_name));
        let pv_name = self.pv_name_of(pvc.metadata.uid.as_deref().unwrap_or_default());
        let pv_exists = self.pvs.get(&ObjectRef::new(&pv_name)).is_some();
        match decide::decide_claim(&pvc, sc.as_deref(), &self.driver.name, pv_exists) {
            ClaimDecision::Ignore(why) => {
                tracing::trace!(claim = %key, why, "Nothing to do");
                Outcome::Done
            }
            ClaimDecision::WaitForScheduler => {
                tracing::debug!(claim = %key, "Waiting for the scheduler to select a node");
                Outcome::Done
            }
            ClaimDecision::Provision => match sc {
                Some(sc) => {
                    if in_flight.is_none()
                        && let Some(wait) = self.infeasible_wait(live_uid.as_deref().unwrap_or_default(), &sc)
                    {
                        tracing::debug!(claim = %key, retry_in = ?wait, "Infeasible CreateVolume: not retried yet (delay running, class unchanged)");
                        return Outcome::RetryAfter(wait);
                    }
                    if let Some(nd) = self.node.as_ref().filter(|_| in_flight.is_none()) {
                        let selected = pvc.metadata.annotations.as_ref().and_then(|a| a.get(up::ANN_SELECTED_NODE));
                        let immediate = node_deployment::immediate(&sc);
                        match node_deployment::ownership(
                            selected.map(String::as_str),
                            &nd.node,
                            immediate,
                            nd.immediate_binding,
                        ) {
                            node_deployment::Ownership::Ours => {}
                            node_deployment::Ownership::NotOurs => {
                                tracing::trace!(claim = %key, "Not this node's claim");
                                self.races.forget(&key);
                                return Outcome::Done;
                            }
                            node_deployment::Ownership::Race => {
                                // A class whose allowedTopologies exclude this node is not raced for.
                                if sc.allowed_topologies.as_ref().is_some_and(|t| !t.is_empty())
                                    && self.accessibility(&pvc, &sc).is_err()
                                {
                                    tracing::debug!(claim = %key, "The class's allowed topologies exclude this node");
                                    return Outcome::Done;
                                }
                                return self.race(&key, &pvc, &sc).await;
                            }
                        }
                    }
                    self.provision(&key, &pvc, &sc, in_flight).await
                }
                None => {
                    let msg = format!("storageclass.storage.k8s.io \"{class_name}\" not found");
                    self.event_pvc(&pvc, EventType::Warning, up::REASON_PROVISIONING_FAILED, &msg);
                    Outcome::Retry
                }
            },
        }
    }

    /// How long claim `uid` of class `sc` waits before CreateVolume after an
    /// infeasible one.
    fn infeasible_wait(&self, uid: &str, sc: &StorageClass) -> Option<std::time::Duration> {
        let class = sc.metadata.name.as_deref().unwrap_or_default();
        let version = sc.metadata.resource_version.as_deref().unwrap_or_default();
        self.infeasible.lock().unwrap_or_else(|e| e.into_inner()).wait(uid, class, version, std::time::Instant::now())
    }

    /// The plan of a new provisioning, with its data source checked and
    /// protected (upstream `prepareProvision`).
    async fn prepare(&self, pvc: &PersistentVolumeClaim, sc: &StorageClass) -> Result<Plan, PlanError> {
        let invalid = |e: String| PlanError::Invalid(e);
        let source = sources::data_source(pvc, self.cross_namespace).map_err(|e| invalid(e.to_string()))?;
        let claim_ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
        if let Some(src) = source.as_ref().filter(|s| s.namespace != claim_ns) {
            let api: Api<ReferenceGrant> = Api::namespaced(self.client.clone(), &src.namespace);
            let grants = api.list(&ListParams::default()).await.map_err(|e| {
                invalid(format!(
                    "error getting ReferenceGrants in {} namespace from api server: {}",
                    src.namespace,
                    api_error_text(&e)
                ))
            })?;
            sources::check_granted(pvc, src, &grants.items).map_err(|e| invalid(e.to_string()))?;
        }
        let mut plan = decide::plan(pvc, sc, &self.driver, &self.settings, source.as_ref())?;
        if let Some(class) = vac::class_name(pvc, self.vac_gate) {
            vac::check_driver(&self.driver).map_err(|e| PlanError::Capability(e.to_string()))?;
            let api: Api<VolumeAttributesClass> = Api::all(self.client.clone());
            let found = api.get(class).await.map_err(|e| invalid(api_error_text(&e)))?;
            plan.request.mutable_parameters =
                vac::mutable_parameters(&found, &self.driver.name).map_err(|e| invalid(e.to_string()))?;
        }
        if let Some(src) = plan.source.clone() {
            let kind = match src.kind {
                SourceKind::Clone => up::KIND_PVC,
                SourceKind::Snapshot => up::KIND_SNAPSHOT,
            };
            let content = match src.kind {
                SourceKind::Clone => self.clone_source(pvc, sc, &src).await,
                SourceKind::Snapshot => self.snapshot_source(pvc, sc, &src).await,
            };
            let (content, read) = content.map_err(|e| invalid(sources::handle_error(kind, &src.name, &e)))?;
            plan.request.volume_content_source = Some(content);
            self.protect_source(read).await.map_err(invalid)?;
        }
        Ok(plan)
    }

    /// The clone source's volume, checked (read live: bound claims and
    /// their PVs need not be in this provisioner's caches).
    async fn clone_source(
        &self,
        pvc: &PersistentVolumeClaim,
        sc: &StorageClass,
        src: &PlanSource,
    ) -> Result<(csi::VolumeContentSource, ReadSource), String> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &src.namespace);
        let source = claims.get(&src.name).await.map_err(|e| {
            let not_found = matches!(&e, ::kube::Error::Api(s) if s.code == 404);
            let claim_ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
            sources::source_claim_error(&src.name, claim_ns, not_found, &api_error_text(&e))
        })?;
        let volume = source.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty());
        let pv = match volume {
            None => None,
            Some(v) => match Api::<PersistentVolume>::all(self.client.clone()).get(&v).await {
                Ok(pv) => Some(pv),
                Err(e) => {
                    tracing::warn!(pv = %v, source = %src.key(), error = %e, "Cannot read the clone source's volume");
                    None
                }
            },
        };
        let content = sources::clone_source(pvc, &sc.provisioner, &source, pv.as_ref())?;
        Ok((content, ReadSource::Claim(Box::new(source))))
    }

    /// The snapshot's handle, checked (read live, as upstream).
    async fn snapshot_source(
        &self,
        pvc: &PersistentVolumeClaim,
        sc: &StorageClass,
        src: &PlanSource,
    ) -> Result<(csi::VolumeContentSource, ReadSource), String> {
        let snapshots: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &src.namespace);
        let snapshot = snapshots
            .get(&src.name)
            .await
            .map_err(|e| format!("error getting snapshot {} from api server: {}", src.name, api_error_text(&e)))?;
        sources::snapshot_usable(&snapshot)?;
        let content = match sources::bound_content_name(&snapshot) {
            None => None,
            Some(name) => match Api::<VolumeSnapshotContent>::all(self.client.clone()).get(name).await {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(content = %name, snapshot = %src.key(), error = %e, "Cannot read the snapshot's content");
                    None
                }
            },
        };
        let prevent = self.cfg.prevent_volume_mode_conversion;
        let handle = sources::snapshot_source(pvc, &sc.provisioner, &snapshot, content.as_ref(), prevent)?;
        Ok((handle, ReadSource::Snapshot(Box::new(snapshot))))
    }

    /// Puts the provisioner's finalizer on the source as read (nothing to
    /// write when it has it; a snapshot's tested patch re-reads on a change).
    async fn protect_source(&self, read: ReadSource) -> Result<(), String> {
        let result = match read {
            ReadSource::Claim(c) => {
                let ns = c.metadata.namespace.clone().unwrap_or_default();
                let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
                crate::kube::finalizers::add(&api, &*c, up::CLONE_FINALIZER).await
            }
            ReadSource::Snapshot(snap) => {
                let ns = snap.metadata.namespace.clone().unwrap_or_default();
                let api: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &ns);
                crate::kube::finalizers::add(&api, &*snap, up::SNAPSHOT_SOURCE_FINALIZER).await
            }
        };
        result.map_err(|e| api_error_text(&e))
    }

    /// The name of the PV of the claim with this UID.
    fn pv_name_of(&self, uid: &str) -> String {
        decide::volume_name(&self.cfg.volume_name_prefix, uid, self.cfg.volume_name_uuid_length).unwrap_or_default()
    }

    /// Drops the provisioner's finalizer from the snapshot the claim
    /// `restored` (a UID) got its volume from, unless another claim waiting
    /// for a volume or an unfinished create still restores from it; a
    /// failure, and a snapshot kept, are left to the sweep (or the release
    /// after the last restore).
    async fn release_snapshot(&self, src: &PlanSource, restored: &str) {
        let pending = self.waiting.as_ref().map(|w| w.state()).unwrap_or_default();
        let in_flight = self.in_flight_sources(SourceKind::Snapshot);
        let provisioned = |c: &CachedPvc| {
            let uid = c.metadata.uid.as_deref().unwrap_or_default();
            uid == restored || self.pvs.get(&ObjectRef::new(&self.pv_name_of(uid))).is_some()
        };
        let key = src.key();
        if let Some(why) = sources::snapshot_still_needed(&key, pending.iter().map(|c| &**c), &in_flight, provisioned) {
            tracing::debug!(snapshot = %key, why, "Snapshot source still needed");
            return;
        }
        let api: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &src.namespace);
        let result = match api.get(&src.name).await {
            Ok(snap) => crate::kube::finalizers::remove(&api, &snap, up::SNAPSHOT_SOURCE_FINALIZER).await,
            Err(::kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::warn!(snapshot = %src.key(), error = %e, "Failed to remove the snapshot finalizer; the sweep will");
        }
    }

    /// The `namespace/name` keys of the sources of `kind` of unfinished creates.
    fn in_flight_sources(&self, kind: SourceKind) -> Vec<String> {
        let in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        in_flight.values().filter_map(|f| f.plan.source.as_ref()).filter(|s| s.kind == kind).map(|s| s.key()).collect()
    }

    /// The cloning-protection controller: one source claim.
    async fn sync_clone_source(&self, key: String) -> Outcome {
        let Some((protected, _)) = &self.clone_protection else { return Outcome::Done };
        let Some((ns, name)) = key.split_once('/') else { return Outcome::Done };
        let Some(source) = protected.get(&ObjectRef::new(name).within(ns)) else { return Outcome::Done };
        let pending = self.waiting.as_ref().map(|w| w.state()).unwrap_or_default();
        let in_flight = self.in_flight_sources(SourceKind::Clone);
        tracing::trace!(source = %key, waiting = pending.len(), in_flight = in_flight.len(), "Checking a clone source");
        match sources::clone_protection(&source, pending.iter().map(|c| &**c), &in_flight) {
            CloneProtection::Nothing => Outcome::Done,
            CloneProtection::Wait(why) => {
                tracing::debug!(source = %key, why, "Clone source still needed");
                Outcome::Retry
            }
            CloneProtection::Release => {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
                match crate::kube::finalizers::remove(&api, &source.to_full(), up::CLONE_FINALIZER).await {
                    Ok(()) => {
                        tracing::info!(source = %key, "Removed the cloning-protection finalizer");
                        Outcome::Done
                    }
                    Err(e) => {
                        tracing::info!(source = %key, error = %e, "Failed to remove the clone finalizer");
                        Outcome::Retry
                    }
                }
            }
        }
    }

    /// One pass of the snapshot-finalizer sweep (upstream's
    /// SnapshotFinalizerProtection controller).
    async fn sweep_snapshots(&self) {
        let Some(snapshots) = &self.protected_snapshots else { return };
        let all = snapshots.state();
        let pending = self.waiting.as_ref().map(|w| w.state()).unwrap_or_default();
        let in_flight = self.in_flight_sources(SourceKind::Snapshot);
        let orphans = sources::orphaned_snapshots(all.iter().map(|s| &**s), pending.iter().map(|c| &**c), &in_flight);
        for key in orphans {
            let Some((ns, name)) = key.split_once('/') else { continue };
            let Some(snap) = snapshots.get(&ObjectRef::new(name).within(ns)) else { continue };
            let api: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), ns);
            match crate::kube::finalizers::remove(&api, &snap, up::SNAPSHOT_SOURCE_FINALIZER).await {
                Ok(()) => tracing::info!(snapshot = %key, "Removed an orphaned snapshot source finalizer"),
                Err(e) => {
                    tracing::warn!(snapshot = %key, error = %e, "Failed to remove an orphaned snapshot finalizer")
                }
            }
        }
    }

    /// In-flight creates of claims named `key` other than the live one.
    fn orphans_named(&self, key: &str, live_uid: Option<&str>) -> Vec<(String, InFlight)> {
        let in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        in_flight
            .iter()
            .filter(|(uid, f)| f.key == key && Some(uid.as_str()) != live_uid)
            .map(|(u, f)| (u.clone(), f.clone()))
            .collect()
    }

    async fn provision(
        &self,
        key: &str,
        pvc: &PersistentVolumeClaim,
        sc: &StorageClass,
        saved: Option<InFlight>,
    ) -> Outcome {
        let uid = pvc.metadata.uid.clone().unwrap_or_default();
        let class = sc.metadata.name.clone().unwrap_or_default();
        self.event_pvc(
            pvc,
            EventType::Normal,
            up::REASON_PROVISIONING,
            &format!("External provisioner is provisioning volume for claim \"{key}\""),
        );
        // As the provisioning library reports what `Provision` returns: the
        // error as it is, without a StorageClass prefix.
        let failed = |msg: String| {
            self.event_pvc(pvc, EventType::Warning, up::REASON_PROVISIONING_FAILED, &msg);
        };
        // CSI migration: a class of the in-tree plugin is provisioned with its
        // translation, and the PV is saved in the in-tree form.
        let translated = match decide::migrated_class(sc, &self.driver.name) {
            Ok(t) => t,
            Err(e) => {
                failed(e);
                return Outcome::Retry;
            }
        };
        let migrated = translated.is_some();
        let effective = translated.as_ref().unwrap_or(sc);
        let saved_secrets = saved.as_ref().map(|f| f.secrets.clone());
        let plan = match saved.map(|f| Ok(f.plan)) {
            Some(p) => p,
            None => self.prepare(pvc, effective).await,
        };
        let plan = match plan {
            Ok(p) => p,
            Err(PlanError::ExternalPopulator(kind)) => {
                tracing::info!(claim = %key, kind, "Data source left to an external populator");
                self.own_events.publish(
                    reference(pvc),
                    EventType::Normal,
                    up::REASON_PROVISIONING,
                    "Assuming an external populator will provision the volume",
                );
                return Outcome::Done;
            }
            Err(e) => {
                failed(e.to_string());
                return Outcome::Retry;
            }
        };
        let mut request = plan.request.clone();
        match self.accessibility(pvc, effective) {
            Ok(r) => request.accessibility_requirements = r,
            Err(topology::TopologyError::Reschedule(e)) => {
                // A missing node: upstream reports the lookup's error as it is.
                failed(e);
                unselect_node(&self.client, pvc).await;
                return Outcome::Done;
            }
            Err(topology::TopologyError::Retry(e)) => {
                failed(format!("error generating accessibility requirements: {e}"));
                return Outcome::Retry;
            }
        }
        match (&plan.provisioner_secret, saved_secrets) {
            (_, Some(s)) => request.secrets = s.0,
            (Some(r), None) => match self.secret(r).await {
                Ok(s) => request.secrets = s,
                Err(e) => {
                    failed(e);
                    return Outcome::Retry;
                }
            },
            (None, None) => {}
        }
        // From here on the driver may create a volume: remember it until the
        // PV exists or the driver gave a final answer.
        let entry = InFlight { key: key.to_string(), plan: plan.clone(), secrets: Secrets(request.secrets.clone()) };
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).insert(uid.clone(), entry);
        let resp = match crate::csi::connection::migrated_scope(migrated, self.create_volume(request.clone())).await {
            Ok(r) => r,
            Err(status) => return self.create_failed(&uid, key, pvc, sc, &status, &failed).await,
        };
        let built = match decide::build_pv(&plan, &resp, pvc, sc, &self.driver.name, &self.identity, &self.settings) {
            // With the gate off, upstream does not record the class either.
            Ok(mut pv) if !self.vac_gate => {
                if let Some(spec) = pv.spec.as_mut() {
                    spec.volume_attributes_class_name = None;
                }
                Ok(pv)
            }
            other => other,
        };
        // A failed translation reads as upstream's `Provision` returns it: as it is.
        let built = match built {
            Ok(pv) if migrated => crate::migration::csi_pv_to_in_tree(&pv).map_err(|e| e.to_string()),
            other => other.map_err(|e| e.to_string()),
        };
        let pv = match built {
            Ok(pv) => pv,
            Err(msg) => {
                // Unusable volume: delete it, then try again from scratch.
                if let Some(v) = resp.volume.as_ref().filter(|v| !v.volume_id.is_empty())
                    && let Err(ce) = self.cleanup(&v.volume_id, &request.secrets).await
                {
                    failed(decide::orphaned_volume_text(&msg, &plan.pv_name, &ce));
                    return Outcome::Retry;
                }
                self.forget_in_flight(&uid);
                failed(msg);
                return Outcome::Retry;
            }
        };
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match api.create(&PostParams::default(), &pv).await {
            Ok(_) => {}
            Err(::kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(claim = %key, pv = %plan.pv_name, "PV already exists")
            }
            Err(e) => {
                // The volume exists; keep it in flight so the next attempt
                // (CreateVolume is idempotent by name) saves the PV.
                failed(format!("error saving PersistentVolume {}: {}", plan.pv_name, api_error_text(&e)));
                return Outcome::Retry;
            }
        }
        self.forget_in_flight(&uid);
        self.infeasible.lock().unwrap_or_else(|e| e.into_inner()).forget(&uid);
        tracing::info!(claim = %key, pv = %plan.pv_name, "Provisioned volume");
        if let Some(c) = &self.capacity {
            c.provisioned(&pv, &class);
        }
        if let Some(src) = plan.source.as_ref().filter(|s| s.kind == SourceKind::Snapshot) {
            self.release_snapshot(src, &uid).await;
        }
        self.event_pvc(
            pvc,
            EventType::Normal,
            up::REASON_PROVISIONING_SUCCEEDED,
            &format!("Successfully provisioned volume {}", plan.pv_name),
        );
        Outcome::Done
    }

    async fn create_failed(
        &self,
        uid: &str,
        key: &str,
        pvc: &PersistentVolumeClaim,
        sc: &StorageClass,
        status: &tonic::Status,
        failed: &(dyn Fn(String) + Sync),
    ) -> Outcome {
        let selected = pvc.metadata.annotations.as_ref().and_then(|a| a.get(up::ANN_SELECTED_NODE)).is_some();
        let topology = self.driver.has_plugin_service(Svc::VolumeAccessibilityConstraints);
        let class = decide::classify_create_error(status.code(), topology && selected);
        tracing::warn!(claim = %key, error = %status_text(status), class = ?class, "CreateVolume failed");
        failed(decide::create_error_text(status.code(), &status_text(status)));
        if let (Some(c), Some(sc)) = (&self.capacity, pvc.spec.as_ref().and_then(|s| s.storage_class_name.as_deref())) {
            c.refresh_class(sc);
        }
        match class {
            CreateFailure::InBackground => Outcome::Retry,
            CreateFailure::Final | CreateFailure::Reschedule => {
                self.forget_in_flight(uid);
                if class == CreateFailure::Reschedule {
                    unselect_node(&self.client, pvc).await;
                    return Outcome::Done;
                }
                if status.code() == tonic::Code::InvalidArgument {
                    // Infeasible: slow retry (upstream's "slow set"), which
                    // no claim event or earlier delay brings forward.
                    let delay = self.cfg.retry_interval_max;
                    self.infeasible.lock().unwrap_or_else(|e| e.into_inner()).record(
                        uid,
                        key,
                        sc.metadata.name.as_deref().unwrap_or_default(),
                        sc.metadata.resource_version.as_deref().unwrap_or_default(),
                        std::time::Instant::now(),
                        delay,
                    );
                    Outcome::RetryAfter(delay)
                } else {
                    Outcome::Retry
                }
            }
        }
    }

    fn forget_in_flight(&self, uid: &str) {
        let gone = self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
        // A clone source the create held: the protection controller looks again.
        if let (Some(src), Some((_, queue))) = (gone.and_then(|f| f.plan.source), &self.clone_protection)
            && src.kind == SourceKind::Clone
        {
            queue.add(src.key());
        }
    }

    /// The PVC with this UID went away while its CreateVolume was undecided:
    /// get a final answer, and delete what it created, with the secrets of
    /// the first attempt (the PVC's namespace and its secret may be gone).
    async fn finish_orphaned(&self, uid: &str, f: &InFlight) -> Outcome {
        let key = f.key.as_str();
        // The claim left the cache: deleted, or bound (bound claims are not
        // cached). If the PV was saved after all (a create whose answer was
        // lost), the volume is the PV's, and its reclaim policy decides.
        // Read live (a list by name: the `list` verb the role has anyway).
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let by_name = ListParams::default().fields(&format!("metadata.name={}", f.plan.pv_name));
        match pvs.list_metadata(&by_name).await {
            Ok(l) if !l.items.is_empty() => {
                tracing::info!(claim = %key, pv = %f.plan.pv_name, "The volume's PV exists; it owns the volume");
                self.forget_in_flight(uid);
                return Outcome::Done;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(claim = %key, error = %e, "Cannot check for the PV of an orphaned volume; retrying");
                return Outcome::Retry;
            }
        }
        let mut request = f.plan.request.clone();
        request.secrets = f.secrets.0.clone();
        match self.create_volume(request.clone()).await {
            Ok(resp) => {
                let Some(v) = resp.volume.filter(|v| !v.volume_id.is_empty()) else {
                    self.forget_in_flight(uid);
                    return Outcome::Done;
                };
                match self.cleanup(&v.volume_id, &request.secrets).await {
                    Ok(()) => {
                        tracing::info!(claim = %key, volume = %v.volume_id, "Deleted the volume of a PVC deleted during provisioning");
                        self.forget_in_flight(uid);
                        Outcome::Done
                    }
                    Err(e) => {
                        tracing::warn!(claim = %key, error = %e, "Cleanup of an orphaned volume failed; retrying");
                        Outcome::Retry
                    }
                }
            }
            Err(s) if decide::classify_create_error(s.code(), false) == CreateFailure::InBackground => Outcome::Retry,
            Err(s) => {
                tracing::info!(claim = %key, error = %status_text(&s), "CreateVolume of a deleted PVC ended in a final error");
                self.forget_in_flight(uid);
                Outcome::Done
            }
        }
    }

    /// Deletes a volume that cannot be used (an unusable answer, an
    /// orphan): one attempt. On a failure the caller keeps the create in
    /// flight and the queue's backoff brings the next one; a burst would
    /// hit a restarting driver, and a hanging one would hold the worker
    /// for several `--timeout`s.
    async fn cleanup(&self, volume_id: &str, secrets: &HashMap<String, String>) -> Result<(), String> {
        self.delete_volume(volume_id, secrets.clone()).await.map_err(|s| status_text(&s))
    }

    /// Handles one PV name.
    async fn sync_volume(&self, name: String) -> Outcome {
        let Some(pv) = self.pvs.get(&ObjectRef::new(&name)).map(|p| p.to_full()) else { return Outcome::Done };
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match decide::decide_volume(&pv, &self.driver.name) {
            VolumeDecision::Ignore => Outcome::Done,
            VolumeDecision::AddFinalizer => patch_finalizers(&api, &pv, true).await,
            VolumeDecision::RemoveFinalizer => self.release_finalizer(&api, &pv).await,
            VolumeDecision::Delete => self.delete(&api, &pv).await,
        }
    }

    async fn delete(&self, api: &Api<PersistentVolume>, pv: &PersistentVolume) -> Outcome {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let failed =
            |msg: &str| self.events.publish(reference(pv), EventType::Warning, up::REASON_VOLUME_FAILED_DELETE, msg);
        if let Some(vas) = &self.attachments
            && let Some(va) = vas.by_index(crate::modules::views::VA_BY_PV, &name).first()
        {
            failed(&format!("persistentvolume {name} is still attached to node {}", va.spec.node_name));
            return Outcome::Retry;
        }
        if !self.driver.has_plugin_service(Svc::ControllerService)
            || !self.driver.has_controller_capability(Rpc::CreateDeleteVolume)
        {
            failed(
                "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported",
            );
            return Outcome::Retry;
        }
        let uid = pv.metadata.uid.clone().unwrap_or_default();
        let already = self.volume_deleted.contains(&uid);
        if !already {
            let secrets = match self.deletion_secrets(pv).await {
                Ok(s) => s,
                Err(e) => {
                    failed(&e);
                    return Outcome::Retry;
                }
            };
            let (handle, migrated) = match decide::volume_handle(pv) {
                Ok(h) => h,
                Err(e) => {
                    failed(&e);
                    return Outcome::Retry;
                }
            };
            let deleted = crate::csi::connection::migrated_scope(migrated, self.delete_volume(&handle, secrets)).await;
            if let Err(s) = deleted {
                failed(&status_text(&s));
                return Outcome::Retry;
            }
            tracing::info!(pv = %name, volume = %handle, "Deleted volume");
            self.volume_deleted.insert(&uid);
            if let Some(c) = &self.capacity {
                c.deleted(pv);
            }
        }
        let mut current = pv.clone();
        if pv.metadata.deletion_timestamp.is_none() {
            match api.delete(&name, &DeleteParams::default()).await {
                // Still there because of finalizers: drop ours from this version.
                Ok(either::Either::Left(deleting)) => current = deleting,
                Ok(either::Either::Right(_)) => return Outcome::Done,
                Err(::kube::Error::Api(e)) if e.code == 404 => return Outcome::Done,
                Err(e) => {
                    failed(&format!("error deleting PersistentVolume {name}: {}", api_error_text(&e)));
                    return Outcome::Retry;
                }
            }
        }
        self.release_finalizer(api, &current).await
    }

    /// Removes the provisioner finalizer, once per PV: a stale cached copy
    /// still showing it after the removal is not patched again.
    async fn release_finalizer(&self, api: &Api<PersistentVolume>, pv: &PersistentVolume) -> Outcome {
        let uid = pv.metadata.uid.clone().unwrap_or_default();
        if self.finalizer_released.contains(&uid) {
            return Outcome::Done;
        }
        let outcome = patch_finalizers(api, pv, false).await;
        if outcome == Outcome::Done {
            self.finalizer_released.insert(&uid);
        }
        outcome
    }

    /// The provisioner secret for DeleteVolume ([`decide::deletion_secret_ref`]);
    /// a secret that cannot be read is logged and the deletion goes on
    /// without it, as upstream.
    async fn deletion_secrets(&self, pv: &PersistentVolume) -> Result<HashMap<String, String>, String> {
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let class = pv.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
        let sc = (!class.is_empty()).then(|| self.classes.get(&ObjectRef::new(&class))).flatten();
        match decide::deletion_secret_ref(pv, sc.as_deref())? {
            None => Ok(HashMap::new()),
            Some(r) => Ok(self.secret(&r).await.unwrap_or_else(|e| {
                tracing::error!(pv = %pv_name, error = %e, "Failed to get deletion credentials; deleting without them");
                HashMap::new()
            })),
        }
    }
}

async fn patch_finalizers(api: &Api<PersistentVolume>, pv: &PersistentVolume, add: bool) -> Outcome {
    let result = if add {
        crate::kube::finalizers::add(api, pv, up::PV_FINALIZER).await
    } else {
        crate::kube::finalizers::remove(api, pv, up::PV_FINALIZER).await
    };
    match result {
        Ok(()) => Outcome::Done,
        Err(e) => {
            tracing::warn!(pv = %pv.metadata.name.as_deref().unwrap_or_default(), error = %e, "Updating the PV finalizer failed");
            Outcome::Retry
        }
    }
}

/// Asks the scheduler for another node: removes `selected-node`.
async fn unselect_node(client: &Client, pvc: &PersistentVolumeClaim) {
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(client.clone(), pvc.metadata.namespace.as_deref().unwrap_or_default());
    let patch = serde_json::json!({"metadata": {"annotations": {up::ANN_SELECTED_NODE: null}}});
    if let Err(e) = api
        .patch(pvc.metadata.name.as_deref().unwrap_or_default(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(error = %e, "Removing the selected-node annotation failed");
    }
}

/// The cloning-protection controller's workers (`--cloning-protection-threads`).
async fn run_cloning_protection(p: Arc<Provisioner>, queue: Option<WorkQueue<String>>, token: CancellationToken) {
    let Some(queue) = queue else { return };
    let threads = p.cfg.cloning_protection_threads;
    if threads == 0 {
        return;
    }
    queue
        .run(threads, token, move |key| {
            let p = p.clone();
            let span = tracing::info_span!("clone_source", key = %key);
            async move { p.sync_clone_source(key).await }.instrument(span)
        })
        .await;
}

/// The snapshot-finalizer sweep, every `--snapshot-orphan-sweep-interval`
/// (first once its cache synced). Provisioning does not wait for that cache:
/// a role without `list`/`watch` on VolumeSnapshots (upstream's are
/// optional) costs the sweep, logged as the watch's refusal, not the
/// provisioner.
async fn run_snapshot_sweep(
    p: Arc<Provisioner>,
    snapshots: Option<crate::kube::informers::Informer<VolumeSnapshot>>,
    token: CancellationToken,
) {
    let Some(snapshots) = snapshots else { return };
    if token.run_until_cancelled(snapshots.synced()).await.is_none() {
        return;
    }
    let mut every = tokio::time::interval(p.cfg.snapshot_orphan_sweep_interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while token.run_until_cancelled(every.tick()).await.is_some() {
        p.sweep_snapshots().instrument(tracing::info_span!("snapshot_sweep")).await;
    }
}

/// Runs the provisioner until shutdown (or until its Lease is lost).
pub async fn run(cfg: ProvisionerFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    let fatal = |message: String| ModuleError::Fatal { module: NAME, message };
    let kube: KubeContext = ctx.kube.clone().ok_or_else(|| fatal("no Kubernetes client".into()))?;
    for note in cfg.validate().map_err(|message| ModuleError::Config { module: NAME, message })? {
        tracing::warn!("{note}");
    }
    let node_name = node_deployment::node_name(cfg.node_deployment, std::env::var(up::NODE_NAME_ENV).ok().as_deref())
        .map_err(|message| ModuleError::Config { module: NAME, message })?;
    if node_name.is_some() && kube.leader.enabled {
        tracing::warn!(
            "--node-deployment with --leader-election: every node's instance competes for one Lease, so one node provisions at a time"
        );
    }
    let Some(driver) = ctx.csi.wait_for_driver(&ctx.shutdown).await else { return Ok(()) };
    tracing::info!(driver = %driver.name, "Provisioner starting");
    // Node deployment: the driver's own answer is this node's topology.
    let node = match node_name {
        None => None,
        Some(name) => {
            let info = ctx
                .csi
                .node_get_info(cfg.timeout)
                .await
                .map_err(|s| fatal(format!("Failed to get node info from CSI driver: {}", status_text(&s))))?;
            let nd = node_deployment::NodeDeployment::new(name, &info, &cfg);
            tracing::info!(node = %nd.node, node_id = %info.node_id, topology = ?nd.segment, "Node deployment: using the driver's topology of this node");
            Some(nd)
        }
    };
    // The snapshot sweep: VolumeSnapshots carrying the provisioner's
    // finalizer, only when the snapshot API is installed (silently off
    // otherwise), the driver can snapshot and the sweep is not disabled.
    // Asked before any view is registered: from here to `informers.start`
    // nothing awaits, so another module of the process cannot start the
    // claim watch between two of this module's views (a view added to a
    // running watch costs a relist).
    let sweep = driver.has_controller_capability(Rpc::CreateDeleteSnapshot)
        && !cfg.snapshot_orphan_sweep_interval.is_zero()
        && match crate::kube::snapshot_api::installed(&kube.client, "volumesnapshots").await {
            Ok(installed) => installed,
            Err(e) => {
                tracing::warn!(error = %e, "Cannot tell whether the snapshot API is installed; no snapshot sweep");
                false
            }
        };
    // The VolumeAttributesClass gate: as given, else on where the API is served.
    let vac_explicit = config::parse_feature_gates(&cfg.feature_gates)
        .unwrap_or_default()
        .into_iter()
        .find(|(g, _)| g == vac::GATE)
        .map(|(_, on)| on);
    let vac_served = match vac_explicit {
        Some(_) => true,
        None => crate::kube::discovery::vac_served(&kube.client).await,
    };
    let vac_gate = vac::gate(vac_explicit, vac_served);
    if !vac_gate && vac_explicit.is_none() {
        tracing::info!(
            "Disabling VolumeAttributesClass feature gate because the VolumeAttributesClass API is not served by the apiserver"
        );
    }
    // Capacity tracking: its environment, the driver's capability and the
    // owner walk are start-up checks (upstream exits on each).
    let capacity_setup = match cfg.enable_capacity {
        false => None,
        true => Some(capacity_settings(&cfg, &kube, &driver, node.as_ref()).await?),
    };
    let informers = &kube.informers;
    let capacity_ctl = capacity_setup.map(|(settings, client)| {
        Arc::new(capacity::Controller::register(informers, settings, ctx.csi.clone(), client))
    });
    let (pvc_inf, pv_inf) = match &node {
        None => (
            crate::modules::views::unbound_claims(informers, &driver.name, decide::is_for_driver),
            crate::modules::views::driver_pvs(informers, &driver.name),
        ),
        // A node's instance caches only what it may act on: claims not yet
        // on a node or on its own, PVs its node can access.
        Some(nd) => {
            let (claims_nd, pvs_nd) = (nd.clone(), nd.clone());
            (
                crate::modules::views::node_unbound_claims(
                    informers,
                    &driver.name,
                    decide::is_for_driver,
                    &nd.node,
                    move |c: &CachedPvc| {
                        claims_nd.claim_in_view(
                            c.metadata
                                .annotations
                                .as_ref()
                                .and_then(|a| a.get(up::ANN_SELECTED_NODE))
                                .map(String::as_str),
                        )
                    },
                ),
                crate::modules::views::node_pvs(informers, &driver.name, &nd.node, move |pv: &CachedPv| {
                    node_deployment::volume_accessible(
                        pv.spec.as_ref().and_then(|s| s.node_affinity.as_deref()),
                        pvs_nd.segment.as_ref(),
                    )
                }),
            )
        }
    };
    let sc_inf = informers.get::<StorageClass>();
    let va_inf = driver
        .has_controller_capability(Rpc::PublishUnpublishVolume)
        .then(|| crate::modules::views::driver_vas(informers, &driver.name));
    let gates = config::parse_feature_gates(&cfg.feature_gates).unwrap_or_default();
    let topology_gate = gates.iter().find(|(g, _)| g == "Topology").is_none_or(|(_, on)| *on);
    let cross_namespace = gates.iter().any(|(g, on)| g == up::GATE_CROSS_NAMESPACE && *on);
    // Claims that are clone sources carrying the cloning-protection
    // finalizer (a view of the one PVC watch), only with a driver that can
    // clone (upstream starts the controller only then).
    let clone_inf = driver
        .has_controller_capability(Rpc::CloneVolume)
        .then(|| crate::modules::views::cloning_protected_claims(informers));
    let snap_inf = sweep.then(|| crate::modules::views::provisioner_protected_snapshots(informers));
    // Restores read it too (the release after a restore), so with a driver
    // that can snapshot it is there even without the sweep.
    let waiting_inf = (clone_inf.is_some() || driver.has_controller_capability(Rpc::CreateDeleteSnapshot))
        .then(|| crate::modules::views::claims_waiting_for_sources(informers, sources::waits_for_source));
    // Nodes are only read for their labels: a metadata-only watch. A node
    // deployment watches neither (its topology is the driver's answer).
    let topology_aware = topology_gate && driver.has_plugin_service(Svc::VolumeAccessibilityConstraints);
    let topo_inf =
        (topology_aware && node.is_none()).then(|| (informers.metadata::<Node>(), informers.get::<CSINode>()));

    let backoff = Backoff { start: cfg.retry_interval_start, max: cfg.retry_interval_max };
    let claims: WorkQueue<String> = WorkQueue::new(up::QUEUE_CLAIMS, backoff);
    let volumes: WorkQueue<String> = WorkQueue::new(up::QUEUE_VOLUMES, backoff);
    let clone_queue: Option<WorkQueue<String>> =
        clone_inf.as_ref().map(|_| WorkQueue::new(up::QUEUE_CLONING_PROTECTION, backoff));
    let infeasible: Arc<Mutex<infeasible::Infeasible>> = Arc::default();
    // Handlers before the watches start (late ones would be replayed the
    // cache, but there is no reason to be late).
    {
        let claims = claims.clone();
        pvc_inf.on_change_with_resync(up::RESYNC, &ctx.shutdown, move |c| claims.add(claim_key(&c.object().metadata)));
    }
    {
        // A changed class: its claims with an infeasible create may try again.
        let (claims, infeasible) = (claims.clone(), infeasible.clone());
        sc_inf.on_change(move |c| {
            let name = c.object().metadata.name.as_deref().unwrap_or_default();
            for key in infeasible.lock().unwrap_or_else(|e| e.into_inner()).keys_of_class(name) {
                claims.add(key);
            }
        });
    }
    if let (Some(inf), Some(clones)) = (&waiting_inf, &clone_queue) {
        // A clone that changed (bound, deleted): its source may be free.
        let clones = clones.clone();
        inf.on_change(move |c| {
            if let Some((SourceKind::Clone, ns, name)) = sources::referenced_source(c.object()) {
                clones.add(format!("{ns}/{name}"));
            }
        });
    }
    if let (Some(inf), Some(clones)) = (&clone_inf, &clone_queue) {
        let clones = clones.clone();
        inf.on_change_with_resync(up::RESYNC, &ctx.shutdown, move |c| {
            if !c.is_deleted() && c.object().metadata.deletion_timestamp.is_some() {
                clones.add(claim_key(&c.object().metadata));
            }
        });
    }
    {
        let (volumes, name) = (volumes.clone(), driver.name.clone());
        pv_inf.on_change_with_resync(up::RESYNC, &ctx.shutdown, move |c| {
            let pv = c.object();
            // Ours, or a migrated in-tree volume (decide_volume checks which).
            let migrated = pv.spec.as_ref().and_then(|s| s.migrated_driver()) == Some(&*name)
                || pv.annotation(up::ANN_MIGRATED_TO) == Some(&*name);
            let provisioned_by = pv.annotation(up::ANN_PROVISIONED_BY);
            if !c.is_deleted() && (provisioned_by == Some(&*name) || (provisioned_by.is_some() && migrated)) {
                volumes.add(pv.metadata.name.clone().unwrap_or_default());
            }
        });
    }
    informers.start(&ctx.shutdown);
    let settings = Settings {
        volume_name_prefix: cfg.volume_name_prefix.clone(),
        volume_name_uuid_length: cfg.volume_name_uuid_length,
        default_fstype: cfg.default_fstype.clone(),
        extra_create_metadata: cfg.extra_create_metadata,
        controller_publish_readonly: cfg.controller_publish_readonly,
    };
    // Upstream's library names its recorder `<driver>_<host>_<uuid>` and
    // sets no source host; the provisioner's own recorder is
    // `external-provisioner`.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let component = up::library_event_component(&driver.name, &host, &random_uuid());
    let p = Arc::new(Provisioner {
        settings,
        identity: node_deployment::identity(identity(&driver.name), node.as_ref().map(|n| n.node.as_str())),
        csi: ctx.csi.clone(),
        client: kube.client.clone(),
        events: Recorder::new(kube.client.clone(), &component, "", &ctx.shutdown),
        own_events: Recorder::new(kube.client.clone(), up::EVENT_COMPONENT, "", &ctx.shutdown),
        pvcs: pvc_inf.store(),
        pvs: pv_inf.store(),
        classes: sc_inf.store(),
        attachments: va_inf.as_ref().map(|i| i.store()),
        topology: topo_inf.as_ref().map(|(n, c)| (n.store(), c.store())),
        in_flight: Mutex::default(),
        infeasible,
        volume_deleted: RecentUids::default(),
        finalizer_released: RecentUids::default(),
        cross_namespace,
        waiting: waiting_inf.as_ref().map(|i| i.store()),
        clone_protection: clone_inf.as_ref().zip(clone_queue.clone()).map(|(i, q)| (i.store(), q)),
        protected_snapshots: snap_inf.as_ref().map(|i| i.store()),
        node_topology: topology_aware,
        node,
        races: node_deployment::Races::default(),
        vac_gate,
        capacity: capacity_ctl.as_ref().map(|c| c.handle()),
        driver: driver.clone(),
        cfg,
    });
    let work = {
        let (p, claims, volumes) = (p.clone(), claims.clone(), volumes.clone());
        let (pvc_inf, pv_inf, sc_inf) = (pvc_inf.clone(), pv_inf.clone(), sc_inf.clone());
        let (clone_inf, snap_inf, clone_queue) = (clone_inf.clone(), snap_inf.clone(), clone_queue.clone());
        let waiting_inf = waiting_inf.clone();
        let capacity_ctl = capacity_ctl.clone();
        let topo_inf = topo_inf.clone();
        move |token: CancellationToken| async move {
            // A cache that cannot sync (a forbidden watch) must not hold
            // up a shutdown: nothing was started that needs draining.
            let synced = async {
                tokio::join!(pvc_inf.synced(), pv_inf.synced(), sc_inf.synced(), async {
                    if let Some(i) = &clone_inf {
                        i.synced().await;
                    }
                    if let Some(i) = &waiting_inf {
                        i.synced().await;
                    }
                    // The selected node's labels and CSINode: a claim read
                    // before these caches synced would find its node
                    // missing and be handed back to the scheduler.
                    if let Some((nodes, csinodes)) = &topo_inf {
                        tokio::join!(nodes.synced(), csinodes.synced());
                    }
                })
            };
            if token.run_until_cancelled(synced).await.is_none() {
                return;
            }
            tracing::info!("Caches synced; provisioning");
            let workers = p.cfg.worker_threads;
            let (pc, pv) = (p.clone(), p.clone());
            tokio::join!(
                claims.run(workers, token.clone(), move |key| {
                    let p = pc.clone();
                    let span = tracing::info_span!("claim", key = %key);
                    async move { p.sync_claim(key).await }.instrument(span)
                }),
                volumes.run(workers, token.clone(), move |name| {
                    let p = pv.clone();
                    let span = tracing::info_span!("volume", pv = %name);
                    async move { p.sync_volume(name).await }.instrument(span)
                }),
                run_cloning_protection(p.clone(), clone_queue, token.clone()),
                run_snapshot_sweep(p.clone(), snap_inf.clone(), token.clone()),
                async {
                    if let Some(c) = capacity_ctl.clone() {
                        c.run(token.clone()).await;
                    }
                },
            );
        }
    };
    // Lease name: the driver name with '/' replaced, sanitised (upstream).
    // Lease name: upstream's for this module.
    crate::modules::led::run_led(&ctx, NAME, &driver.name.replace('/', "-"), work).await
}

/// The capacity controller's settings and client, checked at start-up:
/// `$NAMESPACE` (and `$POD_NAME` for an owner), the driver's GET_CAPACITY
/// capability, the owner walk.
async fn capacity_settings(
    cfg: &ProvisionerFlags,
    kube: &KubeContext,
    driver: &DriverInfo,
    node: Option<&node_deployment::NodeDeployment>,
) -> Result<(capacity::Settings, Client), ModuleError> {
    let config = |message: String| ModuleError::Config { module: NAME, message };
    if !driver.has_controller_capability(Rpc::GetCapacity) {
        return Err(config(format!(
            "--enable-capacity: the driver {} does not report the GET_CAPACITY controller capability",
            driver.name
        )));
    }
    let namespace = capacity::namespace_from_env().map_err(|e| config(e.to_string()))?;
    let client = kube
        .client_with_budget(cfg.kube_api_capacity_qps, cfg.kube_api_capacity_burst, "csi-provisioner")
        .map_err(|e| ModuleError::Fatal { module: NAME, message: e.to_string() })?;
    let owner = capacity::lookup_owner(&client, &namespace, cfg.capacity_ownerref_level)
        .await
        .map_err(|e| config(e.to_string()))?;
    if let Some(o) = &owner {
        tracing::info!("using {}/{} {} as owner of CSIStorageCapacity objects", o.api_version, o.kind, o.name);
    }
    let settings = capacity::Settings {
        driver: driver.name.to_string(),
        namespace,
        // Each node's instance manages its own node's objects (upstream's
        // `external-provisioner-<node>`).
        managed_by: match node {
            None => compat::capacity::MANAGED_BY.to_string(),
            Some(n) => capacity::decide::node_managed_by(compat::capacity::MANAGED_BY, &n.node),
        },
        node_segment: node.map(|n| n.segment.clone().unwrap_or_default()),
        owner,
        immediate: cfg.capacity_for_immediate_binding,
        poll: cfg.capacity_poll_interval,
        threads: cfg.capacity_threads,
        timeout: cfg.timeout,
        backoff: Backoff { start: cfg.retry_interval_start, max: cfg.retry_interval_max },
    };
    Ok((settings, client))
}
