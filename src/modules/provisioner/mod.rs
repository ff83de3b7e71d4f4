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
mod claim;
pub mod config;
pub mod decide;
mod in_flight;
pub mod infeasible;
pub mod node_deployment;
pub mod params;
mod protection;
pub mod sources;
pub mod topology;
pub mod topology_index;
pub mod vac;
mod volume;
pub mod waiting;

use parking_lot::Mutex;
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::future::BoxFuture;
use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim},
    storage::v1::{CSINode, StorageClass, VolumeAttributesClass},
};
use kube::core::PartialObjectMeta;
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PostParams},
    runtime::reflector::ObjectRef,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    compat::{self, provisioner as upstream},
    csi::{
        Connection, DriverInfo,
        proto::csi::v1::{
            self as csi, controller_service_capability::rpc::Type as Rpc, plugin_capability::service::Type as Svc,
        },
    },
    debug::WaitingFor,
    k8s::{
        KubeContext,
        cache::Cache,
        cached::{CachedPv, CachedPvc, CachedVa},
        events::{EventType, Recorder, reference},
        informers::{Informer, Informers},
        key::ObjectKey,
        queue::{Backoff, WorkQueue},
        reference_grant::ReferenceGrant,
        snapshot_api::{VolumeSnapshot, VolumeSnapshotContent},
    },
    modules::{
        contract::{Module, ModuleContext, ModuleError},
        kit::{Crew, Done, Kit, Reconciled, Wait},
        views,
    },
};

/// The key of a claim's sync (provisioning, cloning protection).
type ClaimKey = ObjectKey<PersistentVolumeClaim>;
/// The key of a PV's sync.
type PvKey = ObjectKey<PersistentVolume>;
use config::ProvisionerFlags;
use decide::{ClaimDecision, CreateFailure, Plan, PlanError, Settings, VolumeDecision};
use in_flight::{InFlight, RecentUids, Secrets};
use params::SecretRef;
use protection::run_snapshot_sweep;
use sources::{CloneProtection, PlanSource, SourceKind};
use topology_index::ClusterTopology;

const NAME: &str = "provisioner";

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
    /// Node labels (metadata-only watch), CSINodes and the index of the
    /// driver's nodes kept from them, with a topology-aware driver.
    topology: Option<Arc<ClusterTopology>>,
    /// By claim UID.
    in_flight: Mutex<HashMap<String, InFlight>>,
    /// Claims whose CreateVolume was infeasible: not called again before
    /// `--retry-interval-max` unless their class changes (shared with the
    /// class handler, which re-queues them on a change).
    infeasible: Arc<Mutex<infeasible::Infeasible<ClaimKey>>>,
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
    clone_protection: Option<(Cache<CachedPvc>, WorkQueue<ClaimKey>)>,
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

use crate::k8s::error_text as api_error_text;

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
    fn claim(&self, key: &ClaimKey) -> Option<PersistentVolumeClaim> {
        self.pvcs.get(&key.cache_ref()).map(|c| c.to_full())
    }

    fn event_pvc(&self, pvc: &PersistentVolumeClaim, kind: EventType, reason: &str, message: &str) {
        self.events.publish(reference(pvc), kind, reason, message);
    }

    async fn secret(&self, r: &SecretRef) -> Result<HashMap<String, String>, String> {
        crate::k8s::secrets::secret_data(&self.client, &r.name, &r.namespace).await
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
        let Some(cluster) = &self.topology else { return Ok(None) };
        let allowed = topology::flatten_allowed(&allowed_terms(sc));
        let selected =
            pvc.metadata.annotations.as_ref().and_then(|a| a.get(upstream::ANN_SELECTED_NODE)).map(String::as_str);
        let req = topology::Request {
            late_binding: sc.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"),
            selected_node: selected,
            strict: self.cfg.strict_topology,
            immediate_topology: self.cfg.immediate_topology,
            allowed: &allowed,
            pvc_name: pvc.metadata.name.as_deref().unwrap_or_default(),
        };
        cluster.requirements(&req)
    }

    async fn create_volume(&self, req: csi::CreateVolumeRequest) -> Result<csi::CreateVolumeResponse, tonic::Status> {
        self.csi.create_volume(self.cfg.timeout, req).await
    }

    async fn delete_volume(&self, volume_id: &str, secrets: HashMap<String, String>) -> Result<(), tonic::Status> {
        let req = csi::DeleteVolumeRequest { volume_id: volume_id.to_string(), secrets };
        self.csi.delete_volume(self.cfg.timeout, req).await.map(|_| ())
    }

    /// The name of the PV of the claim with this UID.
    fn pv_name_of(&self, uid: &str) -> String {
        decide::volume_name(&self.cfg.volume_name_prefix, uid, self.cfg.volume_name_uuid_length).unwrap_or_default()
    }
}

/// The views of the shared cache the provisioner reads, registered together
/// before the watches start.
struct Views {
    claims: Informer<CachedPvc>,
    volumes: Informer<CachedPv>,
    classes: Informer<StorageClass>,
    /// With a driver that publishes: VolumeAttachments by PV.
    attachments: Option<Informer<CachedVa>>,
    /// With a driver that clones: sources carrying the cloning-protection finalizer.
    clone_sources: Option<Informer<CachedPvc>>,
    /// With the snapshot sweep: snapshots carrying the source finalizer.
    snapshots: Option<Informer<VolumeSnapshot>>,
    /// With a protection controller: claims of any driver waiting for a source.
    waiting: Option<Informer<CachedPvc>>,
    /// With a topology-aware driver (not a node deployment): Node labels,
    /// CSINodes and the index of the driver's nodes kept from them.
    topology: Option<TopologyViews>,
}

/// Node labels (a metadata-only watch), CSINodes, and the index of the
/// driver's nodes kept from both.
type TopologyViews = (Informer<PartialObjectMeta<Node>>, Informer<CSINode>, Arc<ClusterTopology>);

impl Views {
    /// Registers the views. Nothing here awaits, so another module of the
    /// process cannot start the claim watch between two of these views (a
    /// view added to a running watch costs a relist).
    fn register(
        informers: &Informers,
        driver: &DriverInfo,
        node: Option<&node_deployment::NodeDeployment>,
        sweep: bool,
        topology_aware: bool,
    ) -> Self {
        let name = &driver.name;
        let (claims, volumes) = match node {
            None => (views::unbound_claims(informers, name, decide::is_for_driver), views::driver_pvs(informers, name)),
            // A node's instance caches only what it may act on: claims not
            // yet on a node or on its own, PVs its node can access.
            Some(nd) => {
                let (claims_nd, pvs_nd) = (nd.clone(), nd.clone());
                let selected = move |c: &CachedPvc| {
                    let node = c.metadata.annotations.as_ref().and_then(|a| a.get(upstream::ANN_SELECTED_NODE));
                    claims_nd.claim_in_view(node.map(String::as_str))
                };
                let accessible = move |pv: &CachedPv| {
                    let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_deref());
                    node_deployment::volume_accessible(affinity, pvs_nd.segment.as_ref())
                };
                (
                    views::node_unbound_claims(informers, name, decide::is_for_driver, &nd.node, selected),
                    views::node_pvs(informers, name, &nd.node, accessible),
                )
            }
        };
        let can = |rpc: Rpc| driver.has_controller_capability(rpc);
        let clone_sources = can(Rpc::CloneVolume).then(|| views::cloning_protected_claims(informers));
        // Restores read it too (the release after a restore), so with a
        // driver that can snapshot it is there even without the sweep.
        let waiting = (clone_sources.is_some() || can(Rpc::CreateDeleteSnapshot))
            .then(|| views::claims_waiting_for_sources(informers, sources::waits_for_source));
        Views {
            claims,
            volumes,
            classes: informers.get::<StorageClass>(),
            attachments: can(Rpc::PublishUnpublishVolume).then(|| views::driver_vas(informers, name)),
            clone_sources,
            snapshots: sweep.then(|| views::provisioner_protected_snapshots(informers)),
            waiting,
            // Nodes are only read for their labels: a metadata-only watch.
            // A node deployment watches neither (its topology is the driver's answer).
            topology: (topology_aware && node.is_none()).then(|| {
                let (nodes, csinodes) = (informers.metadata::<Node>(), informers.get::<CSINode>());
                let index = ClusterTopology::new(nodes.store(), csinodes.store(), name);
                (nodes, csinodes, Arc::new(index))
            }),
        }
    }

    /// Waits for the caches provisioning reads (not the sweep's: a role
    /// without VolumeSnapshot `list` costs the sweep, not provisioning).
    async fn synced(&self) {
        tokio::join!(self.claims.synced(), self.volumes.synced(), self.classes.synced(), async {
            if let Some(i) = &self.clone_sources {
                i.synced().await;
            }
            if let Some(i) = &self.waiting {
                i.synced().await;
            }
            // The selected node's labels and CSINode: a claim read before
            // these caches synced would find its node missing and be handed
            // back to the scheduler.
            if let Some((nodes, csinodes, _)) = &self.topology {
                tokio::join!(nodes.synced(), csinodes.synced());
            }
        });
    }
}

/// The provisioner's work queues.
#[derive(Clone)]
struct Queues {
    claims: WorkQueue<ClaimKey>,
    volumes: WorkQueue<PvKey>,
    /// With a driver that clones.
    clone_sources: Option<WorkQueue<ClaimKey>>,
}

/// Connects the views' changes to the queues. Handlers go on before the
/// watches start (late ones would be replayed the cache, but there is no
/// reason to be late).
fn add_handlers(
    views: &Views,
    queues: &Queues,
    infeasible: &Arc<Mutex<infeasible::Infeasible<ClaimKey>>>,
    driver: &str,
    shutdown: &CancellationToken,
) {
    if let Some((nodes, csinodes, cluster)) = &views.topology {
        // A Node or CSINode event: that node's entry again, from both
        // caches (so the order of the two watches' events does not matter).
        let name = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| m.name.clone().unwrap_or_default();
        let c = cluster.clone();
        nodes.on_change(shutdown, move |n| c.update(&name(&n.object().metadata)));
        let c = cluster.clone();
        csinodes.on_change(shutdown, move |n| c.update(&name(&n.object().metadata)));
    }
    let claims = queues.claims.clone();
    views
        .claims
        .on_change_with_resync(upstream::RESYNC, shutdown, move |c| claims.add(ClaimKey::of(&c.object().metadata)));
    // A changed class: its claims with an infeasible create may try again.
    let (claims, infeasible) = (queues.claims.clone(), infeasible.clone());
    views.classes.on_change(shutdown, move |c| {
        let name = c.object().metadata.name.as_deref().unwrap_or_default();
        for key in infeasible.lock().keys_of_class(name) {
            claims.add(key);
        }
    });
    if let (Some(inf), Some(clones)) = (&views.waiting, &queues.clone_sources) {
        // A clone that changed (bound, deleted): its source may be free.
        let clones = clones.clone();
        inf.on_change(shutdown, move |c| {
            if let Some((SourceKind::Clone, ns, name)) = sources::referenced_source(c.object()) {
                clones.add(ClaimKey::namespaced(ns, name));
            }
        });
    }
    if let (Some(inf), Some(clones)) = (&views.clone_sources, &queues.clone_sources) {
        let clones = clones.clone();
        inf.on_change_with_resync(upstream::RESYNC, shutdown, move |c| {
            if !c.is_deleted() && c.object().metadata.deletion_timestamp.is_some() {
                clones.add(ClaimKey::of(&c.object().metadata));
            }
        });
    }
    let (volumes, name) = (queues.volumes.clone(), driver.to_string());
    views.volumes.on_change_with_resync(upstream::RESYNC, shutdown, move |c| {
        // Only a volume with something to do: the decision depends on the PV
        // alone, so its next change (or the resync) brings it back.
        let pv = c.object();
        if !c.is_deleted() && decide::decide_volume(&pv.to_full(), &name) != VolumeDecision::Ignore {
            volumes.add(PvKey::of(&pv.metadata));
        }
    });
}

/// Node deployment: this node, with the driver's own answer as its topology.
async fn node_of(
    cfg: &ProvisionerFlags,
    csi: &Connection,
    name: Option<String>,
) -> Result<Option<node_deployment::NodeDeployment>, ModuleError> {
    let Some(name) = name else { return Ok(None) };
    let info = csi.node_get_info(cfg.timeout).await.map_err(|s| ModuleError::Fatal {
        module: NAME,
        message: format!("Failed to get node info from CSI driver: {}", status_text(&s)),
    })?;
    let nd = node_deployment::NodeDeployment::new(name, &info, cfg);
    tracing::info!(node = %nd.node, node_id = %info.node_id, topology = ?nd.segment, "Node deployment: using the driver's topology of this node");
    Ok(Some(nd))
}

/// Whether the snapshot-finalizer sweep runs: the driver can snapshot, the
/// sweep is not disabled, the snapshot API is installed (silently off
/// otherwise), and the role may list and watch VolumeSnapshots (upstream's
/// published RBAC grants `get` and `list` only: then one info line says the
/// sweep is off, where a refused watch would be retried forever).
async fn sweep_enabled(cfg: &ProvisionerFlags, client: &Client, driver: &DriverInfo) -> bool {
    if !driver.has_controller_capability(Rpc::CreateDeleteSnapshot) || cfg.snapshot_orphan_sweep_interval.is_zero() {
        return false;
    }
    let installed = crate::k8s::snapshot_api::installed(client, "volumesnapshots").await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "Cannot tell whether the snapshot API is installed; no snapshot sweep");
        false
    });
    if !installed {
        return false;
    }
    for verb in ["list", "watch"] {
        match crate::k8s::access::may_cluster_wide(client, "snapshot.storage.k8s.io", "volumesnapshots", verb).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(verb, "{SWEEP_OFF_WITHOUT_WATCH}");
                return false;
            }
            // Unknown: try, as before (a refusal is then logged by the watch).
            Err(e) => tracing::debug!(verb, error = %e, "Cannot ask the apiserver what the role allows"),
        }
    }
    true
}

/// The line saying the sweep is off for the role's sake.
pub const SWEEP_OFF_WITHOUT_WATCH: &str = "The snapshot-finalizer sweep is off: the role may not list and watch volumesnapshots cluster-wide (csi-sidecar's RBAC grants both, upstream's get and list)";

/// The VolumeAttributesClass gate: as given, else on where the API is served.
async fn vac_gate_in_effect(explicit: Option<bool>, client: &Client) -> bool {
    let served = match explicit {
        Some(_) => true,
        None => crate::k8s::discovery::vac_served(client).await,
    };
    let on = vac::gate(explicit, served);
    if !on && explicit.is_none() {
        tracing::info!(
            "Disabling VolumeAttributesClass feature gate because the VolumeAttributesClass API is not served by the apiserver"
        );
    }
    on
}

/// The provisioning library's event component, `<driver>_<host>_<uuid>`
/// (it sets no source host).
fn library_event_component(driver: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    upstream::library_event_component(driver, &host, &crate::k8s::names::random_uuid())
}

/// The work the Lease guards: the caches synced, then every queue's workers,
/// the sweep and capacity tracking until the crew stops.
async fn work(
    p: Arc<Provisioner>,
    views: Arc<Views>,
    queues: Queues,
    capacity: Option<Arc<capacity::Controller>>,
    mut crew: Crew,
) {
    if !crew.synced("provisioning", views.synced()).await {
        return;
    }
    let workers = p.cfg.worker_threads;
    crew.serve(&queues.claims, workers, &p, |p, key| async move { p.sync_claim(key).await });
    crew.serve(&queues.volumes, workers, &p, |p, key| async move { p.sync_volume(key).await });
    let threads = p.cfg.cloning_protection_threads;
    if let Some(clone_sources) = queues.clone_sources.as_ref().filter(|_| threads > 0) {
        crew.serve(clone_sources, threads, &p, |p, key| async move { p.sync_clone_source(key).await });
    }
    crew.spawn(run_snapshot_sweep(p.clone(), views.snapshots.clone(), crew.token().clone()));
    if let Some(c) = capacity {
        let token = crew.token().clone();
        crew.spawn(async move { c.run(token).await });
    }
    crew.run().await;
}

/// The module's entry points for the host.
impl Module for ProvisionerFlags {
    fn validate(&self) -> Result<(), ModuleError> {
        ProvisionerFlags::validate(self).map(|_| ()).map_err(|message| ModuleError::Config { module: NAME, message })
    }

    fn discovery_timeout(&self) -> Duration {
        self.timeout
    }

    fn master(&self) -> Option<&str> {
        self.master.as_deref()
    }

    fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>> {
        Box::pin(run(self.clone(), ctx))
    }
}

/// Runs the provisioner until shutdown (or until its Lease is lost).
pub async fn run(cfg: ProvisionerFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    let kit = Kit::new(NAME, ctx)?.retrying(Backoff { start: cfg.retry_interval_start, max: cfg.retry_interval_max });
    let config = |message: String| kit.config_error(message);
    let (ctx, kube) = (&kit.ctx, &kit.kube);
    let gates = cfg.validate().map_err(config)?;
    let node_name =
        node_deployment::node_name(cfg.node_deployment, std::env::var(upstream::NODE_NAME_ENV).ok().as_deref())
            .map_err(config)?;
    if node_name.is_some() && kube.leader.enabled {
        tracing::warn!(
            "--node-deployment with --leader-election: every node's instance competes for one Lease, so one node provisions at a time"
        );
    }
    let Some(driver) = kit.driver().await else { return Ok(()) };
    tracing::info!(driver = %driver.name, "Provisioner starting");
    let node = node_of(&cfg, &ctx.csi, node_name).await?;
    // Everything that awaits comes before the views are registered.
    let sweep = sweep_enabled(&cfg, &kube.client, &driver).await;
    let vac_gate = vac_gate_in_effect(gates.volume_attributes_class, &kube.client).await;
    // Capacity tracking: its environment, the driver's capability and the
    // owner walk are start-up checks (upstream exits on each).
    let capacity_setup = match cfg.enable_capacity {
        false => None,
        true => Some(capacity_settings(&cfg, kube, &driver, node.as_ref()).await?),
    };
    let informers = &kube.informers;
    let capacity_ctl = capacity_setup.map(|(settings, client)| {
        Arc::new(capacity::Controller::register(informers, settings, ctx.csi.clone(), client, &ctx.shutdown))
    });
    let topology_aware = gates.topology && driver.has_plugin_service(Svc::VolumeAccessibilityConstraints);
    let views = Arc::new(Views::register(informers, &driver, node.as_ref(), sweep, topology_aware));
    let queues = Queues {
        claims: kit.queue(upstream::QUEUE_CLAIMS),
        volumes: kit.queue(upstream::QUEUE_VOLUMES),
        clone_sources: views.clone_sources.as_ref().map(|_| kit.queue(upstream::QUEUE_CLONING_PROTECTION)),
    };
    let infeasible: Arc<Mutex<infeasible::Infeasible<ClaimKey>>> = Arc::default();
    add_handlers(&views, &queues, &infeasible, &driver.name, &ctx.shutdown);
    informers.start(&ctx.process);
    let settings = Settings {
        volume_name_prefix: cfg.volume_name_prefix.clone(),
        volume_name_uuid_length: cfg.volume_name_uuid_length,
        default_fstype: cfg.default_fstype.clone(),
        extra_create_metadata: cfg.extra_create_metadata,
        controller_publish_readonly: cfg.controller_publish_readonly,
    };
    let component = library_event_component(&driver.name);
    let events = kit.recorder(&component);
    let p = Arc::new(Provisioner {
        settings,
        identity: node_deployment::identity(identity(&driver.name), node.as_ref().map(|n| n.node.as_str())),
        csi: ctx.csi.clone(),
        client: kube.client.clone(),
        own_events: events.for_component(upstream::EVENT_COMPONENT),
        events,
        pvcs: views.claims.store(),
        pvs: views.volumes.store(),
        classes: views.classes.store(),
        attachments: views.attachments.as_ref().map(|i| i.store()),
        topology: views.topology.as_ref().map(|(_, _, t)| t.clone()),
        in_flight: Mutex::default(),
        infeasible,
        volume_deleted: RecentUids::default(),
        finalizer_released: RecentUids::default(),
        cross_namespace: gates.cross_namespace,
        waiting: views.waiting.as_ref().map(|i| i.store()),
        clone_protection: views.clone_sources.as_ref().zip(queues.clone_sources.clone()).map(|(i, q)| (i.store(), q)),
        protected_snapshots: views.snapshots.as_ref().map(|i| i.store()),
        node_topology: topology_aware,
        node,
        races: node_deployment::Races::default(),
        vac_gate,
        capacity: capacity_ctl.as_ref().map(|c| c.handle()),
        driver: driver.clone(),
        cfg,
    });
    // Lease name: upstream's for this module (the driver name, '/' replaced).
    kit.lead(&driver.name.replace('/', "-"), move |crew| work(p, views, queues, capacity_ctl, crew)).await
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
