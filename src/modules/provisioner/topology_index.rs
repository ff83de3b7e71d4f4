//! The driver's nodes' topology, indexed per watch event so that a
//! provisioning attempt costs work for the segments it returns, not for
//! every node of the cluster: [`TopologyIndex`] (pure) holds, for each node
//! whose CSINode lists the driver, its topology keys and (when its Node's
//! labels carry all of them) its segment, with a count per (key set,
//! segment); [`ClusterTopology`] keeps one from the Node and CSINode caches
//! and answers [`topology::requirements`] from it.

use parking_lot::Mutex;
use std::{
    cell::Cell,
    collections::{BTreeMap, BTreeSet, HashMap},
};

use k8s_openapi::api::{core::v1::Node, storage::v1::CSINode};
use kube::{core::PartialObjectMeta, runtime::reflector::ObjectRef};

use super::topology::{self, ClusterView, DriverNodes, Request, Segment, TopologyError};
use crate::{csi::proto::csi::v1::TopologyRequirement, k8s::cache::Cache};

/// A set of topology keys: sorted, without duplicates.
type KeySet = Vec<String>;

fn key_set(keys: &[String]) -> KeySet {
    keys.iter().cloned().collect::<BTreeSet<_>>().into_iter().collect()
}

/// One node whose CSINode lists the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// The driver's topology keys, in the CSINode's order.
    keys: Vec<String>,
    /// The Node's labels for those keys; `None` without a Node or with a
    /// key it has no label for.
    segment: Option<Segment>,
}

/// The topology of the nodes whose CSINode lists the driver.
#[derive(Debug, Default)]
pub struct TopologyIndex {
    /// Node name → entry.
    nodes: HashMap<String, Entry>,
    /// Key set → segment → how many nodes with exactly those keys have it.
    segments: HashMap<KeySet, BTreeMap<Segment, usize>>,
    /// The nodes with at least one key.
    keyed: BTreeSet<String>,
    /// Entries and segments visited so far (the cost of the operations).
    work: Cell<u64>,
}

impl TopologyIndex {
    fn visit(&self, n: usize) {
        self.work.set(self.work.get() + n as u64);
    }

    /// Node `name` as the caches hold it now: `keys` the driver's topology
    /// keys in its CSINode (`None`: no CSINode, or one not listing the
    /// driver), `labels` its Node's labels (`None`: no Node).
    pub fn set_node(&mut self, name: &str, keys: Option<Vec<String>>, labels: Option<&BTreeMap<String, String>>) {
        self.visit(1);
        let entry = keys.map(|keys| {
            let segment = labels.and_then(|l| keys.iter().map(|k| l.get(k).map(|v| (k.clone(), v.clone()))).collect());
            Entry { keys, segment }
        });
        if self.nodes.get(name) == entry.as_ref() {
            return;
        }
        if let Some(old) = self.nodes.remove(name) {
            self.keyed.remove(name);
            self.uncount(&old);
        }
        if let Some(new) = entry {
            if !new.keys.is_empty() {
                self.keyed.insert(name.to_string());
            }
            if let Some(s) = &new.segment {
                *self.segments.entry(key_set(&new.keys)).or_default().entry(s.clone()).or_default() += 1;
            }
            self.nodes.insert(name.to_string(), new);
        }
    }

    fn uncount(&mut self, old: &Entry) {
        let Some(s) = &old.segment else { return };
        let set = key_set(&old.keys);
        let Some(counts) = self.segments.get_mut(&set) else { return };
        if let Some(n) = counts.get_mut(s) {
            *n -= 1;
            if *n == 0 {
                counts.remove(s);
            }
        }
        if counts.is_empty() {
            self.segments.remove(&set);
        }
    }

    /// How many nodes the index holds.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the index holds no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Entries and segments visited so far (the cost of the operations).
    pub fn work(&self) -> u64 {
        self.work.get()
    }
}

impl DriverNodes for TopologyIndex {
    fn segments(&self, keys: &[String]) -> Vec<Segment> {
        let found: Vec<Segment> =
            self.segments.get(&key_set(keys)).map(|c| c.keys().cloned().collect()).unwrap_or_default();
        self.visit(1 + found.len());
        found
    }

    /// The keys of the node with the smallest name among those with keys
    /// (upstream takes the first CSINode its lister returns, in no
    /// particular order; the smallest name makes the choice repeatable).
    fn some_keys(&self) -> Option<Vec<String>> {
        self.visit(1);
        let name = self.keyed.first()?;
        self.nodes.get(name).map(|e| e.keys.clone())
    }
}

/// The driver's topology keys in `csinode` (`None`: the driver is not listed).
pub fn driver_keys(csinode: &CSINode, driver: &str) -> Option<Vec<String>> {
    csinode.spec.drivers.iter().find(|d| d.name == driver).map(|d| d.topology_keys.clone().unwrap_or_default())
}

/// A topology-aware provisioner's Node labels (metadata-only watch) and
/// CSINodes, with the index kept from them.
pub struct ClusterTopology {
    nodes: Cache<PartialObjectMeta<Node>>,
    csinodes: Cache<CSINode>,
    driver: String,
    index: Mutex<TopologyIndex>,
}

impl ClusterTopology {
    /// An empty index over these caches: call [`ClusterTopology::update`]
    /// for each node of each Node and CSINode event.
    pub fn new(nodes: Cache<PartialObjectMeta<Node>>, csinodes: Cache<CSINode>, driver: &str) -> Self {
        ClusterTopology { nodes, csinodes, driver: driver.to_string(), index: Mutex::default() }
    }

    /// Recomputes node `name`'s entry from both caches as they hold it now,
    /// under the index's lock: whichever of the two watches' events comes
    /// last leaves the index as the caches are.
    pub fn update(&self, name: &str) {
        let mut index = self.index.lock();
        let keys = self.csinodes.get(&ObjectRef::new(name)).and_then(|c| driver_keys(&c, &self.driver));
        let node = self.nodes.get(&ObjectRef::new(name));
        let empty = BTreeMap::new();
        let labels = node.as_ref().map(|n| n.metadata.labels.as_ref().unwrap_or(&empty));
        index.set_node(name, keys, labels);
    }

    /// The accessibility requirements of `req`: the selected node from the
    /// caches, every other node's topology from the index.
    pub fn requirements(&self, req: &Request<'_>) -> Result<Option<TopologyRequirement>, TopologyError> {
        let labels =
            |n: &str| self.nodes.get(&ObjectRef::new(n)).map(|m| m.metadata.labels.clone().unwrap_or_default());
        let keys =
            |n: &str| self.csinodes.get(&ObjectRef::new(n)).map(|c| driver_keys(&c, &self.driver).unwrap_or_default());
        let index = self.index.lock();
        let view = ClusterView { node_labels: &labels, node_keys: &keys, driver_nodes: &*index };
        topology::requirements(req, &view)
    }

    /// How many nodes the index holds.
    pub fn len(&self) -> usize {
        self.index.lock().len()
    }

    /// Whether the index holds no node.
    pub fn is_empty(&self) -> bool {
        self.index.lock().is_empty()
    }
}

#[cfg(test)]
#[path = "topology_index_tests.rs"]
mod tests;
