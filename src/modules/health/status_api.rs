//! Whether the apiserver keeps `PersistentVolumeClaim.status.healthStatus`
//! (Kubernetes 1.37 with the `CSIVolumeHealth` gate): found out once, by a
//! server-side dry-run patch of a claim's status, never assumed from a
//! version number. An older apiserver (or the gate off) drops the field,
//! and the health goes out as events instead; so it does when the RBAC
//! does not grant `patch` on `persistentvolumeclaims/status` (an optional
//! rule: the dry run is refused, 403, and one info line says so).

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
};
use serde_json::json;
use tokio::sync::OnceCell;

use crate::compat::health_monitor as upstream;

/// The answer, once known.
#[derive(Default)]
pub struct StatusApi(OnceCell<bool>);

impl StatusApi {
    /// Whether the field is served, asked (once) on the claim `ns/name`. A
    /// failure that says nothing about the API (the claim went, a timeout)
    /// leaves the question open for the next claim; the caller then uses
    /// events this time.
    pub async fn served(&self, client: &Client, ns: &str, name: &str) -> bool {
        if let Some(v) = self.0.get() {
            return *v;
        }
        match probe(client, ns, name).await {
            Some(v) => *self.0.get_or_init(|| async { v }).await,
            None => false,
        }
    }
}

async fn probe(client: &Client, ns: &str, name: &str) -> Option<bool> {
    let gvk = GroupVersionKind::gvk("", "v1", "PersistentVolumeClaim");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk_with_plural(&gvk, "persistentvolumeclaims"));
    let patch = json!({ "status": { "healthStatus": {
        "healthConditions": [{ "status": upstream::STATUS_DEGRADED, "reason": "Probe", "message": "dry run" }],
        "lastTransitionTime": "2000-01-01T00:00:00Z",
    } } });
    let params =
        PatchParams { dry_run: true, field_manager: Some(upstream::FIELD_MANAGER.into()), ..Default::default() };
    match api.patch_status(name, &params, &Patch::Merge(&patch)).await {
        Ok(claim) => {
            let served = claim.data["status"]["healthStatus"].is_object();
            if served {
                tracing::info!("PersistentVolumeClaim status.healthStatus is served: volume health is written there");
            } else {
                tracing::info!(
                    "PersistentVolumeClaim status.healthStatus is not served by this apiserver (Kubernetes before \
                     1.37, or the CSIVolumeHealth feature gate off): volume health is reported as events"
                );
            }
            Some(served)
        }
        Err(kube::Error::Api(s)) if s.code == 403 => {
            // The RBAC rule is optional (upstream grants none): not an error.
            tracing::info!(
                "Not allowed to patch persistentvolumeclaims/status ({}): volume health is reported as events \
                 (status.healthStatus needs that permission: the chart's patchClaimStatus)",
                s.message
            );
            Some(false)
        }
        Err(e) => {
            tracing::debug!(claim = %format!("{ns}/{name}"), "Could not ask whether status.healthStatus is served: {e}");
            None
        }
    }
}
