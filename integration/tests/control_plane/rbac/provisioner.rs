//! The provisioner's live run under the manifests' RBAC.

use std::collections::BTreeMap;

use csi_sidecar_integration::kube_support::{create, csi_node, node, pvc, storage_class};
use k8s_openapi::api::{
    core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim},
    storage::v1::{CSINode, StorageClass, VolumeAttributesClass},
};
use kube::{
    Api,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams},
};
use serde_json::Value;

use super::cycle::{Cycle, Failure, SELECTED_NODE, TOPOLOGY_KEY, sanitize};

impl Cycle {
    /// Provision (with a provisioner secret and topology), bind, renew the
    /// Lease, aggregate a repeated event, delete and clean up.
    pub async fn run_provisioner(&mut self) -> Result<(), Failure> {
        let client = self.ns.client().clone();
        let ns = self.ns.name().to_string();
        let classes: Api<StorageClass> = Api::all(client.clone());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let pvs: Api<PersistentVolume> = Api::all(client.clone());

        // A provisioner secret, read at CreateVolume and again at DeleteVolume.
        create(&Api::namespaced(client.clone(), &ns), &Self::secret("provisioner-creds")).await;
        // A node of the topology-aware driver: its CSINode names the mock's
        // topology key, its labels the value (accessibility requirements).
        create(&Api::<Node>::all(client.clone()), &node(&self.node_name, &[(TOPOLOGY_KEY, "some-mock-node")])).await;
        create(
            &Api::<CSINode>::all(client.clone()),
            &csi_node(&self.node_name, &self.driver_name, &self.node_name, &[TOPOLOGY_KEY]),
        )
        .await;
        let with_secret = |sc_name: &str, secret_name: &str| {
            let mut sc = storage_class(sc_name, &self.driver_name);
            sc.parameters = Some(BTreeMap::from([
                ("csi.storage.k8s.io/provisioner-secret-name".to_string(), secret_name.to_string()),
                ("csi.storage.k8s.io/provisioner-secret-namespace".to_string(), "${pvc.namespace}".to_string()),
            ]));
            sc
        };
        let good = self.ns.scoped("sc");
        let broken = self.ns.scoped("sc-broken");
        create(&classes, &with_secret(&good, "provisioner-creds")).await;
        // Names a secret that does not exist: provisioning fails the same way
        // on every retry, so the repeated event is aggregated (a PATCH).
        create(&classes, &with_secret(&broken, "no-such-secret")).await;
        // "data" names a VolumeAttributesClass of the driver (read with a GET).
        let class = self.ns.scoped("vac");
        let vac = VolumeAttributesClass {
            metadata: kube::api::ObjectMeta { name: Some(class.clone()), ..Default::default() },
            driver_name: self.driver_name.clone(),
            parameters: Some(BTreeMap::from([("iops".to_string(), "100".to_string())])),
        };
        create(&Api::<VolumeAttributesClass>::all(client.clone()), &vac).await;
        let mut data = pvc("data", Some(&good), "1Mi");
        if let Some(spec) = data.spec.as_mut() {
            spec.volume_attributes_class_name = Some(class.clone());
        }
        create(&pvcs, &data).await;
        create(&pvcs, &pvc("broken", Some(&broken), "1Mi")).await;
        // Late binding on a node that does not exist: the provisioner asks
        // the scheduler again by removing the selected-node annotation (PATCH).
        let mut late = storage_class(&self.ns.scoped("sc-late"), &self.driver_name);
        late.volume_binding_mode = Some("WaitForFirstConsumer".into());
        create(&classes, &late).await;
        let mut moved = pvc("moved", late.metadata.name.as_deref(), "1Mi");
        moved.metadata.annotations = Some(BTreeMap::from([(SELECTED_NODE.to_string(), self.ns.scoped("gone-node"))]));
        create(&pvcs, &moved).await;

        let pv_name = self
            .until("PVC data bound", async |_| {
                let c = pvcs.get("data").await.ok()?;
                (c.status?.phase.as_deref() == Some("Bound")).then_some(())?;
                c.spec?.volume_name
            })
            .await?;
        let pv = pvs.get(&pv_name).await.map_err(|e| self.fail(format!("get PV {pv_name}: {e}")))?;
        let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref());
        if !serde_json::to_string(&affinity).unwrap_or_default().contains(TOPOLOGY_KEY) {
            return Err(self.fail(format!("the PV has no topology nodeAffinity: {affinity:?}")));
        }
        let ann = pv.metadata.annotations.clone().unwrap_or_default();
        if ann.get("volume.kubernetes.io/provisioner-deletion-secret-name").map(String::as_str)
            != Some("provisioner-creds")
        {
            return Err(self.fail(format!("the PV does not name the deletion secret: {ann:?}")));
        }

        // Leader election: upstream's Lease name, the driver's.
        self.lease_renewed(&sanitize(&self.driver_name.replace('/', "-"))).await?;

        // Events: written, and a repeat aggregated into one Event (count >= 2).
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        self.until("ProvisioningSucceeded for data", async |_| {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.involved_object.name.as_deref() == Some("data")
                        && e.reason.as_deref() == Some("ProvisioningSucceeded")
                })
                .then_some(())
        })
        .await?;
        let mut first_seen: BTreeMap<String, i32> = BTreeMap::new();
        let aggregated = self
            .until("a repeated ProvisioningFailed on broken, aggregated by a PATCH", async |_| {
                let list = events.list(&ListParams::default()).await.ok()?;
                let failed: Vec<&Event> = list
                    .items
                    .iter()
                    .filter(|e| {
                        e.involved_object.name.as_deref() == Some("broken")
                            && e.reason.as_deref() == Some("ProvisioningFailed")
                    })
                    .collect();
                // Aggregation is per message: a first failure with another
                // message (the class not yet in the cache) is its own Event.
                let mut per_message: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
                for e in &failed {
                    per_message.entry(e.message.as_deref().unwrap_or_default()).or_default().push(e);
                }
                if let Some(dup) = per_message.values().find(|v| v.len() > 1) {
                    // A second Event object for the same repeat: the count
                    // could not be patched.
                    return Some(Err(dup.len()));
                }
                // The count grew on an Event already written: it was
                // patched (repeats merged before the first write are
                // created with their count, which proves no PATCH).
                let mut grew = false;
                for v in per_message.values() {
                    let (name, count) = (v[0].metadata.name.clone().unwrap_or_default(), v[0].count.unwrap_or(0));
                    let first = *first_seen.entry(name).or_insert(count);
                    grew |= count > first;
                }
                grew.then_some(Ok(()))
            })
            .await?;
        if let Err(n) = aggregated {
            return Err(self.fail(format!(
                "{n} ProvisioningFailed Events with one message for one repeated failure: the aggregation PATCH failed"
            )));
        }
        // A clone of data: the source claim and its PV read, the
        // cloning-protection finalizer put on data (and, at data's
        // deletion, removed).
        let mut copy = pvc("copy", Some(&good), "1Mi");
        copy.spec.as_mut().expect("spec").data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: "data".into(),
        });
        create(&pvcs, &copy).await;
        // A restore from a pre-provisioned snapshot (the mock's snapshot
        // "1"), made ready as a snapshotter would: the snapshot and its
        // content read, the provisioner's finalizer added and removed.
        let kind = |k: &str| ApiResource::from_gvk(&GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", k));
        let contents: Api<DynamicObject> = Api::all_with(client.clone(), &kind("VolumeSnapshotContent"));
        let snapshots: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kind("VolumeSnapshot"));
        let content = self.ns.scoped("content");
        let obj = |k: &str, mut v: Value| -> DynamicObject {
            v["apiVersion"] = "snapshot.storage.k8s.io/v1".into();
            v["kind"] = k.into();
            serde_json::from_value(v).expect("object")
        };
        let spec = serde_json::json!({
            "metadata": {"name": content},
            "spec": {"deletionPolicy": "Retain", "driver": self.driver_name, "source": {"snapshotHandle": "1"},
                     "volumeSnapshotRef": {"name": "snap", "namespace": ns}}
        });
        create(&contents, &obj("VolumeSnapshotContent", spec)).await;
        let status = serde_json::json!({"status": {"snapshotHandle": "1", "readyToUse": true, "restoreSize": 1 << 20}});
        contents
            .patch_status(&content, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|e| self.fail(format!("content status: {e}")))?;
        let snap = serde_json::json!({"metadata": {"name": "snap"}, "spec": {"source": {"volumeSnapshotContentName": content}}});
        create(&snapshots, &obj("VolumeSnapshot", snap)).await;
        let mut restored = pvc("restored", Some(&good), "1Mi");
        restored.spec.as_mut().expect("spec").data_source =
            Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
                api_group: Some("snapshot.storage.k8s.io".into()),
                kind: "VolumeSnapshot".into(),
                name: "snap".into(),
            });
        create(&pvcs, &restored).await;
        for claim in ["copy", "restored"] {
            self.until(&format!("PVC {claim} bound"), async |_| {
                (pvcs.get(claim).await.ok()?.status?.phase.as_deref() == Some("Bound")).then_some(())
            })
            .await?;
        }
        self.until("the provisioner's finalizer removed from snap", async |_| {
            let s = snapshots.get("snap").await.ok()?;
            (!s.metadata
                .finalizers
                .unwrap_or_default()
                .iter()
                .any(|f| f.starts_with("provisioner.storage.kubernetes.io/")))
            .then_some(())
        })
        .await?;
        let data = pvcs.get("data").await.map_err(|e| self.fail(format!("get PVC data: {e}")))?;
        if !data
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "provisioner.storage.kubernetes.io/cloning-protection")
        {
            return Err(self.fail(format!("no cloning-protection finalizer on data: {:?}", data.metadata.finalizers)));
        }
        for claim in ["copy", "restored"] {
            pvcs.delete(claim, &DeleteParams::default())
                .await
                .map_err(|e| self.fail(format!("delete PVC {claim}: {e}")))?;
        }

        self.until("selected-node removed from PVC moved", async |_| {
            let c = pvcs.get("moved").await.ok()?;
            (!c.metadata.annotations.unwrap_or_default().contains_key(SELECTED_NODE)).then_some(())
        })
        .await?;
        pvcs.delete("moved", &DeleteParams::default())
            .await
            .map_err(|e| self.fail(format!("delete PVC moved: {e}")))?;

        // Capacity: one object for the late-binding class on the node's
        // segment (created), owned by the pod (its GET); an admin's wrong
        // capacity corrected by the next poll (patch); gone with its class
        // (delete).
        let capacities: Api<k8s_openapi::api::storage::v1::CSIStorageCapacity> = Api::namespaced(client.clone(), &ns);
        let late_name = late.metadata.name.clone().unwrap_or_default();
        let object = self
            .until("a CSIStorageCapacity for the late-binding class", async |_| {
                let list = capacities.list(&ListParams::default()).await.ok()?;
                list.items.into_iter().find(|c| c.storage_class_name == late_name)
            })
            .await?;
        let obj_name = object.metadata.name.clone().unwrap_or_default();
        let owner = object.metadata.owner_references.clone().unwrap_or_default();
        if owner.first().map(|o| (o.kind.as_str(), o.name.as_str())) != Some(("Pod", "provisioner-0")) {
            return Err(self.fail(format!("the CSIStorageCapacity is not owned by the pod: {owner:?}")));
        }
        capacities
            .patch(&obj_name, &PatchParams::default(), &Patch::Merge(serde_json::json!({"capacity": "1"})))
            .await
            .map_err(|e| self.fail(format!("patch the capacity: {e}")))?;
        self.until("the capacity corrected by a poll", async |_| {
            let c = capacities.get(&obj_name).await.ok()?;
            (c.capacity.map(|q| q.0).as_deref() != Some("1")).then_some(())
        })
        .await?;
        classes
            .delete(&late_name, &DeleteParams::default())
            .await
            .map_err(|e| self.fail(format!("delete class: {e}")))?;
        self.until("the CSIStorageCapacity deleted with its class", async |_| {
            matches!(capacities.get_opt(&obj_name).await, Ok(None)).then_some(())
        })
        .await?;
        pvcs.delete("broken", &DeleteParams::default())
            .await
            .map_err(|e| self.fail(format!("delete PVC broken: {e}")))?;

        // Delete: DeleteVolume (with the secret), PV deleted, finalizer removed.
        pvcs.delete("data", &DeleteParams::default()).await.map_err(|e| self.fail(format!("delete PVC data: {e}")))?;
        self.until("the PV gone", async |_| matches!(pvs.get_opt(&pv_name).await, Ok(None)).then_some(())).await?;
        // data's, copy's and restored's volumes; data went only once the
        // cloning-protection controller released it.
        self.until("DeleteVolume", async |c| (c.calls_ok("DeleteVolume") >= 3).then_some(())).await?;
        if self.calls_ok("CreateVolume") != 3 || self.calls_ok("DeleteVolume") != 3 {
            return Err(self.fail(format!("driver calls:\n{}", self.driver.logs())));
        }
        // The snapshot-finalizer sweep is on (without `list` or `watch` on
        // VolumeSnapshots it is off, said in this line, rather than refused).
        let sweep_off = csi_sidecar::modules::provisioner::SWEEP_OFF_WITHOUT_WATCH;
        if !self.expected_refusals.contains(&sweep_off)
            && let Some(line) = self.sidecar.logs().lines().find(|l| l.contains(sweep_off))
        {
            return Err(self.fail(format!("the sweep is off: {line}")));
        }
        Ok(())
    }
}
