//! The object store behind each shared informer.
//!
//! Like kube-runtime's reflector store (same `get(&ObjectRef)` / `state()`
//! surface), but the table holds only `Arc<K>` and finds an object by the
//! hash of its namespace and name, compared against the object's own
//! metadata. kube's store keys every object by an `ObjectRef` that copies its
//! name, namespace, resourceVersion and UID (four more strings and ~100 bytes
//! of key per object): at tens of thousands of cached volumes that was a
//! tenth of the memory.

use std::{
    hash::{BuildHasher, Hash, Hasher},
    sync::{Arc, RwLock},
};

use hashbrown::{DefaultHashBuilder, HashTable};
use kube::{Resource, runtime::reflector::ObjectRef, runtime::watcher::Event};

type Table<K> = HashTable<Arc<K>>;

fn key_hash(hasher: &DefaultHashBuilder, namespace: Option<&str>, name: &str) -> u64 {
    let mut h = hasher.build_hasher();
    namespace.unwrap_or_default().hash(&mut h);
    name.hash(&mut h);
    h.finish()
}

fn names<K: Resource>(obj: &K) -> (Option<&str>, &str) {
    let m = obj.meta();
    (m.namespace.as_deref(), m.name.as_deref().unwrap_or_default())
}

fn same<K: Resource>(obj: &K, namespace: Option<&str>, name: &str) -> bool {
    let (ns, n) = names(obj);
    n == name && ns.unwrap_or_default() == namespace.unwrap_or_default()
}

/// A read handle on one kind's cached objects (cheap to clone).
pub struct Cache<K> {
    table: Arc<RwLock<Table<K>>>,
    hasher: DefaultHashBuilder,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Cache { table: self.table.clone(), hasher: self.hasher.clone() }
    }
}

impl<K: Resource> Default for Cache<K> {
    fn default() -> Self {
        Cache { table: Arc::default(), hasher: DefaultHashBuilder::default() }
    }
}

impl<K: Resource> Cache<K> {
    /// The object `key` names (its namespace and name; other fields ignored).
    pub fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>>
    where
        K::DynamicType: Eq + Hash + Clone,
    {
        self.get_named(key.namespace.as_deref(), &key.name)
    }

    /// The object with this namespace (None: cluster-scoped) and name.
    pub fn get_named(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let h = key_hash(&self.hasher, namespace, name);
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        table.find(h, |o| same(o.as_ref(), namespace, name)).cloned()
    }

    /// Every cached object.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.table.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert_into(hasher: &DefaultHashBuilder, table: &mut Table<K>, obj: Arc<K>) {
        let (ns, name) = names(obj.as_ref());
        let h = key_hash(hasher, ns, name);
        match table.find_mut(h, |o| same(o.as_ref(), ns, name)) {
            Some(slot) => *slot = obj,
            None => {
                table.insert_unique(h, obj, |o| {
                    let (ns, name) = names(o.as_ref());
                    key_hash(hasher, ns, name)
                });
            }
        }
    }
}

/// Applies watch events to a [`Cache`]; owned by the one watch task.
pub struct Writer<K> {
    cache: Cache<K>,
    /// Objects of a (re)list in progress; swapped in when it is done.
    relist: Option<Table<K>>,
}

impl<K: Resource> Writer<K> {
    /// A writer for `cache`.
    pub fn new(cache: Cache<K>) -> Self {
        Writer { cache, relist: None }
    }

    /// Applies one event and returns the object it stored or removed (for
    /// change handlers), like kube's reflector: a relist replaces the whole
    /// content at its end.
    pub fn apply(&mut self, event: Event<K>) -> Option<Applied<K>> {
        let hasher = &self.cache.hasher;
        match event {
            Event::Apply(o) => {
                let o = Arc::new(o);
                let mut table = self.cache.table.write().unwrap_or_else(|e| e.into_inner());
                Cache::insert_into(hasher, &mut table, o.clone());
                Some(Applied::Stored(o))
            }
            Event::Delete(o) => {
                let (ns, name) = names(&o);
                let h = key_hash(hasher, ns, name);
                let mut table = self.cache.table.write().unwrap_or_else(|e| e.into_inner());
                if let Ok(entry) = table.find_entry(h, |x| same(x.as_ref(), ns, name)) {
                    entry.remove();
                }
                Some(Applied::Removed(o))
            }
            Event::Init => {
                self.relist = Some(Table::new());
                None
            }
            Event::InitApply(o) => {
                let o = Arc::new(o);
                let relist = self.relist.get_or_insert_with(Table::new);
                Cache::insert_into(hasher, relist, o.clone());
                Some(Applied::Stored(o))
            }
            Event::InitDone => {
                let relist = self.relist.take().unwrap_or_default();
                *self.cache.table.write().unwrap_or_else(|e| e.into_inner()) = relist;
                None
            }
        }
    }
}

/// What a watch event did to the cache.
pub enum Applied<K> {
    /// The object is (or, during a relist, will be) cached.
    Stored(Arc<K>),
    /// The object was removed.
    Removed(K),
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{ConfigMap, Namespace},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use super::*;

    fn cm(ns: &str, name: &str, v: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
            data: Some([("v".to_string(), v.to_string())].into()),
            ..Default::default()
        }
    }

    fn value(c: &Cache<ConfigMap>, ns: &str, name: &str) -> Option<String> {
        c.get(&ObjectRef::new(name).within(ns)).and_then(|o| o.data.clone()?.get("v").cloned())
    }

    #[test]
    fn apply_delete_and_namespaces() {
        let cache = Cache::<ConfigMap>::default();
        let mut w = Writer::new(cache.clone());
        w.apply(Event::Apply(cm("a", "x", "1")));
        w.apply(Event::Apply(cm("b", "x", "2")));
        w.apply(Event::Apply(cm("a", "x", "3")));
        assert_eq!(cache.len(), 2);
        assert_eq!(value(&cache, "a", "x").as_deref(), Some("3"), "replaced in place");
        assert_eq!(value(&cache, "b", "x").as_deref(), Some("2"), "same name, other namespace");
        assert_eq!(value(&cache, "c", "x"), None);
        w.apply(Event::Delete(cm("a", "x", "")));
        assert_eq!(value(&cache, "a", "x"), None);
        assert_eq!(cache.len(), 1);
        w.apply(Event::Delete(cm("a", "missing", "")));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_relist_replaces_the_content_when_done() {
        let cache = Cache::<ConfigMap>::default();
        let mut w = Writer::new(cache.clone());
        w.apply(Event::Apply(cm("a", "old", "1")));
        w.apply(Event::Init);
        w.apply(Event::InitApply(cm("a", "new", "2")));
        assert_eq!(value(&cache, "a", "old").as_deref(), Some("1"), "old content served until the relist is done");
        assert_eq!(value(&cache, "a", "new"), None);
        w.apply(Event::InitDone);
        assert_eq!(value(&cache, "a", "old"), None);
        assert_eq!(value(&cache, "a", "new").as_deref(), Some("2"));
        assert_eq!(cache.state().len(), 1);
    }

    #[test]
    fn many_objects_and_cluster_scope() {
        let cache = Cache::<Namespace>::default();
        let mut w = Writer::new(cache.clone());
        for i in 0..5000 {
            let ns = Namespace {
                metadata: ObjectMeta { name: Some(format!("ns-{i}")), ..Default::default() },
                ..Default::default()
            };
            w.apply(Event::Apply(ns));
        }
        assert_eq!(cache.len(), 5000);
        assert!((0..5000).all(|i| cache.get_named(None, &format!("ns-{i}")).is_some()));
        assert!(cache.get(&ObjectRef::new("ns-4999")).is_some());
        assert!(cache.get_named(None, "ns-5000").is_none());
    }
}
