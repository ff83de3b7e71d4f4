//! The typed key of a work queue: which object of kind `K` a sync is for.
//! Its text is client-go's cache key (`namespace/name`, or `name` for a
//! cluster-scoped object), the form logs, `/debug/objects` and `explain`
//! show; code never builds or splits that text by hand.

use std::{
    cmp::Ordering,
    fmt,
    hash::{Hash, Hasher},
    marker::PhantomData,
};

use kube::{Resource, runtime::reflector::ObjectRef};

/// An object of kind `K` by namespace and name.
pub struct ObjectKey<K> {
    namespace: Option<String>,
    name: String,
    kind: PhantomData<fn() -> K>,
}

impl<K> ObjectKey<K> {
    /// A cluster-scoped object.
    pub fn named(name: impl Into<String>) -> Self {
        ObjectKey { namespace: None, name: name.into(), kind: PhantomData }
    }

    /// A namespaced object.
    pub fn namespaced(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey { namespace: Some(namespace.into()), name: name.into(), kind: PhantomData }
    }

    /// The key of an object from its metadata (namespaced when it has one).
    pub fn of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        ObjectKey {
            namespace: meta.namespace.clone().filter(|ns| !ns.is_empty()),
            name: meta.name.clone().unwrap_or_default(),
            kind: PhantomData,
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The object's namespace; `None` for a cluster-scoped object.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The reference the informer cache of `T` (a form of `K`) is keyed by.
    pub fn cache_ref<T: Resource<DynamicType = ()>>(&self) -> ObjectRef<T> {
        let r = ObjectRef::new(&self.name);
        match &self.namespace {
            Some(ns) => r.within(ns),
            None => r,
        }
    }
}

impl<K: Resource<DynamicType = ()>> ObjectKey<K> {
    /// The API kind of `K` (`/debug/objects` files keys under it).
    pub fn kind() -> &'static str {
        match K::kind(&()) {
            std::borrow::Cow::Borrowed(kind) => kind,
            // Every kind of the crate is a static text; a computed one is
            // made static once per queue that asks.
            std::borrow::Cow::Owned(kind) => Box::leak(kind.into_boxed_str()),
        }
    }
}

impl<K> Clone for ObjectKey<K> {
    fn clone(&self) -> Self {
        ObjectKey { namespace: self.namespace.clone(), name: self.name.clone(), kind: PhantomData }
    }
}

impl<K> PartialEq for ObjectKey<K> {
    fn eq(&self, other: &Self) -> bool {
        self.namespace == other.namespace && self.name == other.name
    }
}

impl<K> Eq for ObjectKey<K> {}

impl<K> Hash for ObjectKey<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.namespace.hash(state);
        self.name.hash(state);
    }
}

impl<K> PartialOrd for ObjectKey<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> Ord for ObjectKey<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        (&self.namespace, &self.name).cmp(&(&other.namespace, &other.name))
    }
}

impl<K> fmt::Display for ObjectKey<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

impl<K> fmt::Debug for ObjectKey<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::VolumeAttachment};

    use super::ObjectKey;

    #[test]
    fn the_text_is_client_go_s_cache_key() {
        assert_eq!(ObjectKey::<PersistentVolumeClaim>::namespaced("ns", "data-0").to_string(), "ns/data-0");
        assert_eq!(ObjectKey::<VolumeAttachment>::named("csi-1").to_string(), "csi-1");
    }

    #[test]
    fn an_empty_namespace_in_metadata_is_cluster_scoped() {
        let meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("pv-1".into()),
            namespace: Some(String::new()),
            ..Default::default()
        };
        assert_eq!(ObjectKey::<VolumeAttachment>::of(&meta), ObjectKey::named("pv-1"));
    }

    #[test]
    fn the_kind_comes_from_the_type() {
        assert_eq!(ObjectKey::<VolumeAttachment>::kind(), "VolumeAttachment");
        assert_eq!(ObjectKey::<PersistentVolumeClaim>::kind(), "PersistentVolumeClaim");
    }

    #[test]
    fn keys_order_by_namespace_then_name() {
        let mut keys = [
            ObjectKey::<PersistentVolumeClaim>::namespaced("b", "a"),
            ObjectKey::namespaced("a", "z"),
            ObjectKey::named("c"),
        ];
        keys.sort();
        let text: Vec<String> = keys.iter().map(ToString::to_string).collect();
        assert_eq!(text, ["c", "a/z", "b/a"]);
    }
}
