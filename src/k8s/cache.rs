//! The object store behind each shared informer.
//!
//! Like kube-runtime's reflector store (same `get(&ObjectRef)` / `state()`
//! surface), but the table holds only `Arc<K>` and finds an object by the
//! hash of its namespace and name, compared against the object's own
//! metadata. kube's store keys every object by an `ObjectRef` that copies its
//! name, namespace, resourceVersion and UID (four more strings and ~100 bytes
//! of key per object): at tens of thousands of cached volumes that was a
//! tenth of the memory.
//!
//! One store per kind holds the union of what the modules' views keep; a
//! [`Cache`] handle may be a view that sees only the objects its filter
//! accepts. Secondary indexes (e.g. VolumeAttachments by PV name) answer
//! "which objects point at X" without scanning the store.

use parking_lot::RwLock;
use std::{
    collections::HashMap,
    hash::{BuildHasher, Hash, Hasher},
    sync::Arc,
};

use hashbrown::{DefaultHashBuilder, HashTable};
use kube::{Resource, runtime::reflector::ObjectRef, runtime::watcher::Event};

type Table<K> = HashTable<Arc<K>>;

/// Which objects a view sees.
pub type Keep<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

/// The value an object is indexed under (`None`: not indexed).
pub type IndexFn<K> = fn(&K) -> Option<&str>;

/// The values an object is indexed under (it may be filed under several,
/// e.g. a pod under each claim it uses).
pub type MultiIndexFn<K> = fn(&K) -> Vec<String>;

/// How an index finds an object's values.
enum Keys<K> {
    One(IndexFn<K>),
    Many(MultiIndexFn<K>),
}

impl<K> Keys<K> {
    fn of(&self, obj: &K) -> Vec<String> {
        match self {
            Keys::One(f) => f(obj).map(str::to_string).into_iter().collect(),
            Keys::Many(f) => {
                let mut v = f(obj);
                v.sort();
                v.dedup();
                v
            }
        }
    }
}

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

fn same_object<K: Resource>(a: &K, b: &K) -> bool {
    let (ns, n) = names(b);
    same(a, ns, n)
}

struct Index<K> {
    name: &'static str,
    key: Keys<K>,
    map: HashMap<String, Vec<Arc<K>>>,
}

impl<K: Resource> Index<K> {
    fn insert(&mut self, obj: &Arc<K>) {
        for v in self.key.of(obj) {
            self.map.entry(v).or_default().push(obj.clone());
        }
    }

    fn remove(&mut self, obj: &K) {
        for v in self.key.of(obj) {
            if let Some(list) = self.map.get_mut(&v) {
                list.retain(|o| !same_object(o.as_ref(), obj));
                if list.is_empty() {
                    self.map.remove(&v);
                }
            }
        }
    }

    fn rebuild(&mut self, table: &Table<K>) {
        self.map.clear();
        for o in table.iter() {
            self.insert(o);
        }
    }
}

struct Content<K> {
    table: Table<K>,
    indexes: Vec<Index<K>>,
}

/// One kind's objects: the table and its indexes, under one lock.
struct Store<K> {
    content: RwLock<Content<K>>,
    hasher: DefaultHashBuilder,
}

/// A read handle on one kind's cached objects, possibly a filtered view
/// (cheap to clone).
pub struct Cache<K> {
    store: Arc<Store<K>>,
    view: Option<Keep<K>>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Cache { store: self.store.clone(), view: self.view.clone() }
    }
}

impl<K: Resource> Default for Cache<K> {
    fn default() -> Self {
        let content = Content { table: Table::new(), indexes: Vec::new() };
        Cache {
            store: Arc::new(Store { content: RwLock::new(content), hasher: DefaultHashBuilder::default() }),
            view: None,
        }
    }
}

impl<K: Resource> Cache<K> {
    fn read(&self) -> parking_lot::RwLockReadGuard<'_, Content<K>> {
        self.store.content.read()
    }

    fn sees(&self, obj: &K) -> bool {
        self.view.as_ref().is_none_or(|keep| keep(obj))
    }

    /// The same store seen through `keep`.
    pub fn view(&self, keep: Keep<K>) -> Cache<K> {
        Cache { store: self.store.clone(), view: Some(keep) }
    }

    /// The object `key` names (its namespace and name; other fields ignored).
    pub fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>>
    where
        K::DynamicType: Eq + Hash + Clone,
    {
        self.get_named(key.namespace.as_deref(), &key.name)
    }

    /// The object with this namespace (None: cluster-scoped) and name.
    pub fn get_named(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let h = key_hash(&self.store.hasher, namespace, name);
        let content = self.read();
        content.table.find(h, |o| same(o.as_ref(), namespace, name)).filter(|o| self.sees(o)).cloned()
    }

    /// Every cached object (of this view).
    pub fn state(&self) -> Vec<Arc<K>> {
        self.read().table.iter().filter(|o| self.sees(o)).cloned().collect()
    }

    /// How many objects are cached (in this view).
    pub fn len(&self) -> usize {
        let content = self.read();
        match &self.view {
            None => content.table.len(),
            Some(keep) => content.table.iter().filter(|o| keep(o)).count(),
        }
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds the index `name` (no-op if the store has it already).
    pub fn add_index(&self, name: &'static str, key: IndexFn<K>) {
        self.add(name, Keys::One(key));
    }

    /// Adds the index `name` filing each object under every value `key`
    /// gives (no-op if the store has it already).
    pub fn add_multi_index(&self, name: &'static str, key: MultiIndexFn<K>) {
        self.add(name, Keys::Many(key));
    }

    fn add(&self, name: &'static str, key: Keys<K>) {
        let mut content = self.store.content.write();
        if content.indexes.iter().any(|i| i.name == name) {
            return;
        }
        let mut index = Index { name, key, map: HashMap::new() };
        index.rebuild(&content.table);
        content.indexes.push(index);
    }

    /// The objects (of this view) that index `name` files under `value`;
    /// empty if there is no such index.
    pub fn by_index(&self, name: &str, value: &str) -> Vec<Arc<K>> {
        let content = self.read();
        let Some(index) = content.indexes.iter().find(|i| i.name == name) else { return Vec::new() };
        index.map.get(value).into_iter().flatten().filter(|o| self.sees(o)).cloned().collect()
    }
}

/// Stores `obj` in `table`, returning the version it replaced.
fn table_insert<K: Resource>(hasher: &DefaultHashBuilder, table: &mut Table<K>, obj: Arc<K>) -> Option<Arc<K>> {
    let (ns, name) = names(obj.as_ref());
    let h = key_hash(hasher, ns, name);
    if let Some(slot) = table.find_mut(h, |o| same(o.as_ref(), ns, name)) {
        return Some(std::mem::replace(slot, obj));
    }
    table.insert_unique(h, obj, |o| {
        let (ns, name) = names(o.as_ref());
        key_hash(hasher, ns, name)
    });
    None
}

impl<K: Resource> Content<K> {
    /// Stores `obj`, returning the version it replaced.
    fn insert(&mut self, hasher: &DefaultHashBuilder, obj: Arc<K>) -> Option<Arc<K>> {
        let old = table_insert(hasher, &mut self.table, obj.clone());
        for index in &mut self.indexes {
            if let Some(o) = &old {
                index.remove(o);
            }
            index.insert(&obj);
        }
        old
    }

    fn remove(&mut self, hasher: &DefaultHashBuilder, obj: &K) -> Option<Arc<K>> {
        let (ns, name) = names(obj);
        let h = key_hash(hasher, ns, name);
        let old = self.table.find_entry(h, |x| same(x.as_ref(), ns, name)).ok().map(|e| e.remove().0)?;
        for index in &mut self.indexes {
            index.remove(&old);
        }
        Some(old)
    }
}

/// One object's change as the store saw it: `old` is what it held before,
/// `new` what it holds now (`None`: absent).
pub struct Transition<K> {
    /// The version replaced or removed.
    pub old: Option<Arc<K>>,
    /// The version stored.
    pub new: Option<Arc<K>>,
}

fn changed<K: Resource>(old: &K, new: &K) -> bool {
    match (&old.meta().resource_version, &new.meta().resource_version) {
        (Some(a), Some(b)) => a != b,
        _ => true,
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

    /// Applies one event; `keep` says which objects the store holds at all
    /// (an object that stops matching is removed). Returns what changed,
    /// after the store holds it: nothing during a relist, then at its end
    /// every object added, changed (by resourceVersion) or gone compared
    /// with the content it replaced (client-go's `Replace`).
    pub fn apply(&mut self, event: Event<K>, keep: &dyn Fn(&K) -> bool) -> Vec<Transition<K>> {
        let hasher = &self.cache.store.hasher;
        let write = || self.cache.store.content.write();
        match event {
            Event::Apply(o) if keep(&o) => {
                let new = Arc::new(o);
                let old = write().insert(hasher, new.clone());
                vec![Transition { old, new: Some(new) }]
            }
            Event::Apply(o) | Event::Delete(o) => {
                write().remove(hasher, &o).map(|old| Transition { old: Some(old), new: None }).into_iter().collect()
            }
            Event::Init => {
                self.relist = Some(Table::new());
                Vec::new()
            }
            Event::InitApply(o) => {
                if keep(&o) {
                    table_insert(hasher, self.relist.get_or_insert_with(Table::new), Arc::new(o));
                }
                Vec::new()
            }
            Event::InitDone => {
                let fresh = self.relist.take().unwrap_or_default();
                let mut content = write();
                let old = std::mem::replace(&mut content.table, fresh);
                let content = &mut *content;
                for index in &mut content.indexes {
                    index.rebuild(&content.table);
                }
                replace_diff(hasher, &old, &content.table)
            }
        }
    }
}

/// What a relist changed: `fresh` replaced `old`.
fn replace_diff<K: Resource>(hasher: &DefaultHashBuilder, old: &Table<K>, fresh: &Table<K>) -> Vec<Transition<K>> {
    let find = |t: &Table<K>, o: &K| {
        let (ns, name) = names(o);
        t.find(key_hash(hasher, ns, name), |x| same(x.as_ref(), ns, name)).cloned()
    };
    let mut out = Vec::new();
    for new in fresh.iter() {
        match find(old, new) {
            Some(prev) if !changed(prev.as_ref(), new.as_ref()) => {}
            prev => out.push(Transition { old: prev, new: Some(new.clone()) }),
        }
    }
    for prev in old.iter() {
        if find(fresh, prev).is_none() {
            out.push(Transition { old: Some(prev.clone()), new: None });
        }
    }
    out
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
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                resource_version: Some(v.into()),
                ..Default::default()
            },
            data: Some([("v".to_string(), v.to_string())].into()),
            ..Default::default()
        }
    }

    fn value(c: &Cache<ConfigMap>, ns: &str, name: &str) -> Option<String> {
        c.get(&ObjectRef::new(name).within(ns)).and_then(|o| o.data.clone()?.get("v").cloned())
    }

    fn all(_: &ConfigMap) -> bool {
        true
    }

    fn summary(ts: &[Transition<ConfigMap>]) -> Vec<String> {
        let name = |o: &Option<Arc<ConfigMap>>| {
            o.as_ref().map(|o| format!("{}@{}", o.metadata.name.clone().unwrap_or_default(), value_of(o)))
        };
        let mut v: Vec<String> = ts
            .iter()
            .map(|t| format!("{}->{}", name(&t.old).unwrap_or("-".into()), name(&t.new).unwrap_or("-".into())))
            .collect();
        v.sort();
        v
    }

    fn value_of(o: &ConfigMap) -> String {
        o.data.as_ref().and_then(|d| d.get("v").cloned()).unwrap_or_default()
    }

    #[test]
    fn apply_delete_and_namespaces() {
        let cache = Cache::<ConfigMap>::default();
        let mut w = Writer::new(cache.clone());
        w.apply(Event::Apply(cm("a", "x", "1")), &all);
        w.apply(Event::Apply(cm("b", "x", "2")), &all);
        let t = w.apply(Event::Apply(cm("a", "x", "3")), &all);
        assert_eq!(summary(&t), vec!["x@1->x@3"], "the replaced version is returned");
        assert_eq!(cache.len(), 2);
        assert_eq!(value(&cache, "a", "x").as_deref(), Some("3"), "replaced in place");
        assert_eq!(value(&cache, "b", "x").as_deref(), Some("2"), "same name, other namespace");
        assert_eq!(value(&cache, "c", "x"), None);
        let t = w.apply(Event::Delete(cm("a", "x", "")), &all);
        assert_eq!(summary(&t), vec!["x@3->-"]);
        assert_eq!(value(&cache, "a", "x"), None);
        assert_eq!(cache.len(), 1);
        assert!(w.apply(Event::Delete(cm("a", "missing", "")), &all).is_empty(), "nothing to announce");
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn an_object_that_stops_matching_leaves_the_store() {
        let cache = Cache::<ConfigMap>::default();
        let mut w = Writer::new(cache.clone());
        let odd = |c: &ConfigMap| value_of(c).parse::<u32>().is_ok_and(|v| v % 2 == 1);
        w.apply(Event::Apply(cm("a", "x", "1")), &odd);
        let t = w.apply(Event::Apply(cm("a", "x", "2")), &odd);
        assert_eq!(summary(&t), vec!["x@1->-"]);
        assert!(cache.is_empty());
        assert!(w.apply(Event::Apply(cm("a", "y", "4")), &odd).is_empty(), "never matched: nothing");
    }

    #[test]
    fn a_relist_replaces_the_content_when_done_and_returns_the_differences() {
        let cache = Cache::<ConfigMap>::default();
        let mut w = Writer::new(cache.clone());
        for (n, v) in [("same", "1"), ("changed", "1"), ("gone", "1")] {
            w.apply(Event::Apply(cm("a", n, v)), &all);
        }
        assert!(w.apply(Event::Init, &all).is_empty());
        for (n, v) in [("same", "1"), ("changed", "2"), ("new", "1")] {
            assert!(w.apply(Event::InitApply(cm("a", n, v)), &all).is_empty(), "nothing announced mid-relist");
        }
        assert_eq!(value(&cache, "a", "gone").as_deref(), Some("1"), "old content served until the relist is done");
        assert_eq!(value(&cache, "a", "new"), None);
        let t = w.apply(Event::InitDone, &all);
        assert_eq!(summary(&t), vec!["-->new@1", "changed@1->changed@2", "gone@1->-"]);
        assert_eq!(value(&cache, "a", "gone"), None);
        assert_eq!(value(&cache, "a", "new").as_deref(), Some("1"));
        assert_eq!(cache.state().len(), 3);
    }

    #[test]
    fn views_see_only_what_their_filter_keeps() {
        let cache = Cache::<ConfigMap>::default();
        let mut w = Writer::new(cache.clone());
        w.apply(Event::Apply(cm("a", "x", "1")), &all);
        w.apply(Event::Apply(cm("a", "y", "2")), &all);
        let ones = cache.view(Arc::new(|c: &ConfigMap| value_of(c) == "1"));
        assert_eq!(ones.len(), 1);
        assert!(ones.get_named(Some("a"), "x").is_some());
        assert!(ones.get_named(Some("a"), "y").is_none());
        assert_eq!(cache.len(), 2);
    }

    fn value_index(c: &ConfigMap) -> Option<&str> {
        c.data.as_ref()?.get("v").map(String::as_str)
    }

    #[test]
    fn an_index_follows_every_change() {
        let cache = Cache::<ConfigMap>::default();
        let mut w = Writer::new(cache.clone());
        w.apply(Event::Apply(cm("a", "x", "1")), &all);
        cache.add_index("v", value_index);
        cache.add_index("v", value_index);
        w.apply(Event::Apply(cm("a", "y", "1")), &all);
        let names = |v: &str| {
            let mut n: Vec<_> = cache.by_index("v", v).iter().filter_map(|o| o.metadata.name.clone()).collect();
            n.sort();
            n
        };
        assert_eq!(names("1"), vec!["x", "y"], "built from the content and kept up to date");
        w.apply(Event::Apply(cm("a", "x", "2")), &all);
        assert_eq!(names("1"), vec!["y"]);
        assert_eq!(names("2"), vec!["x"]);
        w.apply(Event::Delete(cm("a", "y", "1")), &all);
        assert!(names("1").is_empty());
        w.apply(Event::Init, &all);
        w.apply(Event::InitApply(cm("a", "z", "2")), &all);
        w.apply(Event::InitDone, &all);
        assert_eq!(names("2"), vec!["z"], "rebuilt by a relist");
        assert!(cache.by_index("missing", "2").is_empty());
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
            w.apply(Event::Apply(ns), &|_| true);
        }
        assert_eq!(cache.len(), 5000);
        assert!((0..5000).all(|i| cache.get_named(None, &format!("ns-{i}")).is_some()));
        assert!(cache.get(&ObjectRef::new("ns-4999")).is_some());
        assert!(cache.get_named(None, "ns-5000").is_none());
    }
}
