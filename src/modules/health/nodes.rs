//! The node watcher (`--enable-node-watcher`): a node that is gone, or
//! NotReady for more than five minutes, gives `NodeFailed` on each bound
//! claim of the driver that its pods use; Ready again gives
//! `NodeRecovered`. A deleted Node is a failed one (upstream
//! dereferences it and crashes).
//!
//! Every node with pods, and every node reported failed, is looked at every
//! `--node-list-add-interval`. In between, only the nodes that call for it
//! are: a Node that came, went or whose Ready condition changed (a
//! heartbeat changes nothing decided on and is ignored), the node of a pod
//! that arrives, a NotReady node when its five minutes end. Looking at a
//! node reads only its own pods (the pods view's index by node name), so
//! a Node update costs the same in any size of cluster.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{api::core::v1::ObjectReference, jiff::Timestamp};
use parking_lot::Mutex;
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    compat::health_monitor as upstream,
    k8s::{
        cached::{CachedPod, CachedPvc},
        cached_node::{CachedNode, NodeReady},
        events::{EventType, Recorder},
        informers::{Change, Informer, Informers},
    },
};

/// What a node's state means for its claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeHealth {
    Healthy,
    /// Gone, or NotReady for longer than the grace.
    Failed,
    /// NotReady, not yet for long enough: looked at again when the grace
    /// `ends`.
    Pending {
        ends: Timestamp,
    },
}

/// The node's health at `now` (`None`: the Node is gone).
pub fn node_health(ready: Option<Option<&NodeReady>>, now: Timestamp, grace: Duration) -> NodeHealth {
    let Some(ready) = ready else { return NodeHealth::Failed };
    let Some(ready) = ready.filter(|r| r.status != "True") else { return NodeHealth::Healthy };
    let since = ready.last_transition_time.as_deref().and_then(|t| t.parse::<Timestamp>().ok());
    match since {
        Some(since) if now.duration_since(since).unsigned_abs() <= grace && since <= now => {
            NodeHealth::Pending { ends: since.checked_add(grace).unwrap_or(now) }
        }
        _ => NodeHealth::Failed,
    }
}

/// The event a node's new health calls for, given whether it was last
/// reported failed: `Some(true)` NodeFailed, `Some(false)` NodeRecovered.
pub fn transition(was_failed: bool, now: NodeHealth) -> Option<bool> {
    match (was_failed, now) {
        (false, NodeHealth::Failed) => Some(true),
        (true, NodeHealth::Healthy) => Some(false),
        _ => None,
    }
}

/// Whether a Node change can change what the watcher decides about the
/// node: it came or went, or its Ready condition (status, transition time)
/// changed. A heartbeat moves only the resourceVersion and times not cached.
pub fn node_change_matters(change: &Change<'_, CachedNode>) -> bool {
    match change {
        Change::Added(_) | Change::Deleted(_) => true,
        Change::Updated { old, new } => old.ready != new.ready,
        Change::Resync(_) => false,
    }
}

/// The index of the pods view: pods by node name.
const PODS_BY_NODE: &str = "node";

/// How long after a grace's end its node is looked at (the grace is over
/// only once it has passed).
const PAST_THE_GRACE: Duration = Duration::from_millis(10);

/// The watcher's views and state.
pub(super) struct NodeWatcher {
    nodes: Informer<CachedNode>,
    pods: Informer<CachedPod>,
    wakes: Arc<Wakes>,
    /// Nodes last reported failed, with the claims that were told.
    failed: Mutex<HashMap<String, Vec<ObjectReference>>>,
    /// NotReady nodes within their grace, with when it ends.
    pending: Mutex<HashMap<String, Timestamp>>,
    work: Work,
}

/// The nodes the watch handlers ask to be looked at, and their wake-up.
#[derive(Default)]
struct Wakes {
    nodes: Mutex<BTreeSet<String>>,
    changed: Notify,
}

impl Wakes {
    fn look_at(&self, node: &str) {
        self.nodes.lock().insert(node.to_string());
        self.changed.notify_one();
    }
}

/// What the looks cost (read by tests): looks finished, pods read.
#[derive(Default)]
struct Work {
    looks: AtomicUsize,
    pods_read: AtomicUsize,
}

impl NodeWatcher {
    /// Asks the shared cache for nodes and for pods with claims on a node.
    /// Its handlers serve until `until` (the module instance's scope).
    pub fn new(informers: &Informers, until: &tokio_util::sync::CancellationToken) -> NodeWatcher {
        let nodes = informers.get::<CachedNode>();
        let pods = informers.view("on-node,using-claims", |p: &CachedPod| {
            p.node_name.is_some() && !p.claims.is_empty() && !p.terminated
        });
        pods.store().add_index(PODS_BY_NODE, |p: &CachedPod| p.node_name.as_deref());
        let wakes = Arc::new(Wakes::default());
        let w = wakes.clone();
        nodes.on_change(until, move |c| {
            if node_change_matters(c)
                && let Some(name) = c.object().metadata.name.as_deref()
            {
                w.look_at(name);
            }
        });
        let w = wakes.clone();
        pods.on_change(until, move |c| {
            // Its node may have failed before the pod came.
            if let Change::Added(p) = c
                && let Some(node) = p.node_name.as_deref()
            {
                w.look_at(node);
            }
        });
        NodeWatcher { nodes, pods, wakes, failed: Mutex::default(), pending: Mutex::default(), work: Work::default() }
    }

    /// Until `token` is cancelled: every node with pods (or reported
    /// failed) every `interval`, and in between the nodes the watch
    /// handlers ask for and those whose grace ended. `claim_of` gives the
    /// reference of a bound claim of the driver (`None`: not one of the
    /// driver's).
    pub async fn run(
        &self,
        interval: Duration,
        events: &Recorder,
        claim_of: impl Fn(&str, &str) -> Option<Arc<CachedPvc>>,
        token: CancellationToken,
    ) {
        if token.run_until_cancelled(async { tokio::join!(self.nodes.synced(), self.pods.synced()) }).await.is_none() {
            return;
        }
        let mut next_pass = Instant::now();
        loop {
            if Instant::now() >= next_pass {
                self.look_at(self.every_node(), events, &claim_of);
                next_pass = after(interval);
            } else {
                self.look_at(self.due(Timestamp::now()), events, &claim_of);
            }
            let wake = self.next_grace_end().map_or(next_pass, |end| end.min(next_pass));
            let wait = async {
                tokio::select! {
                    () = self.wakes.changed.notified() => {}
                    () = tokio::time::sleep_until(wake) => {}
                }
            };
            if token.run_until_cancelled(wait).await.is_none() {
                return;
            }
        }
    }

    /// Nodes with pods, and nodes reported failed or within their grace
    /// (maybe gone now); the handlers' requests so far are covered.
    fn every_node(&self) -> BTreeSet<String> {
        self.wakes.nodes.lock().clear();
        let pods = self.pods.store().state();
        self.work.pods_read.fetch_add(pods.len(), Ordering::Relaxed);
        let mut names: BTreeSet<String> =
            pods.iter().filter_map(|p| p.node_name.as_deref().map(str::to_string)).collect();
        names.extend(self.failed.lock().keys().cloned());
        names.extend(self.pending.lock().keys().cloned());
        names
    }

    /// The nodes the handlers asked for, and those whose grace ended by `now`.
    fn due(&self, now: Timestamp) -> BTreeSet<String> {
        let mut names = std::mem::take(&mut *self.wakes.nodes.lock());
        names.extend(self.pending.lock().iter().filter(|(_, ends)| **ends < now).map(|(n, _)| n.clone()));
        names
    }

    /// When the first grace now running ends.
    fn next_grace_end(&self) -> Option<Instant> {
        let ends = self.pending.lock().values().min().copied()?;
        let left = Duration::try_from(ends.duration_since(Timestamp::now())).unwrap_or_default();
        Some(after(left + PAST_THE_GRACE))
    }

    /// Looks at each of `names`: a node with pods or reported failed is
    /// told on when its health calls for it.
    fn look_at(
        &self,
        names: BTreeSet<String>,
        events: &Recorder,
        claim_of: &impl Fn(&str, &str) -> Option<Arc<CachedPvc>>,
    ) {
        let now = Timestamp::now();
        let (nodes, pods) = (self.nodes.store(), self.pods.store());
        for name in names {
            let on_node = pods.by_index(PODS_BY_NODE, &name);
            self.work.pods_read.fetch_add(on_node.len(), Ordering::Relaxed);
            let was_failed = self.failed.lock().contains_key(&name);
            if on_node.is_empty() && !was_failed {
                self.pending.lock().remove(&name);
                continue;
            }
            let node = nodes.get_named(None, &name);
            let health = node_health(node.as_ref().map(|n| n.ready.as_ref()), now, upstream::NODE_NOT_READY_GRACE);
            match health {
                NodeHealth::Pending { ends } => self.pending.lock().insert(name.clone(), ends),
                _ => self.pending.lock().remove(&name),
            };
            match transition(was_failed, health) {
                Some(true) => {
                    let claims = claims_on(&on_node, claim_of);
                    for (reference, pod_names) in &claims {
                        let (ns, claim) = (reference.namespace.as_deref(), reference.name.as_deref());
                        let message = upstream::message_node_failed(
                            pod_names,
                            claim.unwrap_or_default(),
                            ns.unwrap_or_default(),
                            &name,
                        );
                        tracing::info!(node = %name, "{message}");
                        events.publish(reference.clone(), EventType::Warning, upstream::REASON_NODE_FAILED, &message);
                    }
                    let told = claims.into_iter().map(|(r, _)| r).collect();
                    self.failed.lock().insert(name, told);
                }
                Some(false) => {
                    let told = self.failed.lock().remove(&name).unwrap_or_default();
                    let message = upstream::message_node_recovered(&name);
                    tracing::info!(node = %name, claims = told.len(), "{message}");
                    for reference in told {
                        // Warning, as upstream.
                        events.publish(reference, EventType::Warning, upstream::REASON_NODE_RECOVERED, &message);
                    }
                }
                None => {}
            }
        }
        self.work.looks.fetch_add(1, Ordering::Relaxed);
    }
}

/// `delay` from now (a year for a delay too long to add).
fn after(delay: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(delay).unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// The driver's bound claims the `pods` use, each with its pods' names.
fn claims_on(
    pods: &[Arc<CachedPod>],
    claim_of: &impl Fn(&str, &str) -> Option<Arc<CachedPvc>>,
) -> Vec<(ObjectReference, Vec<String>)> {
    let mut by_claim: BTreeMap<(String, String), (ObjectReference, Vec<String>)> = BTreeMap::new();
    for pod in pods {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        for claim in pod.claims.iter() {
            let Some(c) = claim_of(ns, claim) else { continue };
            let entry = by_claim
                .entry((ns.to_string(), claim.clone()))
                .or_insert_with(|| (crate::k8s::events::reference(&*c), Vec::new()));
            entry.1.push(pod.metadata.name.clone().unwrap_or_default());
        }
    }
    by_claim.into_values().collect()
}

#[cfg(test)]
mod watcher_tests;

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(300);

    fn ready(status: &str, at: &str) -> NodeReady {
        NodeReady { status: status.into(), last_transition_time: Some(at.into()) }
    }

    #[test]
    fn a_node_fails_when_gone_or_not_ready_past_the_grace() {
        let now: Timestamp = "2026-12-05T10:00:00Z".parse().unwrap();
        let r = ready("True", "2026-12-05T09:00:00Z");
        assert_eq!(node_health(Some(Some(&r)), now, GRACE), NodeHealth::Healthy);
        assert_eq!(node_health(Some(None), now, GRACE), NodeHealth::Healthy, "no condition yet: nothing known");
        assert_eq!(node_health(None, now, GRACE), NodeHealth::Failed, "a deleted node");
        let r = ready("False", "2026-12-05T09:58:00Z");
        let ends = "2026-12-05T10:03:00Z".parse().unwrap();
        assert_eq!(node_health(Some(Some(&r)), now, GRACE), NodeHealth::Pending { ends }, "looked at again then");
        let r = ready("Unknown", "2026-12-05T09:54:59Z");
        assert_eq!(node_health(Some(Some(&r)), now, GRACE), NodeHealth::Failed);
        let r = NodeReady { status: "False".into(), last_transition_time: None };
        assert_eq!(node_health(Some(Some(&r)), now, GRACE), NodeHealth::Failed, "no time: as old as can be");
        let r = ready("False", "2026-12-05T10:30:00Z");
        assert_eq!(node_health(Some(Some(&r)), now, GRACE), NodeHealth::Failed, "a future time is not trusted");
    }

    #[test]
    fn events_on_transitions_only() {
        use NodeHealth::*;
        assert_eq!(transition(false, Failed), Some(true));
        assert_eq!(transition(true, Failed), None);
        assert_eq!(transition(true, Healthy), Some(false));
        assert_eq!(transition(false, Healthy), None);
        let pending = Pending { ends: Timestamp::UNIX_EPOCH };
        assert_eq!(transition(true, pending), None, "NotReady again, not long enough: still failed, no event");
        assert_eq!(transition(false, pending), None);
    }

    /// Only a Node that came, went or whose Ready condition changed is
    /// looked at before the next pass; a heartbeat is not.
    #[test]
    fn only_changes_of_the_ready_condition_matter() {
        let node = |rv: &str, status: &str, at: &str| CachedNode {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("n".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ready: Some(ready(status, at)),
        };
        let old = node("1", "True", "2026-12-05T09:00:00Z");
        let heartbeat = node("2", "True", "2026-12-05T09:00:00Z");
        let not_ready = node("2", "False", "2026-12-05T10:00:00Z");
        let flapped = node("2", "True", "2026-12-05T10:00:00Z");
        let no_condition = CachedNode { ready: None, ..heartbeat.clone() };
        let table = [
            (Change::Updated { old: &old, new: &heartbeat }, false, "a heartbeat"),
            (Change::Updated { old: &old, new: &not_ready }, true, "NotReady"),
            (Change::Updated { old: &old, new: &flapped }, true, "Ready again since a new time"),
            (Change::Updated { old: &old, new: &no_condition }, true, "the condition gone"),
            (Change::Added(&old), true, "a new node"),
            (Change::Deleted(&old), true, "a deleted node"),
            (Change::Resync(&old), false, "a resync"),
        ];
        for (change, want, what) in table {
            assert_eq!(node_change_matters(&change), want, "{what}");
        }
    }
}
