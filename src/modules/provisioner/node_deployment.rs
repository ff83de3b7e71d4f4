//! `--node-deployment`: one provisioner per node, next to a driver that
//! serves node-local volumes. Each instance provisions only the claims whose
//! selected node is its own (`$NODE_NAME`); instances race for Immediate
//! claims by writing `volume.kubernetes.io/selected-node` (optimistic
//! concurrency: the write names the claim's resourceVersion, so exactly one
//! wins) after a jittered, exponentially growing delay; and each deletes only
//! PVs whose node affinity its node satisfies. The topology is the driver's
//! own `NodeGetInfo` answer: no Node or CSINode watch.
//!
//! The decisions are pure and table-tested here; the race's I/O (the
//! capacity pre-check and the claim write) is the `impl Provisioner` below.

use parking_lot::Mutex;
use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    core::v1::{NodeSelectorRequirement, PersistentVolumeClaim, VolumeNodeAffinity},
    storage::v1::StorageClass,
};

use super::{
    topology::{self, ClusterView, Request, TopologyError},
    topology_index::TopologyIndex,
};
use crate::{
    compat::provisioner as upstream,
    csi::proto::csi::v1::{self as csi, NodeGetInfoResponse},
    debug::WaitingFor,
    modules::kit::{Done, Reconciled, Wait},
};

/// What this instance knows about its node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeDeployment {
    /// `$NODE_NAME`.
    pub node: String,
    /// The driver's topology segment of this node (`NodeGetInfo.accessible_topology`).
    pub segment: Option<BTreeMap<String, String>>,
    /// `--node-deployment-immediate-binding`.
    pub immediate_binding: bool,
    /// `--node-deployment-base-delay`.
    pub base_delay: Duration,
    /// `--node-deployment-max-delay`.
    pub max_delay: Duration,
}

/// `$NODE_NAME` when `--node-deployment` is on; upstream's fatal text without it.
pub fn node_name(enabled: bool, env: Option<&str>) -> Result<Option<String>, String> {
    match (enabled, env) {
        (false, _) => Ok(None),
        (true, Some(n)) if !n.is_empty() => Ok(Some(n.to_string())),
        (true, _) => Err(upstream::TEXT_NODE_NAME_MISSING.to_string()),
    }
}

/// The `ProvisioningFailed` text of a failed owner write: upstream
/// `Provision`'s "node check failed" around `checkNode`'s and `becomeOwner`'s
/// wrapping of the update error.
pub fn owner_write_failed_text(claim_key: &str, node: &str, error: &str) -> String {
    format!("node check failed: PVC {claim_key}: selecting node \"{node}\" for PVC failed: {error}")
}

impl NodeDeployment {
    /// From the flags, the node name and the driver's `NodeGetInfo` answer.
    pub fn new(node: String, info: &NodeGetInfoResponse, flags: &super::config::ProvisionerFlags) -> NodeDeployment {
        let segment = info
            .accessible_topology
            .as_ref()
            .map(|t| t.segments.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<BTreeMap<_, _>>());
        NodeDeployment {
            node,
            segment,
            immediate_binding: flags.node_deployment_immediate_binding,
            base_delay: flags.node_deployment_base_delay,
            max_delay: flags.node_deployment_max_delay,
        }
    }

    /// Whether a claim (by its selected node) is still this instance's
    /// concern: not yet on a node, or on this one. The claim view keeps only those.
    pub fn claim_in_view(&self, selected: Option<&str>) -> bool {
        selected.is_none_or(|n| n.is_empty() || n == self.node)
    }

    /// Accessibility requirements from the static view of this one node
    /// (upstream fakes a Node and a CSINode from `NodeGetInfo`): the claim
    /// is provisioned here, so its topology is this node's, whatever its
    /// binding mode.
    pub fn requirements(
        &self,
        pvc_name: &str,
        allowed: &[topology::Segment],
        strict: bool,
        immediate_topology: bool,
    ) -> Result<Option<csi::TopologyRequirement>, TopologyError> {
        let segment = self.segment.clone().unwrap_or_default();
        let keys: Vec<String> = segment.keys().cloned().collect();
        let node = self.node.as_str();
        let labels = |n: &str| (n == node).then(|| segment.clone());
        let node_keys = |n: &str| (n == node).then(|| keys.clone());
        let mut index = TopologyIndex::default();
        index.set_node(node, Some(keys.clone()), Some(&segment));
        let view = ClusterView { node_labels: &labels, node_keys: &node_keys, driver_nodes: &index };
        let req =
            Request { late_binding: true, selected_node: Some(node), strict, immediate_topology, allowed, pvc_name };
        topology::requirements(&req, &view)
    }
}

/// What a node instance does with a claim it would otherwise provision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// Selected for this node: provision.
    Ours,
    /// Another node's, or not to be raced for: leave it.
    NotOurs,
    /// Immediate binding, no node yet: try to become its owner.
    Race,
}

/// Upstream `checkNode` for a claim: by its selected node and its class's binding mode.
pub fn ownership(selected: Option<&str>, node: &str, immediate_class: bool, immediate_binding: bool) -> Ownership {
    match selected.filter(|n| !n.is_empty()) {
        Some(n) if n == node => Ownership::Ours,
        Some(_) => Ownership::NotOurs,
        None if immediate_class && immediate_binding => Ownership::Race,
        None => Ownership::NotOurs,
    }
}

/// Whether a class binds immediately (an absent mode is Immediate, the API default).
pub fn immediate(sc: &StorageClass) -> bool {
    sc.volume_binding_mode.as_deref().is_none_or(|m| m == "Immediate")
}

/// The wait before attempt `attempt` (0-based) to own a claim: `base ×
/// 2^attempt` capped at `max`, minus a jitter of up to `base` (`jitter` in
/// [0, 1)), never negative. The first attempt waits (0, base]: instances
/// that saw the claim at once spread over the base delay.
pub fn race_delay(attempt: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    let exp = base.saturating_mul(2u32.saturating_pow(attempt.min(31)));
    let delay = exp.min(max);
    delay.saturating_sub(base.mul_f64(jitter.clamp(0.0, 1.0)))
}

/// Whether a PV's node affinity is satisfied by this node's topology
/// (upstream `VolumeIsAccessible`): no topology or no affinity means
/// accessible; terms are ORed, a term's expressions ANDed; `matchFields`
/// (a node's name) never match the driver's topology.
pub fn volume_accessible(affinity: Option<&VolumeNodeAffinity>, segment: Option<&BTreeMap<String, String>>) -> bool {
    let (Some(required), Some(labels)) = (affinity.and_then(|a| a.required.as_ref()), segment) else {
        return true;
    };
    required.node_selector_terms.iter().any(|t| {
        let exprs = t.match_expressions.as_deref().unwrap_or_default();
        let fields = t.match_fields.as_deref().unwrap_or_default();
        (!exprs.is_empty() || !fields.is_empty()) && fields.is_empty() && exprs.iter().all(|e| matches(e, labels))
    })
}

fn matches(e: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = e.values.as_deref().unwrap_or_default();
    let value = labels.get(&e.key);
    let number = |s: &str| s.parse::<i64>().ok();
    match e.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => match (value.and_then(|v| number(v)), values.first().and_then(|v| number(v))) {
            (Some(v), Some(bound)) if values.len() == 1 => {
                if e.operator == "Gt" {
                    v > bound
                } else {
                    v < bound
                }
            }
            _ => false,
        },
        _ => false,
    }
}

/// The identity every PV of this instance records: upstream's with `-<node>`.
pub fn identity(base: String, node: Option<&str>) -> String {
    match node {
        Some(n) => format!("{base}-{n}"),
        None => base,
    }
}

/// One claim's race: attempts so far and when the next is due.
#[derive(Clone, Copy, Debug)]
struct Race {
    uid_hash: u64,
    attempts: u32,
    due: Instant,
}

/// The races in progress, by claim key (a claim leaves the view when another
/// node wins; its race is forgotten then).
#[derive(Default)]
pub(super) struct Races(Mutex<HashMap<String, Race>>);

fn hash(s: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// A jitter in [0, 1) without a random-number crate: the sub-second clock
/// mixed with the claim (instances on different nodes differ by their
/// clocks' nanoseconds and their node names).
fn jitter(key: &str, node: &str) -> f64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let mixed = hash(&format!("{nanos}/{key}/{node}"));
    (mixed >> 11) as f64 / (1u64 << 53) as f64
}

impl Races {
    pub(super) fn forget(&self, key: &str) {
        self.0.lock().remove(key);
    }

    /// The wait before the claim's next attempt is due (`None`: due now).
    fn wait(&self, key: &str, uid: &str, nd: &NodeDeployment, now: Instant) -> Option<Duration> {
        let mut races = self.0.lock();
        let uid_hash = hash(uid);
        let race = races.entry(key.to_string()).or_insert_with(|| Race {
            uid_hash,
            attempts: 0,
            due: now + race_delay(0, nd.base_delay, nd.max_delay, jitter(key, &nd.node)),
        });
        if race.uid_hash != uid_hash {
            // Re-created under the same name: a new race.
            *race = Race {
                uid_hash,
                attempts: 0,
                due: now + race_delay(0, nd.base_delay, nd.max_delay, jitter(key, &nd.node)),
            };
        }
        race.due.checked_duration_since(now).filter(|d| !d.is_zero())
    }

    /// An attempt did not make this node the owner: the next one waits longer.
    fn lost(&self, key: &str, nd: &NodeDeployment, now: Instant) -> Duration {
        let mut races = self.0.lock();
        let Some(race) = races.get_mut(key) else { return nd.base_delay };
        race.attempts = race.attempts.saturating_add(1);
        let delay = race_delay(race.attempts, nd.base_delay, nd.max_delay, jitter(key, &nd.node));
        race.due = now + delay;
        delay
    }
}

impl super::Provisioner {
    /// Tries to make this node the owner of an Immediate claim that has no
    /// node yet (upstream `becomeOwner`): waits its turn, checks capacity,
    /// then writes the selected-node annotation conditioned on the cached
    /// resourceVersion. Whoever wins, the claim changes and comes back: to
    /// this instance as its own, or leaving its view.
    pub(super) async fn race(&self, key: &str, pvc: &PersistentVolumeClaim, sc: &StorageClass) -> Reconciled {
        let Some(nd) = &self.node else { return Ok(Done::Finished) };
        let uid = pvc.metadata.uid.clone().unwrap_or_default();
        if let Some(wait) = self.races.wait(key, &uid, nd, Instant::now()) {
            tracing::trace!(claim = %key, ?wait, "Waiting before trying to own the claim");
            return Err(Wait::on(WaitingFor::Retry).after(wait));
        }
        if !self.has_capacity(key, pvc, sc).await {
            let wait = self.races.lost(key, nd, Instant::now());
            tracing::debug!(claim = %key, ?wait, "Not enough capacity on this node for the claim");
            return Err(Wait::on(WaitingFor::Retry).after(wait));
        }
        // Without a resourceVersion the write would not be conditional.
        let Some(version) = pvc.metadata.resource_version.as_deref().filter(|v| !v.is_empty()) else {
            return Err(Wait::on(WaitingFor::Retry));
        };
        let ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
        let name = pvc.metadata.name.as_deref().unwrap_or_default();
        let api: kube::Api<PersistentVolumeClaim> = kube::Api::namespaced(self.client.clone(), ns);
        // The resourceVersion makes the merge patch conditional: a claim
        // another instance changed meanwhile answers 409.
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": version,
            "annotations": {upstream::ANN_SELECTED_NODE: nd.node},
        }});
        // A role with `update` but not `patch` (upstream's RBAC): the same
        // write as an update carrying the version we judged (409 on a change).
        let written =
            crate::k8s::update_fallback::patch_else_update(&api, name, &kube::api::Patch::Merge(&patch), |claim| {
                claim.metadata.resource_version = Some(version.to_string());
                let annotations = claim.metadata.annotations.get_or_insert_with(Default::default);
                annotations.insert(upstream::ANN_SELECTED_NODE.to_string(), nd.node.clone());
                true
            })
            .await;
        match written {
            Ok(()) => {
                tracing::info!(claim = %key, node = %nd.node, "Became the owner of the claim");
                self.races.forget(key);
                Ok(Done::Finished)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let wait = self.races.lost(key, nd, Instant::now());
                tracing::debug!(claim = %key, ?wait, "Conflict while trying to own the claim; trying again");
                Err(Wait::on(WaitingFor::Retry).after(wait))
            }
            Err(e) => {
                let wait = self.races.lost(key, nd, Instant::now());
                let msg = owner_write_failed_text(key, &nd.node, &super::api_error_text(&e));
                self.event_pvc(pvc, crate::k8s::events::EventType::Warning, upstream::REASON_PROVISIONING_FAILED, &msg);
                Err(Wait::on(WaitingFor::ApiServer).after(wait))
            }
        }
    }

    /// Upstream `checkCapacity`: whether the driver reports room for the
    /// claim on this node now. Anything that prevents the check (no size,
    /// a claim that cannot be planned, a failed GetCapacity) lets the race
    /// go on: provisioning then reports the problem.
    async fn has_capacity(&self, key: &str, pvc: &PersistentVolumeClaim, sc: &StorageClass) -> bool {
        let Some(nd) = &self.node else { return true };
        let plan = match super::decide::plan(pvc, sc, &self.driver, &self.settings, None) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(claim = %key, error = %e, "Proceeding without a capacity check");
                return true;
            }
        };
        if plan.requested_bytes == 0 {
            return true;
        }
        let requisite = match self.accessibility(pvc, sc) {
            Ok(r) => r.map(|r| r.requisite).unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        let topologies: Vec<Option<csi::Topology>> =
            if requisite.is_empty() { vec![None] } else { requisite.into_iter().map(Some).collect() };
        for accessible_topology in topologies {
            let req = csi::GetCapacityRequest {
                volume_capabilities: plan.request.volume_capabilities.clone(),
                parameters: plan.request.parameters.clone(),
                accessible_topology,
            };
            let resp = self.csi.get_capacity(self.cfg.timeout, req).await;
            match resp {
                Ok(r) if plan.requested_bytes <= r.available_capacity => return true,
                Ok(_) => {}
                Err(s) => {
                    tracing::debug!(claim = %key, node = %nd.node, error = %super::status_text(&s), "Proceeding although the capacity check failed");
                    return true;
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorTerm};

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn node_name_is_required_with_the_flag() {
        assert_eq!(node_name(false, None), Ok(None));
        assert_eq!(node_name(false, Some("n1")), Ok(None));
        assert_eq!(node_name(true, Some("n1")), Ok(Some("n1".into())));
        for env in [None, Some("")] {
            assert_eq!(
                node_name(true, env),
                Err("The NODE_NAME environment variable must be set when using --enable-node-deployment.".into())
            );
        }
    }

    #[test]
    fn owner_write_failure_text() {
        let rows = [(
            "ns/c",
            "n1",
            "Internal error occurred: boom",
            "node check failed: PVC ns/c: selecting node \"n1\" for PVC failed: Internal error occurred: boom",
        )];
        for (key, node, error, want) in rows {
            assert_eq!(owner_write_failed_text(key, node, error), want);
        }
    }

    #[test]
    fn ownership_by_selected_node_and_binding() {
        use Ownership::*;
        let rows = [
            (Some("n1"), true, true, Ours),
            (Some("n1"), false, true, Ours),
            (Some("n2"), true, true, NotOurs),
            (Some(""), true, true, Race),
            (None, true, true, Race),
            (None, true, false, NotOurs),
            (None, false, true, NotOurs),
        ];
        for (selected, immediate_class, flag, want) in rows {
            assert_eq!(ownership(selected, "n1", immediate_class, flag), want, "{selected:?} {immediate_class} {flag}");
        }
    }

    #[test]
    fn the_race_delay_grows_and_keeps_its_jitter_within_the_base() {
        let rows = [
            (0, 0.0, 1000),
            (0, 0.5, 500),
            (0, 0.75, 250),
            (1, 0.0, 2000),
            (1, 0.25, 1750),
            (2, 0.5, 3500),
            (3, 0.0, 6000),
            (9, 0.5, 5500),
            (40, 0.0, 6000),
        ];
        for (attempt, j, ms) in rows {
            assert_eq!(race_delay(attempt, S, 6 * S, j), Duration::from_millis(ms), "attempt {attempt} jitter {j}");
        }
        assert_eq!(race_delay(0, S, 6 * S, 1.0), Duration::ZERO);
        assert_eq!(race_delay(5, 20 * S, 60 * S, 0.0), 60 * S, "the defaults cap at one minute");
    }

    #[test]
    fn jitter_is_a_fraction() {
        for i in 0..100 {
            let j = jitter(&format!("ns/c{i}"), "node");
            assert!((0.0..1.0).contains(&j), "{j}");
        }
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn affinity(terms: Vec<Vec<NodeSelectorRequirement>>) -> VolumeNodeAffinity {
        VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: terms
                    .into_iter()
                    .map(|e| NodeSelectorTerm { match_expressions: Some(e), match_fields: None })
                    .collect(),
            }),
        }
    }

    #[test]
    fn volume_accessible_by_node_affinity() {
        let me: BTreeMap<String, String> =
            [("zone".to_string(), "a".to_string()), ("size".to_string(), "5".to_string())].into();
        let rows = [
            (vec![vec![req("zone", "In", &["a"])]], true),
            (vec![vec![req("zone", "In", &["b"])]], false),
            (vec![vec![req("zone", "In", &["b"])], vec![req("zone", "In", &["a", "c"])]], true),
            (vec![vec![req("zone", "In", &["a"]), req("rack", "Exists", &[])]], false),
            (vec![vec![req("zone", "NotIn", &["b"]), req("rack", "DoesNotExist", &[])]], true),
            (vec![vec![req("size", "Gt", &["4"])]], true),
            (vec![vec![req("size", "Lt", &["4"])]], false),
            (vec![vec![req("size", "Gt", &["x"])]], false),
            (vec![vec![req("zone", "Bogus", &["a"])]], false),
            (vec![vec![]], false),
        ];
        for (terms, want) in rows {
            let a = affinity(terms.clone());
            assert_eq!(volume_accessible(Some(&a), Some(&me)), want, "{terms:?}");
        }
        let a = affinity(vec![vec![req("zone", "In", &["b"])]]);
        assert!(volume_accessible(None, Some(&me)), "no affinity: accessible");
        assert!(volume_accessible(Some(&a), None), "no node topology: accessible");
        let by_name = VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![req("metadata.name", "In", &["n1"])]),
                }],
            }),
        };
        assert!(!volume_accessible(Some(&by_name), Some(&me)), "a node name never matches the driver's topology");
    }

    fn nd(segment: Option<&[(&str, &str)]>) -> NodeDeployment {
        NodeDeployment {
            node: "n1".into(),
            segment: segment.map(|s| s.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            immediate_binding: true,
            base_delay: S,
            max_delay: 6 * S,
        }
    }

    #[test]
    fn the_topology_is_this_nodes_only() {
        let n = nd(Some(&[("zone", "a")]));
        let r = n.requirements("data", &[], false, true).unwrap().unwrap();
        let seg = |t: &csi::Topology| t.segments.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>();
        assert_eq!(r.requisite.iter().map(seg).collect::<Vec<_>>(), vec![vec![("zone".into(), "a".into())]]);
        assert_eq!(r.preferred.iter().map(seg).collect::<Vec<_>>(), vec![vec![("zone".into(), "a".into())]]);
        let allowed: Vec<topology::Segment> = vec![[("zone".to_string(), "b".to_string())].into()];
        assert!(n.requirements("data", &allowed, true, true).is_err(), "strict: this node must be allowed");
        assert!(
            matches!(nd(None).requirements("data", &[], false, true), Err(TopologyError::Retry(_))),
            "a topology driver that reported no segment"
        );
    }

    #[test]
    fn the_claim_view_keeps_claims_without_a_node_or_on_this_one() {
        let n = nd(None);
        assert!(n.claim_in_view(None));
        assert!(n.claim_in_view(Some("")));
        assert!(n.claim_in_view(Some("n1")));
        assert!(!n.claim_in_view(Some("n2")));
    }

    #[test]
    fn identity_has_the_node_suffix() {
        assert_eq!(identity("1-2-d.csi".into(), Some("n1")), "1-2-d.csi-n1");
        assert_eq!(identity("1-2-d.csi".into(), None), "1-2-d.csi");
    }

    #[test]
    fn a_race_waits_then_waits_longer_after_a_loss() {
        let races = Races::default();
        let n = nd(None);
        let t0 = Instant::now();
        let first = races.wait("ns/c", "u1", &n, t0).expect("a first wait");
        assert!(first <= S, "{first:?}");
        assert_eq!(races.wait("ns/c", "u1", &n, t0 + S), None, "due after the base delay");
        let second = races.lost("ns/c", &n, t0 + S);
        assert!(second >= S && second <= 2 * S, "{second:?}");
        races.forget("ns/c");
        assert!(races.wait("ns/c", "u1", &n, t0 + 3 * S).is_some(), "forgotten: a new race");
    }
}
