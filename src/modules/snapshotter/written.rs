//! The newest version of each object this process wrote, kept against a
//! lagging cache: the content and group content queues both act on the
//! cached object unless their own last write is newer (upstream keeps its
//! own store for the same reason).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use ::kube::Resource;

use super::{decide::is_older, lock};

/// Name → the last version written.
pub(super) type Written<K> = Arc<Mutex<HashMap<String, Arc<K>>>>;

/// The object to act on: `cached`, or the one written if the cache is
/// behind it. An object gone from the cache is forgotten, and so is a
/// written version the cache has caught up with.
pub(super) fn current<K: Resource>(written: &Written<K>, name: &str, cached: Option<Arc<K>>) -> Option<Arc<K>> {
    let mut written = lock(written);
    match (cached, written.get(name)) {
        (None, _) => {
            written.remove(name);
            None
        }
        (Some(c), Some(mine))
            if is_older(c.meta().resource_version.as_deref(), mine.meta().resource_version.as_deref()) =>
        {
            Some(mine.clone())
        }
        (Some(c), _) => {
            written.remove(name);
            Some(c)
        }
    }
}

/// Remembers `c`, the apiserver's answer to a write.
pub(super) fn wrote<K: Resource>(written: &Written<K>, c: K) -> Arc<K> {
    let c = Arc::new(c);
    lock(written).insert(c.meta().name.clone().unwrap_or_default(), c.clone());
    c
}
