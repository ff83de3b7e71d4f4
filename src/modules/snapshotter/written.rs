//! The newest version of each object this process wrote, kept against a
//! lagging cache: the content and group content queues both act on the
//! cached object unless their own last write is newer (upstream keeps its
//! own store for the same reason). Their JSON patches are sent here, so
//! that every answer is remembered.

use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc};

use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
};
use serde::de::DeserializeOwned;

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

/// Applies `patch` (a JSON patch when it is an array, else a merge patch)
/// to object `name`, or to its status subresource when `status`, and
/// remembers the answer.
pub(super) async fn patch<K>(
    api: &Api<K>,
    written: &Written<K>,
    name: &str,
    patch: serde_json::Value,
    status: bool,
) -> Result<Arc<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let (params, patch) = (PatchParams::default(), json_patch(patch)?);
    let c =
        if status { api.patch_status(name, &params, &patch).await? } else { api.patch(name, &params, &patch).await? };
    Ok(wrote(written, c))
}

fn json_patch(v: serde_json::Value) -> Result<Patch<serde_json::Value>, kube::Error> {
    if !v.is_array() {
        return Ok(Patch::Merge(v));
    }
    Ok(Patch::Json(serde_json::from_value(v).map_err(kube::Error::SerdeError)?))
}
