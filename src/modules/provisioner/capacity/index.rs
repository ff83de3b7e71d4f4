//! The capacity controller's state between reconciliations: the items that
//! should exist and an index of the objects that do, updated per change,
//! so that a refresh, a lookup or a watch event of one object costs work
//! for that object only (not a scan of every object, nor a reconciliation).

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::{api::storage::v1::CSIStorageCapacity, jiff::Timestamp};

use super::decide::{self, Item};

/// What a change asks of the queues.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Items to create or refresh.
    pub queue: Vec<Item>,
    /// Objects to delete (name, UID).
    pub delete: Vec<(String, String)>,
}

/// One cached object, as the index knows it.
#[derive(Clone, Debug)]
struct Entry {
    item: Option<Item>,
    uid: String,
    created: Option<Timestamp>,
}

/// The desired items and the index of the cached objects.
#[derive(Default)]
pub struct Tracker {
    /// Set by the first reconciliation: before it, no change plans
    /// anything (every object would look obsolete).
    ready: bool,
    desired: BTreeSet<Item>,
    /// Object name → entry.
    objects: HashMap<String, Entry>,
    /// Item → the names of its objects, the one to keep (the oldest; by
    /// name among equals) first.
    by_item: HashMap<Item, Vec<(Option<Timestamp>, String)>>,
    /// Desired items with an object.
    current: usize,
    /// Objects serving no desired item.
    obsolete: usize,
    work: u64,
}

impl Tracker {
    /// Whether `item` should exist.
    pub fn is_desired(&mut self, item: &Item) -> bool {
        self.work += 1;
        self.desired.contains(item)
    }

    /// Whether a reconciliation has set the desired items.
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// The desired items.
    pub fn desired(&self) -> &BTreeSet<Item> {
        &self.desired
    }

    /// The name of the object kept for `item` (the oldest).
    pub fn keep(&mut self, item: &Item) -> Option<String> {
        self.work += 1;
        self.by_item.get(item).and_then(|l| l.first()).map(|(_, n)| n.clone())
    }

    /// Whether `item` has an object.
    pub fn has_object(&mut self, item: &Item) -> bool {
        self.work += 1;
        self.by_item.contains_key(item)
    }

    /// Whether the object `name` with `uid` is obsolete or a duplicate
    /// ([`decide::to_delete`]).
    pub fn should_delete(&mut self, name: &str, uid: &str) -> bool {
        self.work += 1;
        let Some(e) = self.objects.get(name).filter(|e| e.uid == uid) else { return false };
        match &e.item {
            Some(i) if self.desired.contains(i) => {
                self.by_item.get(i).and_then(|l| l.first()).is_some_and(|(_, first)| first != name)
            }
            _ => true,
        }
    }

    /// (goal, current, obsolete), as [`decide::counts`].
    pub fn counts(&mut self) -> (usize, usize, usize) {
        (self.desired.len(), self.current, self.obsolete)
    }

    fn serves(&self, e: &Entry) -> bool {
        e.item.as_ref().is_some_and(|i| self.desired.contains(i))
    }

    fn unindex(&mut self, name: &str) -> Option<Entry> {
        let e = self.objects.remove(name)?;
        if !self.serves(&e) {
            self.obsolete -= 1;
        }
        if let Some(i) = &e.item
            && let Some(list) = self.by_item.get_mut(i)
        {
            self.work += list.len() as u64;
            list.retain(|(_, n)| n != name);
            if list.is_empty() {
                self.by_item.remove(i);
                if self.desired.contains(i) {
                    self.current -= 1;
                }
            }
        }
        Some(e)
    }

    fn index(&mut self, name: String, e: Entry) {
        if !self.serves(&e) {
            self.obsolete += 1;
        }
        if let Some(i) = &e.item {
            let list = self.by_item.entry(i.clone()).or_default();
            self.work += list.len() as u64 + 1;
            let key = (e.created, name.clone());
            let at = list.partition_point(|k| *k < key);
            list.insert(at, key);
            if list.len() == 1 && self.desired.contains(i) {
                self.current += 1;
            }
        }
        self.objects.insert(name, e);
    }

    /// What `item` needs after a change of its objects: queued when
    /// desired without an object, its duplicates deleted.
    fn plan_item(&mut self, item: &Item, plan: &mut Plan) {
        if !self.desired.contains(item) {
            return;
        }
        match self.by_item.get(item) {
            None => plan.queue.push(item.clone()),
            Some(list) => {
                self.work += list.len() as u64;
                for (_, n) in list.iter().skip(1) {
                    let uid = self.objects.get(n).map(|e| e.uid.clone()).unwrap_or_default();
                    plan.delete.push((n.clone(), uid));
                }
            }
        }
    }

    fn plan_change(&mut self, name: &str, old: Option<Entry>) -> Plan {
        let mut plan = Plan::default();
        if !self.ready {
            return plan;
        }
        let new = self.objects.get(name).cloned();
        if let Some(e) = &new
            && !self.serves(e)
        {
            plan.delete.push((name.to_string(), e.uid.clone()));
        }
        let items: BTreeSet<Item> = [old, new].into_iter().flatten().filter_map(|e| e.item).collect();
        for i in &items {
            self.plan_item(i, &mut plan);
        }
        plan
    }

    /// An object was added or changed.
    pub fn upsert(&mut self, obj: &CSIStorageCapacity) -> Plan {
        let name = obj.metadata.name.clone().unwrap_or_default();
        let old = self.unindex(&name);
        let entry = Entry {
            item: decide::item_of(obj),
            uid: obj.metadata.uid.clone().unwrap_or_default(),
            created: obj.metadata.creation_timestamp.as_ref().map(|t| t.0),
        };
        self.index(name.clone(), entry);
        self.plan_change(&name, old)
    }

    /// The object `name` is gone.
    pub fn remove(&mut self, name: &str) -> Plan {
        let old = self.unindex(name);
        self.plan_change(name, old)
    }

    /// A reconciliation: `desired` should exist now. Queues the new items
    /// and the desired items without an object (unless `written`), and the
    /// obsolete and duplicate objects for deletion.
    pub fn set_desired(&mut self, desired: BTreeSet<Item>, written: &dyn Fn(&Item) -> bool) -> Plan {
        let previous = std::mem::replace(&mut self.desired, desired);
        self.ready = true;
        self.work += (self.desired.len() + self.objects.len()) as u64;
        let mut plan = Plan::default();
        for i in &self.desired {
            if !previous.contains(i) || (!self.by_item.contains_key(i) && !written(i)) {
                plan.queue.push(i.clone());
            }
        }
        self.current = self.desired.iter().filter(|i| self.by_item.contains_key(*i)).count();
        self.obsolete = 0;
        for (name, e) in &self.objects {
            match &e.item {
                Some(i) if self.desired.contains(i) => {
                    let first = self.by_item.get(i).and_then(|l| l.first()).map(|(_, n)| n);
                    if first.is_some_and(|f| f != name) {
                        plan.delete.push((name.clone(), e.uid.clone()));
                    }
                }
                _ => {
                    self.obsolete += 1;
                    plan.delete.push((name.clone(), e.uid.clone()));
                }
            }
        }
        plan.delete.sort();
        plan
    }

    /// Items and objects visited so far (the cost of the operations).
    pub fn work(&self) -> u64 {
        self.work
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
