//! The capacity controller's state between reconciliations: the items that
//! should exist and the objects that do, kept up to date per change.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::storage::v1::CSIStorageCapacity;

use super::decide::{self, Item};

/// What a change asks of the queues.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Items to create or refresh.
    pub queue: Vec<Item>,
    /// Objects to delete (name, UID).
    pub delete: Vec<(String, String)>,
}

/// The desired items and the cached objects.
#[derive(Default)]
pub struct Tracker {
    ready: bool,
    desired: BTreeSet<Item>,
    objects: HashMap<String, CSIStorageCapacity>,
    work: u64,
}

impl Tracker {
    /// Whether `item` should exist.
    pub fn is_desired(&mut self, item: &Item) -> bool {
        self.work += self.desired.len() as u64;
        self.desired.clone().contains(item)
    }

    /// The desired items.
    pub fn desired(&self) -> &BTreeSet<Item> {
        &self.desired
    }

    /// The name of the object kept for `item` (the oldest).
    pub fn keep(&mut self, item: &Item) -> Option<String> {
        self.work += self.objects.len() as u64;
        let by = decide::by_item(self.objects.values());
        by.get(item).and_then(|l| l.first()).and_then(|o| o.metadata.name.clone())
    }

    /// Whether the object `name` with `uid` is obsolete or a duplicate.
    pub fn should_delete(&mut self, name: &str, uid: &str) -> bool {
        self.work += self.objects.len() as u64;
        decide::to_delete(self.objects.values(), &self.desired).iter().any(|(n, u)| n == name && u == uid)
    }

    /// (goal, current, obsolete), as [`decide::counts`].
    pub fn counts(&mut self) -> (usize, usize, usize) {
        self.work += self.objects.len() as u64;
        decide::counts(self.objects.values(), &self.desired)
    }

    /// Whether `item` has an object.
    pub fn has_object(&mut self, item: &Item) -> bool {
        self.keep(item).is_some()
    }

    fn full(&mut self, written: &dyn Fn(&Item) -> bool, previous: &BTreeSet<Item>) -> Plan {
        if !self.ready {
            return Plan::default();
        }
        self.work += 3 * self.objects.len() as u64 + self.desired.len() as u64;
        let have = decide::by_item(self.objects.values());
        let queue = self
            .desired
            .iter()
            .filter(|i| !previous.contains(*i) || (!have.contains_key(*i) && !written(i)))
            .cloned()
            .collect();
        let delete = decide::to_delete(self.objects.values(), &self.desired);
        Plan { queue, delete }
    }

    /// An object was added or changed.
    pub fn upsert(&mut self, obj: &CSIStorageCapacity) -> Plan {
        let name = obj.metadata.name.clone().unwrap_or_default();
        self.objects.insert(name, obj.clone());
        let previous = self.desired.clone();
        self.full(&|_| false, &previous)
    }

    /// The object `name` is gone.
    pub fn remove(&mut self, name: &str) -> Plan {
        self.objects.remove(name);
        let previous = self.desired.clone();
        self.full(&|_| false, &previous)
    }

    /// A reconciliation: `desired` should exist now. Queues the new items
    /// and the desired items without an object (unless `written`), and the
    /// obsolete and duplicate objects for deletion.
    pub fn set_desired(&mut self, desired: BTreeSet<Item>, written: &dyn Fn(&Item) -> bool) -> Plan {
        let previous = std::mem::replace(&mut self.desired, desired);
        self.ready = true;
        self.full(written, &previous)
    }

    /// Items and objects visited so far (the cost of the operations).
    pub fn work(&self) -> u64 {
        self.work
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
