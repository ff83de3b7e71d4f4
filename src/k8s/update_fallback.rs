//! Writes that still work under a role granting `update` but not `patch`.
//!
//! csi-sidecar writes with patches (no resourceVersion, so no conflict with
//! an unrelated change), and its manifests grant `patch`. Upstream's
//! sidecars write some kinds with `Update`, and their published RBAC grants
//! `update` only there (external-provisioner: claims). An operator who swaps
//! the image and keeps upstream's RBAC must not lose those writes, so when
//! the apiserver refuses a patch (403), the object is read again, changed,
//! and written whole with `replace` (a PUT carrying the resourceVersion just
//! read: a change in between answers 409, which the caller retries like any
//! failed write). Under csi-sidecar's own RBAC the fallback never runs.

use std::fmt::Debug;

use kube::{
    Api, Resource,
    api::{Patch, PatchParams, PostParams},
};
use serde::{Serialize, de::DeserializeOwned};

/// Whether the apiserver refused the request for the caller's role.
pub fn refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

/// After the role refused a patch of `name` (`refusal`): the object read
/// fresh, changed by `change` (which says whether there is anything to
/// write), and written back whole.
pub async fn update_instead<K>(
    api: &Api<K>,
    name: &str,
    refusal: &kube::Error,
    change: impl FnOnce(&mut K) -> bool,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    tracing::debug!(name, error = %refusal, "Patch refused; writing the object with an update instead");
    let mut obj = api.get(name).await?;
    if !change(&mut obj) {
        return Ok(());
    }
    api.replace(name, &PostParams::default(), &obj).await.map(drop)
}

/// The outcome of a patch of `name`: as it is, unless the role refused it;
/// then [`update_instead`] with `change`, the same edit on the whole object.
pub async fn or_update_instead<K>(
    patched: Result<(), kube::Error>,
    api: &Api<K>,
    name: &str,
    change: impl FnOnce(&mut K) -> bool,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    match patched {
        Err(e) if refused(&e) => update_instead(api, name, &e, change).await,
        other => other,
    }
}

/// `patch`, or [`update_instead`] with `change` when the role refuses it.
pub async fn patch_else_update<K, P>(
    api: &Api<K>,
    name: &str,
    patch: &Patch<P>,
    change: impl FnOnce(&mut K) -> bool,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
    P: Serialize + Debug,
{
    let patched = api.patch(name, &PatchParams::default(), patch).await.map(drop);
    or_update_instead(patched, api, name, change).await
}
