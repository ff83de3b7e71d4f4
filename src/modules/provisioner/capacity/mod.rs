//! Storage capacity tracking (`--enable-capacity`, upstream's
//! `pkg/capacity`): one CSIStorageCapacity object per topology segment of
//! the driver × tracked StorageClass, in the provisioner's namespace,
//! refreshed with `GetCapacity` every `--capacity-poll-interval`, after
//! provisioning and deletion, and on StorageClass, Node-label and CSINode
//! changes; obsolete and duplicate objects are deleted.
//!
//! Decisions are in [`decide`]. Here: the handlers on the shared cache
//! (StorageClasses, Node metadata and CSINodes, the same views the
//! provisioner reads, and the namespaced, label-selected watch of the
//! objects), two queues with upstream's names (`csitopology`: one key, the
//! reconciliation of what should exist; `csistoragecapacity`: one key per
//! object to create, refresh or delete), the CSI call, the writes through
//! the capacity client (`--kube-api-capacity-qps/-burst`), the owner walk
//! and upstream's three gauges.

pub mod decide;
pub mod index;

use parking_lot::Mutex;
use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{
    api::{
        core::v1::{Node, PersistentVolume, Pod},
        storage::v1::{CSINode, CSIStorageCapacity, StorageClass},
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams, Preconditions},
    core::PartialObjectMeta,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    compat::capacity as upstream,
    csi::{
        Connection,
        proto::csi::v1::{self as csi},
    },
    k8s::{
        informers::{Change, Informer, Informers},
        queue::{Backoff, Outcome, WorkQueue},
    },
};
use decide::{Item, Key};
use index::{Plan, Tracker};

/// What the capacity controller is configured with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The driver.
    pub driver: String,
    /// Where the objects live (`$NAMESPACE`).
    pub namespace: String,
    /// The managed-by label's value.
    pub managed_by: String,
    /// The owner of new objects (`--capacity-ownerref-level`).
    pub owner: Option<OwnerReference>,
    /// `--capacity-for-immediate-binding`.
    pub immediate: bool,
    /// `--capacity-poll-interval`.
    pub poll: Duration,
    /// `--capacity-threads`.
    pub threads: usize,
    /// `--timeout` of GetCapacity.
    pub timeout: Duration,
    /// Retry backoff (`--retry-interval-start/-max`).
    pub backoff: Backoff,
    /// `--node-deployment`: this node's segment only (from `NodeGetInfo`),
    /// and no Node or CSINode watch, as upstream's static topology; `None`
    /// in a central deployment.
    pub node_segment: Option<decide::Segment>,
}

/// Start-up could not prepare capacity tracking.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A required environment variable is not set.
    #[error("--enable-capacity needs the {0} environment variable")]
    MissingEnv(&'static str),
    /// The owner walk failed.
    #[error("look up owner(s) of pod: {0}")]
    Owner(String),
}

/// The namespace of the objects: `$NAMESPACE` (upstream's), else
/// `$POD_NAMESPACE` (what csi-sidecar's manifests set).
pub fn namespace_from_env() -> Result<String, SetupError> {
    [upstream::ENV_NAMESPACE, "POD_NAMESPACE"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .ok_or(SetupError::MissingEnv(upstream::ENV_NAMESPACE))
}

/// The owner of the objects: `level` steps up from `$POD_NAME` (upstream's
/// `owner.Lookup`); none for a negative level.
pub async fn lookup_owner(client: &Client, namespace: &str, level: i64) -> Result<Option<OwnerReference>, SetupError> {
    if level < 0 {
        return Ok(None);
    }
    let pod = std::env::var(upstream::ENV_POD_NAME)
        .ok()
        .filter(|s| !s.is_empty())
        .ok_or(SetupError::MissingEnv(upstream::ENV_POD_NAME))?;
    let get_err = |e: kube::Error| SetupError::Owner(format!("get object: {e}"));
    let mut meta = Api::<Pod>::namespaced(client.clone(), namespace).get(&pod).await.map_err(get_err)?.metadata;
    let (mut api_version, mut kind, mut levels) = ("v1".to_string(), "Pod".to_string(), level);
    loop {
        match decide::owner_step(&meta, &api_version, &kind, levels).map_err(SetupError::Owner)? {
            decide::OwnerStep::Done(owner) => return Ok(Some(owner)),
            decide::OwnerStep::Follow { api_version: a, kind: k, name, levels: l } => {
                let (group, version) = a.split_once('/').unwrap_or(("", a.as_str()));
                let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &k));
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
                meta = api.get(&name).await.map_err(get_err)?.metadata;
                (api_version, kind, levels) = (a, k, l);
            }
        }
    }
}

/// What the provisioner tells capacity tracking. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
}

struct Shared {
    /// The items of the last reconciliation and the index of the objects.
    tracker: Mutex<Tracker>,
    items: WorkQueue<Key>,
    topology: WorkQueue<()>,
}

impl Handle {
    fn tracker(&self) -> parking_lot::MutexGuard<'_, Tracker> {
        self.shared.tracker.lock()
    }

    /// Queues the desired items `pick` accepts.
    fn refresh(&self, pick: impl Fn(&Item) -> bool) {
        let items: Vec<Item> = self.tracker().desired().iter().filter(|i| pick(i)).cloned().collect();
        for i in items {
            self.shared.items.add(Key::Item(i));
        }
    }

    /// Queues what a change of the objects asks for.
    fn plan(&self, plan: Plan) {
        for i in plan.queue {
            self.shared.items.add(Key::Item(i));
        }
        for (name, uid) in plan.delete {
            self.shared.items.add(Key::Delete(name, uid));
        }
    }

    /// Refreshes the objects of `class`.
    pub fn refresh_class(&self, class: &str) {
        self.refresh(|i| i.class == class);
    }

    /// Refreshes the objects of the segments `pv`'s node affinity names;
    /// without one, those of `class` (upstream: the class after a
    /// provisioning only).
    fn refresh_for(&self, pv: &PersistentVolume, class: Option<&str>) {
        let segments = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).map(decide::affinity_segments);
        match (segments.filter(|s| !s.is_empty()), class) {
            (Some(segments), _) => self.refresh(|i| segments.contains(&i.segment)),
            (None, Some(c)) => self.refresh_class(c),
            (None, None) => {}
        }
    }

    /// A volume of `class` was provisioned as `pv`.
    pub fn provisioned(&self, pv: &PersistentVolume, class: &str) {
        self.refresh_for(pv, Some(class));
    }

    /// `pv`'s volume was deleted.
    pub fn deleted(&self, pv: &PersistentVolume) {
        let class = pv.spec.as_ref().and_then(|s| s.storage_class_name.clone());
        self.refresh_for(pv, class.as_deref());
    }
}

/// The controller, registered on the shared cache; [`Controller::run`]
/// does the work (under the provisioner's Lease).
pub struct Controller {
    handle: Handle,
    settings: Settings,
    csi: Connection,
    client: Client,
    classes: Informer<StorageClass>,
    /// The Node and CSINode views (none in a node deployment).
    topology: Option<(Informer<PartialObjectMeta<Node>>, Informer<CSINode>)>,
    objects: Informer<CSIStorageCapacity>,
    /// The object of an item as this process last wrote it, until the
    /// cache shows that version or a newer one (no duplicate create, no
    /// update of a stale copy in between).
    written: Arc<Mutex<HashMap<Item, Arc<CSIStorageCapacity>>>>,
}

fn labels_of(m: &PartialObjectMeta<Node>) -> Option<&std::collections::BTreeMap<String, String>> {
    m.metadata.labels.as_ref()
}

/// Sets upstream's three gauges: (goal, current, obsolete). An item just
/// written counts as current while the cache lags behind.
fn set_gauges(t: &mut Tracker, written: &HashMap<Item, Arc<CSIStorageCapacity>>) -> (usize, usize, usize) {
    let (goal, current, obsolete) = t.counts();
    let lagging = written.keys().filter(|i| t.desired().contains(*i) && !t.has_object(i)).count();
    let current = current + lagging;
    metrics::gauge!(upstream::METRIC_GOAL).set(goal as f64);
    metrics::gauge!(upstream::METRIC_CURRENT).set(current as f64);
    metrics::gauge!(upstream::METRIC_OBSOLETE).set(obsolete as f64);
    (goal, current, obsolete)
}

/// Whether the cache's `seen` is at least the version `written`.
fn caught_up(seen: &CSIStorageCapacity, written: &CSIStorageCapacity) -> bool {
    let rv = |o: &CSIStorageCapacity| o.metadata.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok());
    match (rv(seen), rv(written)) {
        (Some(s), Some(w)) => s >= w,
        _ => true,
    }
}

impl Controller {
    /// Registers the views and handlers (before the watches start: no
    /// await), serving until `until` (the module instance's scope). `csi`
    /// is the driver connection, `client` the capacity client.
    pub fn register(
        informers: &Informers,
        settings: Settings,
        csi: Connection,
        client: Client,
        until: &tokio_util::sync::CancellationToken,
    ) -> Controller {
        let shared = Arc::new(Shared {
            tracker: Mutex::default(),
            items: WorkQueue::new(upstream::QUEUE, settings.backoff),
            topology: WorkQueue::new(upstream::QUEUE_TOPOLOGY, settings.backoff),
        });
        let handle = Handle { shared };
        let classes = informers.get::<StorageClass>();
        let topology =
            settings.node_segment.is_none().then(|| (informers.metadata::<Node>(), informers.get::<CSINode>()));
        let objects = crate::modules::views::capacity_objects(
            informers,
            &settings.namespace,
            &settings.driver,
            &settings.managed_by,
        );
        let written: Arc<Mutex<HashMap<Item, Arc<CSIStorageCapacity>>>> = Arc::default();
        {
            let (h, driver) = (handle.clone(), settings.driver.clone());
            classes.on_change(until, move |c| {
                let (old, new) = match c {
                    Change::Updated { old, new } => (Some(*old), *new),
                    other => (None, other.object()),
                };
                if new.provisioner != driver && old.is_none_or(|o| o.provisioner != driver) {
                    return;
                }
                h.shared.topology.add(());
                if let Change::Updated { .. } | Change::Resync(_) = c {
                    h.refresh_class(new.metadata.name.as_deref().unwrap_or_default());
                }
            });
        }
        if let Some((nodes, csinodes)) = &topology {
            let h = handle.clone();
            nodes.on_change(until, move |c| match c {
                Change::Updated { old, new } if labels_of(old) == labels_of(new) => {}
                Change::Resync(_) => {}
                _ => h.shared.topology.add(()),
            });
            let (h, driver) = (handle.clone(), settings.driver.clone());
            csinodes.on_change(until, move |c| match c {
                Change::Updated { old, new }
                    if decide::driver_keys(old, &driver) == decide::driver_keys(new, &driver) => {}
                Change::Resync(_) => {}
                _ => h.shared.topology.add(()),
            });
        }
        {
            // A change of one object is worked out for that object's items
            // only (no reconciliation: a poll's own writes would each cost
            // one over every object).
            let (h, written) = (handle.clone(), written.clone());
            objects.on_change(until, move |c| {
                if let Change::Resync(_) = c {
                    return;
                }
                let o = c.object();
                let mut w = written.lock();
                w.retain(|_, mine| mine.metadata.name != o.metadata.name || (!c.is_deleted() && !caught_up(o, mine)));
                let mut t = h.tracker();
                let mut plan = match c {
                    Change::Deleted(_) => t.remove(o.metadata.name.as_deref().unwrap_or_default()),
                    _ => t.upsert(o),
                };
                plan.queue.retain(|i| !w.contains_key(i));
                if t.ready() {
                    set_gauges(&mut t, &w);
                }
                drop((t, w));
                h.plan(plan);
            });
        }
        Controller { handle, settings, csi, client, classes, topology, objects, written }
    }

    /// The handle the provisioner calls after provisioning and deletion.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// The items that should exist now, from the caches.
    fn compute_desired(&self) -> BTreeSet<Item> {
        let segments = match (&self.settings.node_segment, &self.topology) {
            (Some(segment), _) => BTreeSet::from([segment.clone()]),
            (None, Some((nodes, csinodes))) => {
                let nodes = nodes.store();
                let labels = |n: &str| nodes.get_named(None, n).map(|m| m.metadata.labels.clone().unwrap_or_default());
                let csinodes = csinodes.store().state();
                decide::segments(csinodes.iter().map(|c| &**c), &labels, &self.settings.driver)
            }
            (None, None) => BTreeSet::new(),
        };
        let classes: BTreeSet<String> = self
            .classes
            .store()
            .state()
            .iter()
            .filter(|sc| decide::class_tracked(sc, &self.settings.driver, self.settings.immediate))
            .filter_map(|sc| sc.metadata.name.clone())
            .collect();
        decide::desired(&segments, &classes)
    }

    /// The reconciliation (`csitopology`): what should exist; new items
    /// and items without an object are queued, obsolete and duplicate
    /// objects queued for deletion; the gauges set.
    fn reconcile(&self) {
        let desired = self.compute_desired();
        let written = self.written.lock();
        let mut t = self.handle.tracker();
        let previous = t.desired().len();
        let plan = t.set_desired(desired, &|i| written.contains_key(i));
        let (goal, current, obsolete) = set_gauges(&mut t, &written);
        drop((t, written));
        let (queued, deleting) = (plan.queue.len(), plan.delete.len());
        self.handle.plan(plan);
        if queued > 0 || deleting > 0 || previous != goal {
            tracing::debug!(goal, current, obsolete, queued, deleting, "Capacity: reconciled");
        }
    }

    async fn get_capacity(&self, item: &Item, sc: &StorageClass) -> Result<csi::GetCapacityResponse, tonic::Status> {
        let req = csi::GetCapacityRequest {
            volume_capabilities: Vec::new(),
            parameters: sc.parameters.clone().unwrap_or_default().into_iter().collect(),
            accessible_topology: Some(csi::Topology { segments: item.segment.clone().into_iter().collect() }),
        };
        self.csi.get_capacity(self.settings.timeout, req).await
    }

    fn api(&self) -> Api<CSIStorageCapacity> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    /// The current object of `item`: this process's last write while the
    /// cache lags behind it, else the cache's (the oldest of duplicates).
    fn current(&self, item: &Item) -> Option<Arc<CSIStorageCapacity>> {
        if let Some(w) = self.written.lock().get(item) {
            return Some(w.clone());
        }
        let name = self.handle.tracker().keep(item)?;
        self.objects.store().get_named(Some(&self.settings.namespace), &name)
    }

    fn remember(&self, item: &Item, obj: CSIStorageCapacity) {
        self.written.lock().insert(item.clone(), Arc::new(obj));
    }

    fn forget(&self, item: &Item) {
        self.written.lock().remove(item);
    }

    /// Syncs one item; `stop` abandons a call or write still waiting (for
    /// the capacity client's budget, say) at shutdown: an object not
    /// refreshed is refreshed by the next leader.
    async fn sync_item(&self, item: Item, stop: &CancellationToken) -> Outcome {
        if !self.handle.tracker().is_desired(&item) {
            return Outcome::Done;
        }
        let Some(sc) = self.classes.store().get_named(None, &item.class) else { return Outcome::Done };
        let Some(resp) = stop.run_until_cancelled(self.get_capacity(&item, &sc)).await else { return Outcome::Done };
        let resp = match resp {
            Ok(r) => r,
            Err(s) => {
                tracing::warn!(item = %item, error = %crate::compat::grpc_error_text(&s), "CSI GetCapacity failed");
                return Outcome::Retry;
            }
        };
        let answer = match decide::check_answer(&item, resp.available_capacity, resp.maximum_volume_size) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(item = %item, error = %e, "Unusable GetCapacity answer; not published");
                return Outcome::Retry;
            }
        };
        let owner = self.settings.owner.as_ref();
        match self.current(&item) {
            None => {
                let obj = decide::new_object(&item, answer, &self.settings.driver, &self.settings.managed_by, owner);
                let api = self.api();
                let Some(created) = stop.run_until_cancelled(api.create(&PostParams::default(), &obj)).await else {
                    return Outcome::Done;
                };
                match created {
                    Ok(created) => {
                        tracing::debug!(item = %item, name = ?created.metadata.name, capacity = answer.available, "Created CSIStorageCapacity");
                        self.remember(&item, created);
                        Outcome::Done
                    }
                    Err(e) => {
                        tracing::warn!(item = %item, error = %e, "Creating a CSIStorageCapacity failed");
                        Outcome::Retry
                    }
                }
            }
            Some(obj) => {
                let Some(patch) = decide::update(&obj, answer, owner) else { return Outcome::Done };
                let name = obj.metadata.name.clone().unwrap_or_default();
                let api = self.api();
                let pp = PatchParams::default();
                let Some(patched) = stop.run_until_cancelled(api.patch(&name, &pp, &Patch::Merge(&patch))).await else {
                    return Outcome::Done;
                };
                match patched {
                    Ok(updated) => {
                        tracing::debug!(item = %item, name = %name, capacity = answer.available, "Updated CSIStorageCapacity");
                        self.remember(&item, updated);
                        Outcome::Done
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        // Deleted meanwhile: created again on the retry.
                        self.forget(&item);
                        Outcome::Retry
                    }
                    Err(e) => {
                        tracing::warn!(item = %item, name = %name, error = %e, "Updating a CSIStorageCapacity failed");
                        Outcome::Retry
                    }
                }
            }
        }
    }

    async fn sync_delete(&self, name: String, uid: String, stop: &CancellationToken) -> Outcome {
        if !self.handle.tracker().should_delete(&name, &uid) {
            return Outcome::Done;
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
            ..DeleteParams::default()
        };
        let api = self.api();
        let Some(deleted) = stop.run_until_cancelled(api.delete(&name, &dp)).await else { return Outcome::Done };
        match deleted {
            Ok(_) => {
                tracing::debug!(name = %name, "Deleted an obsolete CSIStorageCapacity");
                Outcome::Done
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Outcome::Done,
            Err(e) => {
                tracing::warn!(name = %name, error = %e, "Deleting a CSIStorageCapacity failed");
                Outcome::Retry
            }
        }
    }

    /// Works until `token`: waits for the caches, then reconciles on every
    /// change, refreshes every object each poll interval, and syncs the
    /// queued objects with `--capacity-threads` workers.
    pub async fn run(self: Arc<Self>, token: CancellationToken) {
        let synced = async {
            let topology = async {
                if let Some((nodes, csinodes)) = &self.topology {
                    tokio::join!(nodes.synced(), csinodes.synced());
                }
            };
            tokio::join!(self.classes.synced(), topology, self.objects.synced())
        };
        if token.run_until_cancelled(synced).await.is_none() {
            return;
        }
        tracing::info!(namespace = %self.settings.namespace, owner = ?self.settings.owner.as_ref().map(|o| format!("{}/{} {}", o.api_version, o.kind, o.name)), "Capacity tracking started");
        metrics::describe_gauge!(upstream::METRIC_GOAL, upstream::METRIC_GOAL_HELP);
        metrics::describe_gauge!(upstream::METRIC_CURRENT, upstream::METRIC_CURRENT_HELP);
        metrics::describe_gauge!(upstream::METRIC_OBSOLETE, upstream::METRIC_OBSOLETE_HELP);
        self.handle.shared.topology.add(());
        let (c1, c2, c3) = (self.clone(), self.clone(), self.clone());
        let poll = async move {
            let period = c3.settings.poll;
            let mut every = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                c3.handle.refresh(|_| true);
            }
        };
        let (stop, stop_workers) = (token.clone(), token.clone());
        tokio::join!(
            self.handle.shared.topology.run(1, token.clone(), move |()| {
                let c = c1.clone();
                async move {
                    c.reconcile();
                    Outcome::Done
                }
            }),
            self.handle.shared.items.run(self.settings.threads.max(1), token.clone(), move |key| {
                let (c, stop) = (c2.clone(), stop_workers.clone());
                let span = tracing::info_span!("capacity", key = ?key);
                async move {
                    match key {
                        Key::Item(i) => c.sync_item(i, &stop).await,
                        Key::Delete(name, uid) => c.sync_delete(name, uid, &stop).await,
                    }
                }
                .instrument(span)
            }),
            async move { stop.run_until_cancelled(poll).await },
        );
    }
}
