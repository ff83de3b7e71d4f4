//! Accessibility requirements for `CreateVolume` (external-provisioner's
//! topology table): pure, from the StorageClass, the selected node, the
//! nodes' labels and the CSINodes' topology keys.

use std::collections::{BTreeMap, BTreeSet};

use crate::csi::proto::csi::v1::{Topology, TopologyRequirement};

/// A topology segment: key → value.
pub type Segment = BTreeMap<String, String>;

/// The nodes whose CSINode lists the driver, as a whole (answered from an
/// index: [`super::topology_index::TopologyIndex`]).
pub trait DriverNodes {
    /// Every distinct segment, sorted, of the nodes whose topology keys are
    /// `keys` (as a set) and whose labels carry all of them.
    fn segments(&self, keys: &[String]) -> Vec<Segment>;
    /// The topology keys of one node with at least one (`None`: none has).
    fn some_keys(&self) -> Option<Vec<String>>;
}

/// What the cluster looks like, as far as topology goes.
pub struct ClusterView<'a> {
    /// Node name → labels.
    pub node_labels: &'a dyn Fn(&str) -> Option<BTreeMap<String, String>>,
    /// Node name → the driver's topology keys in that node's CSINode
    /// (`None`: no CSINode; `Some(empty)`: the driver has no keys there).
    pub node_keys: &'a dyn Fn(&str) -> Option<Vec<String>>,
    /// The nodes that have a CSINode listing the driver.
    pub driver_nodes: &'a dyn DriverNodes,
}

/// Why no requirements could be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The selected node (or its CSINode) does not exist: ask the scheduler again.
    #[error("{0}")]
    Reschedule(String),
    /// Retry later.
    #[error("{0}")]
    Retry(String),
}

/// The inputs from the PVC and StorageClass.
pub struct Request<'a> {
    /// `WaitForFirstConsumer`.
    pub late_binding: bool,
    /// `volume.kubernetes.io/selected-node`.
    pub selected_node: Option<&'a str>,
    /// `--strict-topology`.
    pub strict: bool,
    /// `--immediate-topology`.
    pub immediate_topology: bool,
    /// `allowedTopologies`, flattened to segments.
    pub allowed: &'a [Segment],
    /// PVC name (spreads preferred segments of Immediate volumes).
    pub pvc_name: &'a str,
}

/// Flattens `allowedTopologies` terms (each `key In [values]` expression
/// multiplies) into segments.
pub fn flatten_allowed(terms: &[Vec<(String, Vec<String>)>]) -> Vec<Segment> {
    let mut out = Vec::new();
    for term in terms {
        let mut segments: Vec<Segment> = vec![Segment::new()];
        for (key, values) in term {
            segments = segments
                .into_iter()
                .flat_map(|s| {
                    values.iter().map(move |v| {
                        let mut s = s.clone();
                        s.insert(key.clone(), v.clone());
                        s
                    })
                })
                .collect();
        }
        out.extend(segments.into_iter().filter(|s| !s.is_empty()));
    }
    dedup(out)
}

fn dedup(segments: Vec<Segment>) -> Vec<Segment> {
    let set: BTreeSet<Segment> = segments.into_iter().collect();
    set.into_iter().collect()
}

fn node_segment(view: &ClusterView<'_>, node: &str, keys: &[String]) -> Option<Segment> {
    let labels = (view.node_labels)(node)?;
    keys.iter().map(|k| labels.get(k).map(|v| (k.clone(), v.clone()))).collect()
}

/// Go's `%v` of a string slice: `[a b]`.
fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// Go's `%v` of upstream's `topologyTerm` (segments sorted by key): `[{k v} {k2 v2}]`.
fn go_term(segment: &Segment) -> String {
    go_list(&segment.iter().map(|(k, v)| format!("{{{k} {v}}}")).collect::<Vec<_>>())
}

fn selected_segment(view: &ClusterView<'_>, node: &str) -> Result<(Vec<String>, Segment), TopologyError> {
    // The listers' NotFound texts.
    if (view.node_labels)(node).is_none() {
        return Err(TopologyError::Reschedule(format!("node \"{node}\" not found")));
    }
    let keys = (view.node_keys)(node)
        .ok_or_else(|| TopologyError::Reschedule(format!("csinode.storage.k8s.io \"{node}\" not found")))?;
    if keys.is_empty() {
        return Err(TopologyError::Retry(format!("no topology key found for node {node}")));
    }
    // Upstream prints the labels it dropped on the missing key: always `map[]`.
    let segment = node_segment(view, node, &keys).ok_or_else(|| {
        TopologyError::Retry(format!(
            "topology labels from selected node map[] does not match topology keys from CSINode {}",
            go_list(&keys)
        ))
    })?;
    Ok((keys, segment))
}

/// Every distinct segment of nodes that carry all of `keys`.
fn aggregate(view: &ClusterView<'_>, keys: &[String]) -> Vec<Segment> {
    view.driver_nodes.segments(keys)
}

fn rotate_to(mut segments: Vec<Segment>, first: usize) -> Vec<Segment> {
    if !segments.is_empty() {
        let k = first % segments.len();
        segments.rotate_left(k);
    }
    segments
}

/// FNV-1a of the PVC name without a StatefulSet ordinal, plus the ordinal:
/// the volumes of one StatefulSet prefer consecutive segments.
fn spread_offset(pvc_name: &str) -> usize {
    let (base, ordinal) = match pvc_name.rsplit_once('-') {
        Some((b, o)) if !o.is_empty() && o.bytes().all(|c| c.is_ascii_digit()) => (b, o.parse::<usize>().unwrap_or(0)),
        _ => (pvc_name, 0),
    };
    let mut h: u32 = 0x811c_9dc5;
    for b in base.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h as usize).wrapping_add(ordinal)
}

fn to_csi(segments: &[Segment]) -> Vec<Topology> {
    segments.iter().map(|s| Topology { segments: s.iter().map(|(k, v)| (k.clone(), v.clone())).collect() }).collect()
}

/// The requirements, or `None` when there are none to give.
pub fn requirements(req: &Request<'_>, view: &ClusterView<'_>) -> Result<Option<TopologyRequirement>, TopologyError> {
    let (requisite, preferred) = match (req.late_binding, req.selected_node) {
        (true, Some(node)) => {
            let (keys, selected) = selected_segment(view, node)?;
            if req.strict {
                if !req.allowed.is_empty() && !req.allowed.contains(&selected) {
                    let allowed = req.allowed.iter().map(go_term).collect::<Vec<_>>();
                    return Err(TopologyError::Retry(format!(
                        "selected node '{node:?}' topology '{}' is not in allowed topologies: {}",
                        go_term(&selected),
                        go_list(&allowed)
                    )));
                }
                (vec![selected.clone()], vec![selected])
            } else {
                let requisite = if req.allowed.is_empty() { aggregate(view, &keys) } else { req.allowed.to_vec() };
                let first = requisite.iter().position(|s| *s == selected).unwrap_or(0);
                let preferred = rotate_to(requisite.clone(), first);
                (requisite, preferred)
            }
        }
        _ => {
            let requisite = if !req.allowed.is_empty() {
                req.allowed.to_vec()
            } else if req.immediate_topology {
                let keys = view.driver_nodes.some_keys();
                let Some(keys) = keys else {
                    return Err(TopologyError::Retry("no available topology found".into()));
                };
                let all = aggregate(view, &keys);
                if all.is_empty() {
                    return Err(TopologyError::Retry(format!(
                        "topologyKeys {} were not found on any nodes",
                        go_list(&keys)
                    )));
                }
                all
            } else {
                return Ok(None);
            };
            let preferred = rotate_to(requisite.clone(), spread_offset(req.pvc_name));
            (requisite, preferred)
        }
    };
    Ok(Some(TopologyRequirement { requisite: to_csi(&requisite), preferred: to_csi(&preferred) }))
}

#[cfg(test)]
mod tests {
    use super::super::topology_index::TopologyIndex;
    use super::*;

    type Labels<'a> = &'a dyn Fn(&str) -> Option<BTreeMap<String, String>>;
    type Keys<'a> = &'a dyn Fn(&str) -> Option<Vec<String>>;

    /// The index of `names` (the nodes with a CSINode listing the driver),
    /// their labels and keys as `labels` and `keys` give them.
    fn index_of<'n>(names: impl IntoIterator<Item = &'n str>, labels: Labels<'_>, keys: Keys<'_>) -> TopologyIndex {
        let mut index = TopologyIndex::default();
        for n in names {
            index.set_node(n, keys(n), labels(n).as_ref());
        }
        index
    }

    const K: &str = "topology.example.com/zone";

    fn seg(v: &str) -> Segment {
        [(K.to_string(), v.to_string())].into()
    }

    fn view(nodes: &[(&str, &str)]) -> (Vec<(String, String)>, Vec<String>) {
        (
            nodes.iter().map(|(n, z)| (n.to_string(), z.to_string())).collect(),
            nodes.iter().map(|(n, _)| n.to_string()).collect(),
        )
    }

    /// (requisite, preferred).
    type Both = (Vec<Segment>, Vec<Segment>);

    fn run(req: &Request<'_>, nodes: &[(&str, &str)]) -> Result<Option<Both>, TopologyError> {
        let (zones, names) = view(nodes);
        let labels = |n: &str| zones.iter().find(|(x, _)| x == n).map(|(_, z)| [(K.to_string(), z.clone())].into());
        let keys = |n: &str| zones.iter().any(|(x, _)| x == n).then(|| vec![K.to_string()]);
        let index = index_of(names.iter().map(String::as_str), &labels, &keys);
        let v = ClusterView { node_labels: &labels, node_keys: &keys, driver_nodes: &index };
        let back = |t: &Vec<Topology>| {
            t.iter().map(|t| t.segments.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).collect()
        };
        requirements(req, &v).map(|o| o.map(|r| (back(&r.requisite), back(&r.preferred))))
    }

    fn req<'a>(late: bool, node: Option<&'a str>, strict: bool, imm: bool, allowed: &'a [Segment]) -> Request<'a> {
        Request { late_binding: late, selected_node: node, strict, immediate_topology: imm, allowed, pvc_name: "data" }
    }

    const NODES: &[(&str, &str)] = &[("n1", "a"), ("n2", "b"), ("n3", "c"), ("n4", "a")];

    #[test]
    fn late_binding_strict_is_the_selected_node_only() {
        let got = run(&req(true, Some("n2"), true, true, &[]), NODES).unwrap().unwrap();
        assert_eq!(got, (vec![seg("b")], vec![seg("b")]));
        let allowed = [seg("a")];
        assert!(matches!(run(&req(true, Some("n2"), true, true, &allowed), NODES), Err(TopologyError::Retry(_))));
    }

    #[test]
    fn late_binding_aggregates_and_prefers_the_selected_node() {
        let (requisite, preferred) = run(&req(true, Some("n3"), false, true, &[]), NODES).unwrap().unwrap();
        assert_eq!(requisite, vec![seg("a"), seg("b"), seg("c")]);
        assert_eq!(preferred[0], seg("c"));
        assert_eq!(preferred.len(), 3);
        let allowed = [seg("b"), seg("c")];
        let (requisite, preferred) = run(&req(true, Some("n3"), false, true, &allowed), NODES).unwrap().unwrap();
        assert_eq!(requisite, allowed.to_vec());
        assert_eq!(preferred[0], seg("c"));
    }

    #[test]
    fn immediate_binding() {
        let (requisite, preferred) = run(&req(false, None, false, true, &[]), NODES).unwrap().unwrap();
        assert_eq!(requisite, vec![seg("a"), seg("b"), seg("c")]);
        assert_eq!(preferred.iter().collect::<BTreeSet<_>>(), requisite.iter().collect::<BTreeSet<_>>());
        assert_eq!(run(&req(false, None, false, false, &[]), NODES).unwrap(), None, "--immediate-topology=false");
        let allowed = [seg("z")];
        assert_eq!(run(&req(false, None, false, false, &allowed), NODES).unwrap().unwrap().0, vec![seg("z")]);
        assert_eq!(
            run(&req(false, None, false, true, &[]), &[]),
            Err(TopologyError::Retry("no available topology found".into()))
        );
    }

    /// Every refusal with its whole text (upstream `GenerateAccessibilityRequirements`,
    /// `%v` and `%q` as Go prints them; a missing Node or CSINode as the listers say it).
    #[test]
    fn refusal_texts() {
        let labels = |n: &str| match n {
            "gone" => None,
            "bare" => Some(BTreeMap::new()),
            _ => Some([(K.to_string(), "a".to_string())].into()),
        };
        let keys = |n: &str| match n {
            "no-csinode" => None,
            "keyless" => Some(vec![]),
            _ => Some(vec![K.to_string(), "rack".to_string()]),
        };
        let bare = index_of(["bare"], &labels, &keys);
        let v = ClusterView { node_labels: &labels, node_keys: &keys, driver_nodes: &bare };
        let allowed = [seg("b"), seg("c")];
        let one_key = |n: &str| (n == "n1").then(|| vec![K.to_string()]);
        let only_bare = |_: &str| Some(BTreeMap::new());
        let n1 = index_of(["n1"], &only_bare, &one_key);
        let immediate = ClusterView { node_labels: &only_bare, node_keys: &one_key, driver_nodes: &n1 };
        let zone_a = |_: &str| Some([(K.to_string(), "a".to_string())].into());
        let none = TopologyIndex::default();
        let strict = ClusterView { node_labels: &zone_a, node_keys: &one_key, driver_nodes: &none };
        let no_keys = |_: &str| None;
        let keyless = ClusterView { node_labels: &only_bare, node_keys: &no_keys, driver_nodes: &none };
        let rows: Vec<(&str, Request<'_>, &ClusterView<'_>, TopologyError)> = vec![
            (
                "no Node",
                req(true, Some("gone"), false, false, &[]),
                &v,
                TopologyError::Reschedule("node \"gone\" not found".into()),
            ),
            (
                "no CSINode",
                req(true, Some("no-csinode"), false, false, &[]),
                &v,
                TopologyError::Reschedule("csinode.storage.k8s.io \"no-csinode\" not found".into()),
            ),
            (
                "no keys",
                req(true, Some("keyless"), false, false, &[]),
                &v,
                TopologyError::Retry("no topology key found for node keyless".into()),
            ),
            (
                "a key the node has no label for",
                req(true, Some("bare"), false, false, &[]),
                &v,
                TopologyError::Retry(format!(
                    "topology labels from selected node map[] does not match topology keys from CSINode [{K} rack]"
                )),
            ),
            (
                "strict, not allowed",
                req(true, Some("n1"), true, false, &allowed),
                &strict,
                TopologyError::Retry(format!(
                    "selected node '\"n1\"' topology '[{{{K} a}}]' is not in allowed topologies: [[{{{K} b}}] [{{{K} c}}]]"
                )),
            ),
            (
                "immediate, keys without labels",
                req(false, None, false, true, &[]),
                &immediate,
                TopologyError::Retry(format!("topologyKeys [{K}] were not found on any nodes")),
            ),
            (
                "immediate, no keys anywhere",
                req(false, None, false, true, &[]),
                &keyless,
                TopologyError::Retry("no available topology found".into()),
            ),
        ];
        for (what, r, view, want) in rows {
            assert_eq!(requirements(&r, view).map(|_| ()), Err(want), "{what}");
        }
    }

    /// `f` over a view of `nodes` (name, zone; each with a CSINode giving the
    /// driver the one key `K`), and how many nodes and index entries the
    /// view visited for it.
    fn with_counted_view<R>(nodes: &[(String, String)], f: impl FnOnce(&ClusterView<'_>) -> R) -> (R, usize) {
        use std::{cell::Cell, collections::HashMap};
        let zones: HashMap<&str, &str> = nodes.iter().map(|(n, z)| (n.as_str(), z.as_str())).collect();
        let visits = Cell::new(0);
        let labels = |n: &str| {
            visits.set(visits.get() + 1);
            zones.get(n).map(|z| [(K.to_string(), z.to_string())].into())
        };
        let keys = |n: &str| {
            visits.set(visits.get() + 1);
            zones.contains_key(n).then(|| vec![K.to_string()])
        };
        let index = index_of(nodes.iter().map(|(n, _)| n.as_str()), &labels, &keys);
        visits.set(0);
        let before = index.work();
        let v = ClusterView { node_labels: &labels, node_keys: &keys, driver_nodes: &index };
        let r = f(&v);
        (r, visits.get() + (index.work() - before) as usize)
    }

    /// Issue 25 item 9: one provisioning attempt against 5 000 nodes in 50
    /// zones looks up the selected node and the 50 segments, not every node
    /// (before the index it copied every driver node's keys and labels).
    #[test]
    fn an_attempt_visits_the_segments_not_every_node() {
        let nodes: Vec<(String, String)> =
            (0..5000).map(|i| (format!("node-{i}"), format!("zone-{}", i % 50))).collect();
        let rows = [
            ("WaitForFirstConsumer, a selected node", req(true, Some("node-7"), false, false, &[])),
            ("Immediate, --immediate-topology", req(false, None, false, true, &[])),
        ];
        for (what, r) in rows {
            let (got, visits) = with_counted_view(&nodes, |v| requirements(&r, v));
            let got = got.unwrap().unwrap();
            assert_eq!(got.requisite.len(), 50, "{what}");
            assert!(
                visits <= 2 * 50 + 10,
                "{what}: one attempt against 5 000 nodes visited {visits} nodes and index entries"
            );
        }
    }

    #[test]
    fn missing_selected_node_reschedules() {
        assert!(matches!(run(&req(true, Some("gone"), false, true, &[]), NODES), Err(TopologyError::Reschedule(_))));
    }

    #[test]
    fn statefulset_volumes_spread() {
        let a = spread_offset("data-web-0");
        let b = spread_offset("data-web-1");
        assert_eq!(b, a.wrapping_add(1));
    }

    #[test]
    fn allowed_terms_flatten() {
        let terms = vec![vec![
            (K.to_string(), vec!["a".to_string(), "b".to_string()]),
            ("rack".to_string(), vec!["1".to_string()]),
        ]];
        let flat = flatten_allowed(&terms);
        assert_eq!(flat.len(), 2);
        assert!(flat.iter().all(|s| s["rack"] == "1"));
    }
}
