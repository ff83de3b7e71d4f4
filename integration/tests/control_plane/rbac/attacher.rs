//! The attacher's live run under the manifests' RBAC.

use csi_sidecar_integration::kube_support::{create, csi_node, csi_pv, node, pod};
use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod, SecretReference},
    storage::v1::{CSINode, VolumeAttachment},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};

use super::cycle::{Cycle, Failure, sanitize};

impl Cycle {
    /// A pre-bound PV (with a controller-publish secret) used by a Pod on a
    /// Node: the real attach-detach controller creates the VolumeAttachment,
    /// the attacher attaches it (finalizers, node-id annotation, status),
    /// renews its Lease; the Pod goes, the VolumeAttachment is detached and
    /// deleted; the PV is deleted and the attacher releases its finalizer.
    pub async fn run_attacher(&mut self) -> Result<(), Failure> {
        let client = self.ns.client().clone();
        let ns = self.ns.name().to_string();
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        create(&Api::namespaced(client.clone(), &ns), &Self::secret("publish-creds")).await;
        create(&Api::<Node>::all(client.clone()), &node(&self.node_name, &[])).await;
        create(
            &Api::<CSINode>::all(client.clone()),
            &csi_node(&self.node_name, &self.driver_name, &self.node_name, &[]),
        )
        .await;
        let pv_name = self.ns.scoped("pv");
        // Volume "1" exists in the mock driver from its start.
        let mut pv = csi_pv(&pv_name, &self.driver_name, "1", "1Mi");
        if let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
            csi.controller_publish_secret_ref =
                Some(SecretReference { name: Some("publish-creds".into()), namespace: Some(ns.clone()) });
        }
        self.pre_bound_claim(pv, None).await?;
        create(&Api::namespaced(client.clone(), &ns), &pod("app", &self.node_name, "data")).await;

        let finalizer = format!("external-attacher/{}", sanitize(&self.driver_name));
        let va_name = self
            .until("the VolumeAttachment attached", async |_| {
                let list = vas.list(&ListParams::default()).await.ok()?;
                let va = list
                    .items
                    .into_iter()
                    .find(|v| v.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str()))?;
                va.status.as_ref().is_some_and(|s| s.attached).then_some(())?;
                va.metadata.name
            })
            .await?;
        let va = vas.get(&va_name).await.map_err(|e| self.fail(format!("get VA: {e}")))?;
        if !va.metadata.finalizers.iter().flatten().any(|f| *f == finalizer) {
            return Err(self.fail(format!("the VA lacks {finalizer}: {:?}", va.metadata.finalizers)));
        }
        let pv_now = pvs.get(&pv_name).await.map_err(|e| self.fail(format!("get PV: {e}")))?;
        if !pv_now.metadata.finalizers.iter().flatten().any(|f| *f == finalizer) {
            return Err(self.fail(format!("the PV lacks {finalizer}: {:?}", pv_now.metadata.finalizers)));
        }
        // The controller-publish secret reached the driver.
        if self.calls_ok("ControllerPublishVolume") < 1 {
            return Err(self.fail(format!("no ControllerPublishVolume:\n{}", self.driver.logs())));
        }

        self.lease_renewed(&sanitize(&format!("external-attacher-leader-{}", self.driver_name))).await?;

        // Pod gone: the attach-detach controller deletes the VA, the attacher
        // detaches and removes its finalizer.
        Api::<Pod>::namespaced(client.clone(), &ns)
            .delete("app", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
            .await
            .map_err(|e| self.fail(format!("delete Pod: {e}")))?;
        self.until("the VolumeAttachment gone", async |_| {
            matches!(vas.get_opt(&va_name).await, Ok(None)).then_some(())
        })
        .await?;
        if self.calls_ok("ControllerUnpublishVolume") < 1 {
            return Err(self.fail(format!("no ControllerUnpublishVolume:\n{}", self.driver.logs())));
        }
        // PV deleted: no VA references it, so the attacher releases it.
        pvcs.delete("data", &DeleteParams::default()).await.map_err(|e| self.fail(format!("delete PVC: {e}")))?;
        pvs.delete(&pv_name, &DeleteParams::default()).await.map_err(|e| self.fail(format!("delete PV: {e}")))?;
        self.until("the PV gone", async |_| matches!(pvs.get_opt(&pv_name).await, Ok(None)).then_some(())).await?;
        Ok(())
    }
}
