//! What the apiserver serves, asked through discovery (never assumed from
//! a version number).

use kube::Client;

/// Whether the apiserver serves `storage.k8s.io/v1` VolumeAttributesClass.
pub async fn vac_served(client: &Client) -> bool {
    match client.list_api_group_resources(crate::compat::api::STORAGE_V1).await {
        Ok(list) => list.resources.iter().any(|r| r.kind == "VolumeAttributesClass"),
        Err(e) => {
            tracing::warn!(error = %e, "Cannot discover storage.k8s.io/v1; assuming no VolumeAttributesClass");
            false
        }
    }
}
