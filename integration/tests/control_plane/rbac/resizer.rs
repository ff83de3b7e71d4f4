//! The resizer's live run under the manifests' RBAC.

use csi_sidecar_integration::kube_support::{create, csi_pv, storage_class};
use k8s_openapi::api::{
    core::v1::{Event, PersistentVolume, PersistentVolumeClaim, SecretReference},
    storage::v1::StorageClass,
};
use kube::{Api, api::ListParams};

use super::cycle::{Cycle, Failure, sanitize};

impl Cycle {
    /// A pre-bound PV (with a controller-expand secret) of an expandable
    /// class: its claim is expanded (PV and claim status), the Lease is
    /// renewed, and a class that does not exist, named again after another
    /// one, gives a repeated (aggregated) event. The driver expands offline only, so pods are watched, and it
    /// can modify, so VolumeAttributesClasses are watched.
    pub async fn run_resizer(&mut self) -> Result<(), Failure> {
        let client = self.ns.client().clone();
        let ns = self.ns.name().to_string();
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        create(&Api::namespaced(client.clone(), &ns), &Self::secret("expand-creds")).await;
        let sc_name = self.ns.scoped("sc");
        let mut sc = storage_class(&sc_name, &self.driver_name);
        sc.allow_volume_expansion = Some(true);
        create(&Api::<StorageClass>::all(client.clone()), &sc).await;
        let pv_name = self.ns.scoped("pv");
        // Volume "1" exists in the mock driver from its start (100 GiB).
        let mut pv = csi_pv(&pv_name, &self.driver_name, "1", "1Mi");
        if let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
            csi.controller_expand_secret_ref =
                Some(SecretReference { name: Some("expand-creds".into()), namespace: Some(ns.clone()) });
        }
        self.pre_bound_claim(pv, Some(&sc_name)).await?;
        let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": "200Gi"}}}});
        pvcs.patch("data", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .map_err(|e| self.fail(format!("request 200Gi: {e}")))?;
        self.until("the claim expanded", async |_| {
            let c = pvcs.get("data").await.ok()?;
            (c.status?.capacity?.get("storage")?.0 == "200Gi").then_some(())
        })
        .await?;
        let pv_now = pvs.get(&pv_name).await.map_err(|e| self.fail(format!("get PV: {e}")))?;
        let cap = pv_now.spec.and_then(|s| s.capacity).and_then(|c| c.get("storage").cloned());
        if cap.map(|q| q.0).as_deref() != Some("200Gi") {
            return Err(self.fail("the PV capacity was not updated"));
        }
        if self.calls_ok("ControllerExpandVolume") != 1 {
            return Err(self.fail(format!(
                "not one ControllerExpandVolume:
{}",
                self.driver.logs()
            )));
        }
        self.lease_renewed(&sanitize(&format!("external-resizer-{}", sanitize(&self.driver_name)))).await?;
        // A class that does not exist: a Warning and a Pending mark, no retry
        // (as upstream). The same class named again after another one gives
        // the same Warning again, aggregated (events PATCH).
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        let missing_failures = async |class: &str| -> Option<Vec<Event>> {
            let list = events.list(&ListParams::default()).await.ok()?;
            let text = format!("VAC \"{class}\" does not exist.");
            Some(
                list.items
                    .into_iter()
                    .filter(|e| {
                        e.reason.as_deref() == Some("VolumeModifyFailed") && e.message.as_deref() == Some(&text)
                    })
                    .collect(),
            )
        };
        for class in ["missing", "missing-too"] {
            let patch = serde_json::json!({"spec": {"volumeAttributesClassName": class}});
            pvcs.patch("data", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                .await
                .map_err(|e| self.fail(format!("set the class {class}: {e}")))?;
            self.until(&format!("a VolumeModifyFailed event for {class}"), async |_| {
                (!missing_failures(class).await?.is_empty()).then_some(())
            })
            .await?;
        }
        let patch = serde_json::json!({"spec": {"volumeAttributesClassName": "missing"}});
        pvcs.patch("data", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .map_err(|e| self.fail(format!("set the class missing again: {e}")))?;
        // Aggregated: one Event whose count grows. Without the PATCH the
        // recorder creates a new Event per repeat instead.
        self.until_aggregated("VolumeModifyFailed", async || missing_failures("missing").await).await
    }
}
