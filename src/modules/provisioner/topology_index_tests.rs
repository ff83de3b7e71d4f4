//! The index: the same answers as the full scan of every driver node it
//! replaced, after any sequence of Node and CSINode changes.

use proptest::prelude::*;

use super::*;

/// The cluster as the caches hold it: node name → (the driver's keys in its
/// CSINode, its Node's labels).
type Model = BTreeMap<String, (Option<Vec<String>>, Option<BTreeMap<String, String>>)>;

/// The full scan the index replaced (`aggregate` before the index): every
/// distinct segment of the driver nodes whose keys are `keys` as a set.
fn full_scan_segments(model: &Model, keys: &[String]) -> Vec<Segment> {
    let want: BTreeSet<&String> = keys.iter().collect();
    let segments: BTreeSet<Segment> = model
        .values()
        .filter_map(|(k, labels)| Some((k.as_ref()?, labels.as_ref()?)))
        .filter(|(k, _)| k.iter().collect::<BTreeSet<_>>() == want)
        .filter_map(|(_, labels)| keys.iter().map(|k| labels.get(k).map(|v| (k.clone(), v.clone()))).collect())
        .collect();
    segments.into_iter().collect()
}

/// The full scan's choice of keys for Immediate volumes, over the driver
/// nodes in name order: the first with keys.
fn full_scan_some_keys(model: &Model) -> Option<Vec<String>> {
    model.values().find_map(|(k, _)| k.clone().filter(|k| !k.is_empty()))
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

/// Key lists a CSINode may give (one set in two orders, a duplicate key).
const KEY_LISTS: &[&[&str]] = &[&[], &["zone"], &["zone", "rack"], &["rack", "zone"], &["rack"], &["zone", "zone"]];

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    (proptest::option::of(0..3u8), proptest::option::of(0..2u8), proptest::bool::ANY).prop_map(|(zone, rack, other)| {
        let mut l = BTreeMap::new();
        if let Some(z) = zone {
            l.insert("zone".to_string(), format!("z{z}"));
        }
        if let Some(r) = rack {
            l.insert("rack".to_string(), format!("r{r}"));
        }
        if other {
            l.insert("kubernetes.io/os".to_string(), "linux".to_string());
        }
        l
    })
}

/// A watch event: a CSINode (its driver's keys, `None`: gone or not
/// listing the driver) or a Node (its labels, `None`: gone) of node `n`.
#[derive(Debug, Clone)]
enum Event {
    CsiNode(u8, Option<usize>),
    Node(u8, Option<BTreeMap<String, String>>),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (0..6u8, proptest::option::of(0..KEY_LISTS.len())).prop_map(|(n, k)| Event::CsiNode(n, k)),
        (0..6u8, proptest::option::of(labels())).prop_map(|(n, l)| Event::Node(n, l)),
    ]
}

fn check(index: &TopologyIndex, model: &Model) {
    for keys in KEY_LISTS.iter().map(|k| strings(k)) {
        assert_eq!(index.segments(&keys), full_scan_segments(model, &keys), "{keys:?} in {model:?}");
    }
    assert_eq!(index.some_keys(), full_scan_some_keys(model), "{model:?}");
    assert_eq!(index.len(), model.values().filter(|(k, _)| k.is_some()).count());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Each event recomputes its node from the model (as the handlers do
    /// from both caches); after each, the index answers as the full scan.
    #[test]
    fn the_index_agrees_with_the_full_scan(events in proptest::collection::vec(event(), 1..60)) {
        let mut model = Model::new();
        let mut index = TopologyIndex::default();
        for e in events {
            let name = match &e {
                Event::CsiNode(n, _) | Event::Node(n, _) => format!("node-{n}"),
            };
            let entry = model.entry(name.clone()).or_default();
            match e {
                Event::CsiNode(_, k) => entry.0 = k.map(|i| strings(KEY_LISTS[i])),
                Event::Node(_, l) => entry.1 = l,
            }
            let (keys, labels) = model[&name].clone();
            index.set_node(&name, keys, labels.as_ref());
            check(&index, &model);
        }
    }
}

#[test]
fn a_segment_stays_while_one_node_has_it() {
    let zone = |z: &str| BTreeMap::from([("zone".to_string(), z.to_string())]);
    let keys = || Some(strings(&["zone"]));
    let mut index = TopologyIndex::default();
    index.set_node("a", keys(), Some(&zone("z1")));
    index.set_node("b", keys(), Some(&zone("z1")));
    index.set_node("c", keys(), Some(&zone("z2")));
    let q = strings(&["zone"]);
    assert_eq!(index.segments(&q), vec![zone("z1"), zone("z2")]);
    index.set_node("a", None, Some(&zone("z1")));
    assert_eq!(index.segments(&q), vec![zone("z1"), zone("z2")], "b is still in z1");
    index.set_node("b", keys(), Some(&zone("z3")));
    assert_eq!(index.segments(&q), vec![zone("z2"), zone("z3")], "b moved");
    index.set_node("c", keys(), None);
    assert_eq!(index.segments(&q), vec![zone("z3")], "c's Node is gone");
    assert_eq!(index.some_keys(), Some(q.clone()), "c still has a CSINode");
    index.set_node("b", Some(vec![]), Some(&zone("z3")));
    index.set_node("c", None, None);
    assert_eq!((index.segments(&q), index.some_keys()), (vec![], None));
    assert_eq!(index.len(), 1, "b, without keys");
}

/// The Immediate path's keys: those of the node with the smallest name,
/// whatever the order the nodes came in.
#[test]
fn immediate_keys_come_from_the_smallest_node_name() {
    let mut index = TopologyIndex::default();
    index.set_node("m", Some(strings(&["rack"])), None);
    index.set_node("z", Some(strings(&["zone"])), None);
    index.set_node("a", Some(vec![]), None);
    assert_eq!(index.some_keys(), Some(strings(&["rack"])));
    index.set_node("b", Some(strings(&["zone", "rack"])), None);
    assert_eq!(index.some_keys(), Some(strings(&["zone", "rack"])));
}

/// An event that changes nothing the index keeps (a Node's other labels, a
/// heartbeat) leaves it as it was.
#[test]
fn an_unrelated_change_leaves_the_index_alone() {
    let mut index = TopologyIndex::default();
    let labels = BTreeMap::from([("zone".to_string(), "z1".to_string())]);
    index.set_node("a", Some(strings(&["zone"])), Some(&labels));
    let mut more = labels.clone();
    more.insert("kubernetes.io/os".into(), "linux".into());
    index.set_node("a", Some(strings(&["zone"])), Some(&more));
    assert_eq!(index.segments(&strings(&["zone"])), vec![labels]);
    assert_eq!(index.len(), 1);
}

mod caches {
    use k8s_openapi::{
        api::storage::v1::{CSINodeDriver, CSINodeSpec},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };
    use kube::{core::PartialObjectMetaExt, runtime::watcher::Event as Watch};

    use super::*;
    use crate::k8s::cache::Writer;

    const DRIVER: &str = "topology.csi.example.com";

    fn node(name: &str, zone: &str) -> PartialObjectMeta<Node> {
        let labels = BTreeMap::from([("zone".to_string(), zone.to_string())]);
        ObjectMeta { name: Some(name.into()), labels: Some(labels), ..Default::default() }.into_response_partial()
    }

    fn csinode(name: &str) -> CSINode {
        let driver = CSINodeDriver {
            name: DRIVER.into(),
            node_id: name.into(),
            topology_keys: Some(strings(&["zone"])),
            allocatable: None,
        };
        CSINode {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: CSINodeSpec { drivers: vec![driver] },
        }
    }

    fn all<K>(_: &K) -> bool {
        true
    }

    fn immediate(cluster: &ClusterTopology) -> Vec<String> {
        let req = Request {
            late_binding: false,
            selected_node: None,
            strict: false,
            immediate_topology: true,
            allowed: &[],
            pvc_name: "data",
        };
        let got = cluster.requirements(&req).ok().flatten().map(|r| r.requisite).unwrap_or_default();
        got.iter().flat_map(|t| t.segments.values().cloned()).collect()
    }

    /// Each event is applied to its cache, then its node updated (as the
    /// handlers do): the index follows the caches whichever watch comes
    /// first, and a deleted Node takes its segment away.
    #[test]
    fn the_index_follows_the_caches_whichever_watch_comes_first() {
        let (nodes, csinodes) = (Cache::default(), Cache::default());
        let (mut node_writer, mut csinode_writer) = (Writer::new(nodes.clone()), Writer::new(csinodes.clone()));
        let cluster = ClusterTopology::new(nodes, csinodes, DRIVER);
        // a: CSINode first; b: Node first.
        csinode_writer.apply(Watch::Apply(csinode("a")), &all);
        cluster.update("a");
        assert_eq!(immediate(&cluster), Vec::<String>::new(), "a's Node not yet seen");
        node_writer.apply(Watch::Apply(node("b", "z2")), &all);
        cluster.update("b");
        node_writer.apply(Watch::Apply(node("a", "z1")), &all);
        cluster.update("a");
        csinode_writer.apply(Watch::Apply(csinode("b")), &all);
        cluster.update("b");
        assert_eq!(immediate(&cluster), strings(&["z1", "z2"]));
        assert_eq!(cluster.len(), 2);
        node_writer.apply(Watch::Delete(node("a", "z1")), &all);
        cluster.update("a");
        assert_eq!(immediate(&cluster), strings(&["z2"]));
        assert_eq!(cluster.len(), 2, "a's CSINode is still there");
    }
}
