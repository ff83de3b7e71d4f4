//! The node watcher (`--enable-node-watcher`): a node that is gone, or
//! NotReady for more than five minutes, gives `NodeFailed` on each bound
//! claim of the driver that its pods use; Ready again gives
//! `NodeRecovered`. Nodes are looked at when they change and every
//! `--node-list-add-interval`. A deleted Node is a failed one (upstream
//! dereferences it and crashes).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{api::core::v1::ObjectReference, jiff::Timestamp};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    compat::health_monitor as up,
    kube::{
        cached::{CachedPod, CachedPvc},
        cached_node::{CachedNode, NodeReady},
        events::{EventType, Recorder},
        informers::{Informer, Informers},
    },
};

/// What a node's state means for its claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeHealth {
    Healthy,
    /// Gone, or NotReady for longer than the grace.
    Failed,
    /// NotReady, not yet for long enough: looked at again later.
    Pending,
}

/// The node's health at `now` (`None`: the Node is gone).
pub fn node_health(ready: Option<Option<&NodeReady>>, now: Timestamp, grace: Duration) -> NodeHealth {
    let Some(ready) = ready else { return NodeHealth::Failed };
    let Some(ready) = ready.filter(|r| r.status != "True") else { return NodeHealth::Healthy };
    let since = ready.last_transition_time.as_deref().and_then(|t| t.parse::<Timestamp>().ok());
    match since {
        Some(since) if now.duration_since(since).unsigned_abs() <= grace && since <= now => NodeHealth::Pending,
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

/// The index of the pods view: pods by node name.
const PODS_BY_NODE: &str = "node";

/// The watcher's views and state.
pub(super) struct NodeWatcher {
    nodes: Informer<CachedNode>,
    pods: Informer<CachedPod>,
    changed: Arc<Notify>,
    /// Nodes last reported failed, with the claims that were told.
    failed: std::sync::Mutex<HashMap<String, Vec<ObjectReference>>>,
}

impl NodeWatcher {
    /// Asks the shared cache for nodes and for pods with claims on a node.
    pub fn new(informers: &Informers) -> NodeWatcher {
        let nodes = informers.get::<CachedNode>();
        let pods = informers.view("on-node,using-claims", |p: &CachedPod| {
            p.node_name.is_some() && !p.claims.is_empty() && !p.terminated
        });
        pods.store().add_index(PODS_BY_NODE, |p: &CachedPod| p.node_name.as_deref());
        let changed = Arc::new(Notify::new());
        let n = changed.clone();
        nodes.on_change(move |_| n.notify_one());
        NodeWatcher { nodes, pods, changed, failed: Default::default() }
    }

    /// Until `token` is cancelled: every node when one changes and every
    /// `interval`. `claim_of` gives the reference of a bound claim of the
    /// driver (`None`: not one of the driver's).
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
        loop {
            self.examine(events, &claim_of);
            let wake = async {
                tokio::select! {
                    () = self.changed.notified() => {}
                    () = tokio::time::sleep(interval) => {}
                }
            };
            if token.run_until_cancelled(wake).await.is_none() {
                return;
            }
        }
    }

    fn examine(&self, events: &Recorder, claim_of: &impl Fn(&str, &str) -> Option<Arc<CachedPvc>>) {
        let now = Timestamp::now();
        let nodes = self.nodes.store();
        let pods = self.pods.store();
        // Nodes with pods, and nodes reported failed before (maybe gone now).
        let mut names: Vec<String> =
            pods.state().iter().filter_map(|p| p.node_name.as_deref().map(str::to_string)).collect();
        names.extend(self.failed.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned());
        names.sort();
        names.dedup();
        for name in names {
            let node = nodes.get_named(None, &name);
            let health = node_health(node.as_ref().map(|n| n.ready.as_ref()), now, up::NODE_NOT_READY_GRACE);
            let was_failed = self.failed.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&name);
            match transition(was_failed, health) {
                Some(true) => {
                    let claims = claims_on(&pods.by_index(PODS_BY_NODE, &name), claim_of);
                    for (reference, pod_names) in &claims {
                        let (ns, claim) = (reference.namespace.as_deref(), reference.name.as_deref());
                        let message = up::message_node_failed(
                            pod_names,
                            claim.unwrap_or_default(),
                            ns.unwrap_or_default(),
                            &name,
                        );
                        tracing::info!(node = %name, "{message}");
                        events.publish(reference.clone(), EventType::Warning, up::REASON_NODE_FAILED, &message);
                    }
                    let told = claims.into_iter().map(|(r, _)| r).collect();
                    self.failed.lock().unwrap_or_else(|e| e.into_inner()).insert(name, told);
                }
                Some(false) => {
                    let told = self.failed.lock().unwrap_or_else(|e| e.into_inner()).remove(&name).unwrap_or_default();
                    let message = up::message_node_recovered(&name);
                    tracing::info!(node = %name, claims = told.len(), "{message}");
                    for reference in told {
                        // Warning, as upstream.
                        events.publish(reference, EventType::Warning, up::REASON_NODE_RECOVERED, &message);
                    }
                }
                None => {}
            }
        }
    }
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
                .or_insert_with(|| (crate::kube::events::reference(&*c), Vec::new()));
            entry.1.push(pod.metadata.name.clone().unwrap_or_default());
        }
    }
    by_claim.into_values().collect()
}

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
        assert_eq!(node_health(Some(Some(&r)), now, GRACE), NodeHealth::Pending);
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
        assert_eq!(transition(true, Pending), None, "NotReady again, not long enough: still failed, no event");
        assert_eq!(transition(false, Pending), None);
    }
}
