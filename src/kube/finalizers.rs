//! Adding and removing one finalizer with a JSON patch that names it
//! (`test` + `remove` at its index), without a resourceVersion: an unrelated
//! update of the object (another controller's finalizer or status) does not
//! make the patch conflict, and a changed list makes the `test` fail instead
//! of removing the wrong entry.

use std::fmt::Debug;

use ::kube::{
    Api, Resource,
    api::{Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};

fn patch(ops: serde_json::Value) -> Result<json_patch::Patch, ::kube::Error> {
    serde_json::from_value(ops).map_err(::kube::Error::SerdeError)
}

/// Adds `finalizer` unless present.
pub async fn add<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<(), ::kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let meta = obj.meta();
    let current = meta.finalizers.clone().unwrap_or_default();
    if current.iter().any(|f| f == finalizer) {
        return Ok(());
    }
    let ops = if meta.finalizers.is_none() {
        serde_json::json!([{"op": "add", "path": "/metadata/finalizers", "value": [finalizer]}])
    } else {
        serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": current},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ])
    };
    let name = meta.name.clone().unwrap_or_default();
    api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch(ops)?)).await.map(|_| ())
}

/// Removes `finalizer` if present; an object already gone is fine.
pub async fn remove<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<(), ::kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let meta = obj.meta();
    let Some(i) = meta.finalizers.iter().flatten().position(|f| f == finalizer) else { return Ok(()) };
    let path = format!("/metadata/finalizers/{i}");
    let ops = serde_json::json!([
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]);
    let name = meta.name.clone().unwrap_or_default();
    match api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch(ops)?)).await {
        Ok(_) => Ok(()),
        Err(::kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}
