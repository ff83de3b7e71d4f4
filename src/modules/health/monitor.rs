//! The leader's work: a pass over the driver's bound volumes every interval
//! (one paginated list in list mode, one call per volume, `--worker-threads`
//! at once, in get mode), and what each answer writes.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{Event, ObjectReference, PersistentVolumeClaim},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    config::HealthMonitorFlags,
    decide::{self, Form, Mode, Observed, Plan, Reported},
    gauges::Gauges,
    nodes::NodeWatcher,
    status_api::StatusApi,
};
use crate::{
    compat::{health_monitor as upstream, provisioner},
    csi::{Connection, DriverInfo},
    k8s::{
        cached::{CachedPv, CachedPvc},
        events::{EventType, Recorder},
        informers::Informer,
    },
};

/// Page size of a list pass (0: the driver chooses).
const PAGE: i32 = 0;

/// Claims of the driver, or with no provisioner annotation (bound to a
/// pre-created PV: its PV decides).
pub fn claim_may_be_for_driver(meta: &ObjectMeta, driver: &str) -> bool {
    let ann = |k: &str| meta.annotations.as_ref().and_then(|a| a.get(k)).map(String::as_str);
    match ann(provisioner::ANN_STORAGE_PROVISIONER).or_else(|| ann(provisioner::ANN_BETA_STORAGE_PROVISIONER)) {
        Some(p) => p == driver || ann(provisioner::ANN_MIGRATED_TO) == Some(driver),
        None => true,
    }
}

/// One monitored volume: its handle and its bound claim.
struct Target {
    handle: String,
    claim: Arc<CachedPvc>,
    reference: ObjectReference,
}

impl Target {
    fn key(&self) -> String {
        let m = &self.claim.metadata;
        format!("{}/{}", m.namespace.as_deref().unwrap_or_default(), m.name.as_deref().unwrap_or_default())
    }
    fn uid(&self) -> &str {
        self.claim.metadata.uid.as_deref().unwrap_or_default()
    }
}

pub(super) struct Monitor {
    pub cfg: HealthMonitorFlags,
    pub plan: Plan,
    pub driver: Arc<DriverInfo>,
    /// The module's ledger (its start-up phase).
    pub ledger: crate::debug::Ledger,
    pub csi: Connection,
    pub client: Client,
    pub events: Recorder,
    pub pvs_informer: Informer<CachedPv>,
    pub claims_informer: Informer<CachedPvc>,
    /// The events form: what was last reported, by claim UID.
    pub reported: Mutex<HashMap<String, Reported>>,
    pub status: StatusApi,
    /// With `--enable-node-watcher`.
    pub nodes: Option<NodeWatcher>,
    pub gauges: Arc<Gauges>,
}

impl Monitor {
    /// Until `token` is cancelled: the volume passes and, when enabled,
    /// the node watcher.
    pub async fn lead(self: Arc<Self>, token: CancellationToken) {
        let nodes = async {
            if let Some(n) = &self.nodes {
                let claim_of = |ns: &str, name: &str| self.driver_claim(ns, name);
                n.run(self.cfg.node_list_add_interval, &self.events, claim_of, token.clone()).await
            }
        };
        tokio::join!(self.volumes(token.clone()), nodes);
    }

    /// A bound claim on a PV of the driver.
    fn driver_claim(&self, ns: &str, name: &str) -> Option<Arc<CachedPvc>> {
        let claim = self.claims_informer.store().get_named(Some(ns), name)?;
        let pv = claim.spec.as_ref()?.volume_name.as_deref()?;
        self.pvs_informer.store().get_named(None, pv).map(|_| claim)
    }

    /// Until `token` is cancelled: recall what was reported, then a pass
    /// every interval (counted from the end of the previous one, as
    /// upstream).
    async fn volumes(&self, token: CancellationToken) {
        let synced = async { tokio::join!(self.pvs_informer.synced(), self.claims_informer.synced()) };
        if token.run_until_cancelled(synced).await.is_none() {
            return;
        }
        if token.run_until_cancelled(self.recall()).await.is_none() {
            return;
        }
        let interval = match self.plan.mode {
            Mode::List => self.cfg.list_volumes_interval,
            Mode::Get => self.cfg.monitor_interval,
        };
        tracing::info!(?interval, "Caches synced; monitoring volume health");
        self.ledger.set_phase(crate::debug::Phase::Running);
        loop {
            if token.run_until_cancelled(self.pass()).await.is_none() {
                return;
            }
            if token.run_until_cancelled(tokio::time::sleep(interval)).await.is_none() {
                return;
            }
        }
    }

    /// What this monitor's own events last said, per claim: two lists
    /// scoped by reason and source (not a cache of every Event).
    async fn recall(&self) {
        let source = upstream::event_component(&self.driver.name);
        let api: Api<Event> = Api::all(self.client.clone());
        let mut past = Vec::new();
        for reason in [upstream::REASON_ABNORMAL, upstream::REASON_NORMAL] {
            let fields = format!("reason={reason},source={source},involvedObject.kind=PersistentVolumeClaim");
            let mut params = ListParams::default().fields(&fields).limit(500);
            loop {
                let page = match api.list(&params).await {
                    Ok(page) => page,
                    Err(e) => {
                        tracing::warn!("Listing this monitor's past {reason} events failed: {e}");
                        break;
                    }
                };
                past.extend(page.items.iter().filter_map(past_event));
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(c) => params = params.continue_token(&c),
                    None => break,
                }
            }
        }
        let recalled = decide::recall(&past);
        tracing::debug!(claims = recalled.len(), "Recalled the last reported health from past events");
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        for (uid, r) in recalled {
            reported.entry(uid).or_insert(r);
        }
    }

    /// The bound volumes of the driver with their claims, from the cache.
    fn targets(&self) -> Vec<Target> {
        let claims = self.claims_informer.store();
        let mut out = Vec::new();
        for pv in self.pvs_informer.store().state() {
            let bound = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            let Some(spec) = pv.spec.as_ref().filter(|_| bound) else { continue };
            let (Some(csi), Some(r)) = (spec.csi.as_ref(), spec.claim_ref.as_deref()) else { continue };
            let (Some(ns), Some(name)) = (r.namespace.as_deref(), r.name.as_deref()) else { continue };
            let Some(claim) = claims.get_named(Some(ns), name) else { continue };
            let same_uid = r.uid.is_none() || r.uid == claim.metadata.uid;
            let pv_name = pv.metadata.name.as_deref();
            let claim_bound_here = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == pv_name;
            if !same_uid || !claim_bound_here {
                continue;
            }
            let reference = crate::k8s::events::reference(&*claim);
            out.push(Target { handle: csi.volume_handle.to_string(), claim, reference });
        }
        out
    }

    async fn pass(&self) {
        let targets = self.targets();
        let live: HashSet<String> = targets.iter().map(|t| t.key()).collect();
        self.gauges.retain(&live);
        // Claims that are gone (or no longer bound to the driver) are forgotten.
        let uids: HashSet<&str> = targets.iter().map(|t| t.uid()).collect();
        self.reported.lock().unwrap_or_else(|e| e.into_inner()).retain(|uid, _| uids.contains(uid.as_str()));
        match self.plan.mode {
            Mode::List => self.list_pass(targets).await,
            Mode::Get => {
                futures::stream::iter(targets)
                    .for_each_concurrent(self.cfg.worker_threads, |t| {
                        let span = tracing::info_span!("pvc", key = %t.key());
                        async move {
                            if let Some(observed) = self.get(&t.handle).await {
                                self.apply(&t, &observed).await;
                            }
                        }
                        .instrument(span)
                    })
                    .await
            }
        }
    }

    /// Every page of the driver's list under one `--timeout`, then the
    /// answer for each bound volume. A volume missing from a ListVolumes
    /// answer is skipped (upstream); ControllerListVolumeHealth lists the
    /// abnormal volumes only, so a volume missing there is healthy, and one
    /// that was abnormal is first asked for alone when the driver can
    /// (`confirm_missing`).
    async fn list_pass(&self, targets: Vec<Target>) {
        let listed = match tokio::time::timeout(self.cfg.timeout, self.list_all()).await {
            Ok(Ok(listed)) => listed,
            Ok(Err(e)) => return tracing::warn!("Listing volume health failed: {e}"),
            Err(_) => return tracing::warn!("Listing volume health did not finish within {:?}", self.cfg.timeout),
        };
        for t in &targets {
            let span = tracing::info_span!("pvc", key = %t.key());
            async {
                match listed.get(&t.handle) {
                    Some(Some(observed)) => self.apply(t, observed).await,
                    Some(None) => {}
                    None if self.plan.form == Form::Condition => {}
                    None if self.plan.confirm_missing && self.was_abnormal(t) => {
                        if let Some(observed) = self.get(&t.handle).await {
                            self.apply(t, &observed).await;
                        }
                    }
                    None => self.apply(t, &Observed::Healthy).await,
                }
            }
            .instrument(span)
            .await
        }
    }

    /// volume ID → what the list said (`None`: listed without a condition).
    async fn list_all(&self) -> Result<HashMap<String, Option<Observed>>, tonic::Status> {
        let mut out = HashMap::new();
        let mut token = String::new();
        loop {
            let next = match self.plan.form {
                Form::Condition => {
                    let (page, next) =
                        self.csi.list_volumes_with_condition(self.cfg.timeout, PAGE, token.clone()).await?;
                    for (id, c) in page {
                        let observed = c.and_then(|c| decide::from_condition(Some(c.abnormal), &c.message));
                        out.insert(id, observed);
                    }
                    next
                }
                Form::Health => {
                    let (page, next) =
                        self.csi.controller_list_volume_health(self.cfg.timeout, PAGE, token.clone()).await?;
                    for h in page {
                        out.insert(h.volume_id.clone(), Some(observed_health(h)));
                    }
                    next
                }
            };
            if next.is_empty() || next == token {
                return Ok(out);
            }
            token = next;
        }
    }

    /// One volume's health (`None`: the call failed, or said nothing).
    async fn get(&self, handle: &str) -> Option<Observed> {
        let answer = match self.plan.form {
            Form::Condition => self
                .csi
                .controller_get_volume_with_condition(self.cfg.timeout, handle.to_string())
                .await
                .map(|c| c.and_then(|c| decide::from_condition(Some(c.abnormal), &c.message))),
            Form::Health => self
                .csi
                .controller_get_volume_health(self.cfg.timeout, handle.to_string())
                .await
                .map(|h| Some(observed_health(h))),
        };
        answer.unwrap_or_else(|e| {
            // As upstream: a failed call produces no event.
            tracing::warn!(volume = handle, "Getting the volume's health failed: {e}");
            None
        })
    }

    fn was_abnormal(&self, t: &Target) -> bool {
        let reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        matches!(reported.get(t.uid()), Some(Reported::Abnormal(_))) || current_status(&t.claim).is_some()
    }

    /// Writes what `observed` changes: the claim's status when the form
    /// and the apiserver allow, else an event.
    async fn apply(&self, t: &Target, observed: &Observed) {
        let (ns, name) =
            (t.reference.namespace.as_deref().unwrap_or_default(), t.reference.name.as_deref().unwrap_or_default());
        let statuses = match observed {
            Observed::Healthy => Vec::new(),
            Observed::Abnormal { conditions, .. } => conditions.iter().map(|c| c.status.clone()).collect(),
        };
        self.gauges.set(ns, name, statuses);
        if self.plan.form == Form::Health && self.status.served(&self.client, ns, name).await {
            return self.write_status(t, ns, name, observed).await;
        }
        let (event, next) = {
            let reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            decide::event_for(reported.get(t.uid()), observed)
        };
        if let Some(e) = event {
            let kind = if e.warning { EventType::Warning } else { EventType::Normal };
            tracing::info!(reason = e.reason, "{}", e.message);
            self.events.publish(t.reference.clone(), kind, e.reason, &e.message);
        }
        self.reported.lock().unwrap_or_else(|e| e.into_inner()).insert(t.uid().to_string(), next);
    }

    async fn write_status(&self, t: &Target, ns: &str, name: &str, observed: &Observed) {
        let current = current_status(&t.claim);
        let now = Timestamp::now().to_string();
        let Some(patch) = decide::status_patch(current.as_ref(), observed, &now) else { return };
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        let params = PatchParams { field_manager: Some(upstream::FIELD_MANAGER.into()), ..Default::default() };
        let merge = Patch::Merge(&patch);
        let write = api.patch_status(name, &params, &merge);
        match tokio::time::timeout(self.cfg.timeout, write).await {
            Ok(Ok(_)) => tracing::info!("Claim health status written: {}", patch["status"]["healthStatus"]),
            Ok(Err(e)) => tracing::warn!("Writing the claim's health status failed: {e}"),
            Err(_) => tracing::warn!("Writing the claim's health status did not finish within {:?}", self.cfg.timeout),
        }
    }
}

/// The claim's `status.healthStatus`, as the cache has it.
fn current_status(claim: &CachedPvc) -> Option<decide::HealthStatus> {
    let v = claim.status.as_ref()?.health_status.as_deref()?;
    serde_json::from_value::<decide::HealthStatus>(v.clone()).ok().filter(|s| !s.health_conditions.is_empty())
}

fn observed_health(h: crate::csi::VolumeHealth) -> Observed {
    decide::from_health(h.conditions.into_iter().map(|c| decide::Condition {
        status: decide::status_name(c.status).to_string(),
        reason: c.reason,
        message: c.message,
    }))
}

/// One of the listed events, as [`decide::recall`] reads it.
fn past_event(e: &Event) -> Option<decide::PastEvent> {
    let last_seen = e
        .last_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()))?;
    Some(decide::PastEvent {
        claim_uid: e.involved_object.uid.clone()?,
        reason: e.reason.clone()?,
        message: e.message.clone().unwrap_or_default(),
        last_seen,
    })
}
