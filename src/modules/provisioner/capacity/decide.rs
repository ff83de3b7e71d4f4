//! Storage capacity tracking, the pure part: which topology segments the
//! cluster has for the driver, which (segment, StorageClass) pairs need a
//! CSIStorageCapacity object, which existing objects are obsolete or
//! duplicates, what a GetCapacity answer means, and what to write.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::{
        core::v1::VolumeNodeAffinity,
        storage::v1::{CSINode, CSIStorageCapacity, StorageClass},
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference},
    },
};

use crate::{compat::capacity as upstream, k8s::quantity};

/// A topology segment: key → value, sorted. Empty: every node (a driver
/// without topology keys).
pub type Segment = BTreeMap<String, String>;

/// One object that should exist: a segment and a StorageClass.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Item {
    /// The segment.
    pub segment: Segment,
    /// The StorageClass name.
    pub class: String,
}

impl std::fmt::Display for Item {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seg: Vec<String> = self.segment.iter().map(|(k, v)| format!("{k}={v}")).collect();
        write!(f, "{}@{{{}}}", self.class, seg.join(","))
    }
}

/// A work-queue key of the capacity controller.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// Create or refresh the object of an item.
    Item(Item),
    /// Delete an obsolete or duplicate object (name, UID).
    Delete(String, String),
}

/// The topology keys the driver registered in `csinode`; `None` when the
/// driver does not run on that node.
pub fn driver_keys<'a>(csinode: &'a CSINode, driver: &str) -> Option<&'a [String]> {
    csinode.spec.drivers.iter().find(|d| d.name == driver).map(|d| d.topology_keys.as_deref().unwrap_or_default())
}

/// The segments of the driver: for every CSINode listing it, its keys with
/// the values of the Node's labels. A CSINode without its Node, or a Node
/// still missing a key's label, contributes nothing (yet).
pub fn segments<'a>(
    csinodes: impl IntoIterator<Item = &'a CSINode>,
    node_labels: &dyn Fn(&str) -> Option<BTreeMap<String, String>>,
    driver: &str,
) -> BTreeSet<Segment> {
    let mut out = BTreeSet::new();
    'node: for c in csinodes {
        let Some(keys) = driver_keys(c, driver) else { continue };
        let Some(labels) = node_labels(c.metadata.name.as_deref().unwrap_or_default()) else { continue };
        let mut segment = Segment::new();
        for k in keys {
            let Some(v) = labels.get(k) else { continue 'node };
            segment.insert(k.clone(), v.clone());
        }
        out.insert(segment);
    }
    out
}

/// The managed-by label of a node deployment's objects: `<base>-<node>`,
/// kept within a label value's 63 characters (a longer name ends in a hash
/// of the node name instead, so two long names never share a value).
pub fn node_managed_by(base: &str, node: &str) -> String {
    let name = format!("{base}-{node}");
    if name.len() <= 63 {
        return name;
    }
    // FNV-1a: stable across releases, no dependency.
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let suffix = format!("{hash:016x}");
    let keep = 63 - suffix.len() - 1;
    let prefix: String = name.chars().take(keep).collect();
    format!("{}-{suffix}", prefix.trim_end_matches(['-', '.', '_']))
}

/// Whether a StorageClass gets capacity objects: the driver's, and not
/// Immediate binding unless `immediate` (`--capacity-for-immediate-binding`).
pub fn class_tracked(sc: &StorageClass, driver: &str, immediate: bool) -> bool {
    sc.provisioner == driver && (immediate || sc.volume_binding_mode.as_deref() != Some("Immediate"))
}

/// Every (segment, class) pair.
pub fn desired(segments: &BTreeSet<Segment>, classes: &BTreeSet<String>) -> BTreeSet<Item> {
    segments.iter().flat_map(|s| classes.iter().map(move |c| Item { segment: s.clone(), class: c.clone() })).collect()
}

/// The item an existing object stands for: its class and a node topology
/// of plain `matchLabels` (what this controller writes). `None` for
/// anything else (no topology, expressions): such an object serves no item.
pub fn item_of(obj: &CSIStorageCapacity) -> Option<Item> {
    let sel = obj.node_topology.as_ref()?;
    if sel.match_expressions.as_ref().is_some_and(|e| !e.is_empty()) {
        return None;
    }
    Some(Item { segment: sel.match_labels.clone().unwrap_or_default(), class: obj.storage_class_name.clone() })
}

/// The objects by item: the one to keep (the oldest; by name among equals)
/// first.
pub fn by_item<'a>(
    objects: impl IntoIterator<Item = &'a CSIStorageCapacity>,
) -> BTreeMap<Item, Vec<&'a CSIStorageCapacity>> {
    let mut out: BTreeMap<Item, Vec<&CSIStorageCapacity>> = BTreeMap::new();
    for o in objects {
        if let Some(item) = item_of(o) {
            out.entry(item).or_default().push(o);
        }
    }
    for list in out.values_mut() {
        list.sort_by(|a, b| {
            let created = |o: &CSIStorageCapacity| o.metadata.creation_timestamp.as_ref().map(|t| t.0);
            created(a).cmp(&created(b)).then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
    }
    out
}

/// The objects to delete: those whose item is not desired (their class or
/// segment is gone, or they serve none), and every duplicate of an item
/// but the oldest. As (name, UID).
pub fn to_delete<'a>(
    objects: impl IntoIterator<Item = &'a CSIStorageCapacity> + Clone,
    desired: &BTreeSet<Item>,
) -> Vec<(String, String)> {
    let key = |o: &CSIStorageCapacity| {
        (o.metadata.name.clone().unwrap_or_default(), o.metadata.uid.clone().unwrap_or_default())
    };
    let mut out: Vec<(String, String)> =
        objects.clone().into_iter().filter(|o| item_of(o).is_none_or(|i| !desired.contains(&i))).map(key).collect();
    for (item, list) in by_item(objects) {
        if desired.contains(&item) {
            out.extend(list.iter().skip(1).map(|o| key(o)));
        }
    }
    out.sort();
    out
}

/// Upstream's three gauges: (goal, current, obsolete). Duplicates count
/// neither as current nor as obsolete, as upstream.
pub fn counts<'a>(
    objects: impl IntoIterator<Item = &'a CSIStorageCapacity> + Clone,
    desired: &BTreeSet<Item>,
) -> (usize, usize, usize) {
    let have = by_item(objects.clone());
    let current = desired.iter().filter(|i| have.contains_key(*i)).count();
    let obsolete = objects.into_iter().filter(|o| item_of(o).is_none_or(|i| !desired.contains(&i))).count();
    (desired.len(), current, obsolete)
}

/// A GetCapacity answer, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// `available_capacity`, bytes.
    pub available: i64,
    /// `maximum_volume_size`, when the driver reports it.
    pub maximum: Option<i64>,
}

/// A GetCapacity answer that cannot be published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// A negative `available_capacity`.
    #[error("the driver reported a negative available_capacity {0} for {1}")]
    NegativeCapacity(i64, String),
    /// A negative `maximum_volume_size`.
    #[error("the driver reported a negative maximum_volume_size {0} for {1}")]
    NegativeMaximum(i64, String),
}

/// Checks `available_capacity` and `maximum_volume_size` of `item`'s answer.
pub fn check_answer(item: &Item, available: i64, maximum: Option<i64>) -> Result<Answer, AnswerError> {
    if available < 0 {
        return Err(AnswerError::NegativeCapacity(available, item.to_string()));
    }
    if let Some(m) = maximum.filter(|m| *m < 0) {
        return Err(AnswerError::NegativeMaximum(m, item.to_string()));
    }
    Ok(Answer { available, maximum })
}

/// The labels of the managed objects.
pub fn labels(driver: &str, managed_by: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (upstream::LABEL_DRIVER_NAME.to_string(), driver.to_string()),
        (upstream::LABEL_MANAGED_BY.to_string(), managed_by.to_string()),
    ])
}

/// A new object for `item` (generated name, labels, owner).
pub fn new_object(
    item: &Item,
    answer: Answer,
    driver: &str,
    managed_by: &str,
    owner: Option<&OwnerReference>,
) -> CSIStorageCapacity {
    CSIStorageCapacity {
        metadata: ObjectMeta {
            generate_name: Some(upstream::GENERATE_NAME.to_string()),
            labels: Some(labels(driver, managed_by)),
            owner_references: owner.map(|o| vec![o.clone()]),
            ..Default::default()
        },
        storage_class_name: item.class.clone(),
        node_topology: Some(LabelSelector { match_labels: Some(item.segment.clone()), match_expressions: None }),
        capacity: Some(Quantity(quantity::from_bytes(answer.available))),
        maximum_volume_size: answer.maximum.map(|m| Quantity(quantity::from_bytes(m))),
    }
}

/// Whether `obj` is controlled by `owner` (by UID, as upstream).
pub fn owned_by(obj: &CSIStorageCapacity, owner: &OwnerReference) -> bool {
    obj.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.uid == owner.uid)
}

fn bytes(q: Option<&Quantity>) -> Option<Option<i64>> {
    match q {
        None => Some(None),
        Some(q) => quantity::to_bytes(&q.0).ok().map(Some),
    }
}

/// The merge patch bringing `obj` to `answer` (and adding `owner` when it
/// is missing); `None` when it already is.
pub fn update(obj: &CSIStorageCapacity, answer: Answer, owner: Option<&OwnerReference>) -> Option<serde_json::Value> {
    let same_capacity = bytes(obj.capacity.as_ref()) == Some(Some(answer.available));
    let same_maximum = bytes(obj.maximum_volume_size.as_ref()) == Some(answer.maximum);
    let owner_missing = owner.filter(|o| !owned_by(obj, o));
    if same_capacity && same_maximum && owner_missing.is_none() {
        return None;
    }
    let mut patch = serde_json::json!({
        "capacity": quantity::from_bytes(answer.available),
        "maximumVolumeSize": answer.maximum.map(quantity::from_bytes),
    });
    if let Some(o) = owner_missing {
        let mut owners = obj.metadata.owner_references.clone().unwrap_or_default();
        owners.push(o.clone());
        patch["metadata"] = serde_json::json!({ "ownerReferences": owners });
    }
    Some(patch)
}

/// The segments a PV's node affinity names: one per term of `key In
/// [value]` expressions (what the provisioner writes from a volume's
/// accessible topology); other terms name none.
pub fn affinity_segments(affinity: &VolumeNodeAffinity) -> Vec<Segment> {
    let terms = affinity.required.as_ref().map(|r| r.node_selector_terms.as_slice()).unwrap_or_default();
    terms
        .iter()
        .filter(|t| t.match_fields.as_ref().is_none_or(|f| f.is_empty()))
        .filter_map(|t| {
            let exprs = t.match_expressions.as_deref().unwrap_or_default();
            exprs
                .iter()
                .map(|e| match e.values.as_deref() {
                    Some([v]) if e.operator == "In" => Some((e.key.clone(), v.clone())),
                    _ => None,
                })
                .collect::<Option<Segment>>()
                .filter(|s| !s.is_empty())
        })
        .collect()
}

/// One step of the owner walk from an object the walk read.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnerStep {
    /// This is the owner.
    Done(OwnerReference),
    /// Read this object and walk on from it (`levels` more).
    Follow {
        /// Its `apiVersion`.
        api_version: String,
        /// Its kind.
        kind: String,
        /// Its name (same namespace).
        name: String,
        /// Levels left after it.
        levels: i64,
    },
}

/// Where the walk goes from `meta` (an object of `api_version`/`kind`) with
/// `levels` to go (upstream's `owner.Lookup`): 0 is `meta` itself; 1 its
/// controlling owner (not read: no `get` needed on it); more: that owner,
/// read, and on.
pub fn owner_step(meta: &ObjectMeta, api_version: &str, kind: &str, levels: i64) -> Result<OwnerStep, String> {
    let name = meta.name.clone().unwrap_or_default();
    if levels <= 0 {
        return Ok(OwnerStep::Done(OwnerReference {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            name,
            uid: meta.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        }));
    }
    let Some(owner) = meta.owner_references.iter().flatten().find(|o| o.controller == Some(true)) else {
        return Err(format!(
            "{api_version}/{kind} {name:?} in namespace {:?} has no controlling owner, cannot unwind the ownership further",
            meta.namespace.as_deref().unwrap_or_default()
        ));
    };
    if levels == 1 {
        return Ok(OwnerStep::Done(OwnerReference {
            controller: Some(true),
            block_owner_deletion: None,
            ..owner.clone()
        }));
    }
    Ok(OwnerStep::Follow {
        api_version: owner.api_version.clone(),
        kind: owner.kind.clone(),
        name: owner.name.clone(),
        levels: levels - 1,
    })
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
