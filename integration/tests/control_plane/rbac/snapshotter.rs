//! The snapshotter's live run under the manifests' RBAC.

use csi_sidecar_integration::kube_support::{create, csi_pv, storage_class};
use k8s_openapi::api::{core::v1::Event, storage::v1::StorageClass};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};

use super::cycle::{Cycle, Failure, sanitize};

impl Cycle {
    /// A snapshot of a bound claim with a snapshotter secret: created
    /// (annotation, status), the Lease renewed, deleted through the driver
    /// (status cleared, finalizer removed); then a pre-provisioned content
    /// whose deletion secret is missing gives a repeated (aggregated)
    /// SnapshotDeleteError until the secret appears.
    pub async fn run_snapshotter(&mut self) -> Result<(), Failure> {
        use csi_sidecar_integration::snapshots::{SnapApis, obj, ready};
        let client = self.ns.client().clone();
        let ns = self.ns.name().to_string();
        let snaps = SnapApis::new(&client, &ns);
        create(&Api::namespaced(client.clone(), &ns), &Self::secret("snap-creds")).await;
        let sc_name = self.ns.scoped("sc");
        create(&Api::<StorageClass>::all(client.clone()), &storage_class(&sc_name, &self.driver_name)).await;
        let pv_name = self.ns.scoped("pv");
        // Volume "1" exists in the mock driver from its start.
        let pv = csi_pv(&pv_name, &self.driver_name, "1", "1Mi");
        self.pre_bound_claim(pv, Some(&sc_name)).await?;
        let class = self.ns.scoped("vsc");
        let params = serde_json::json!({
            "csi.storage.k8s.io/snapshotter-secret-name": "snap-creds",
            "csi.storage.k8s.io/snapshotter-secret-namespace": ns,
        });
        snaps.class(&class, &self.driver_name, "Delete", params).await;
        let retain = self.ns.scoped("vsc-retain");
        snaps.class(&retain, &self.driver_name, "Retain", serde_json::Value::Null).await;
        let content = snaps.snapshot_of("snap", &class, "data").await;
        let kept = snaps.snapshot_of("kept", &retain, "data").await;
        let handle = self
            .until("both contents ready", async |_| {
                let a = snaps.contents.get(&content).await.ok()?;
                let b = snaps.contents.get(&kept).await.ok()?;
                (ready(&a) && ready(&b)).then(|| b.data["status"]["snapshotHandle"].as_str().map(str::to_string))?
            })
            .await?;
        self.lease_renewed(&sanitize(&format!("external-snapshotter-leader-{}", self.driver_name))).await?;
        let gone = async |name: &str| snaps.contents.get_opt(name).await.ok().and_then(|c| c.is_none().then_some(()));
        snaps.delete_snapshot("snap").await;
        self.until("the Delete content gone", async |_| gone(&content).await).await?;
        if self.calls_ok("DeleteSnapshot") != 1 {
            return Err(self.fail(format!("not one DeleteSnapshot:\n{}", self.driver.logs())));
        }
        // A pre-provisioned content of the retained snapshot, whose deletion
        // secret does not exist (yet): each deletion attempt fails the same way.
        let stat = self.ns.scoped("static");
        let v = serde_json::json!({"metadata": {"name": stat,
                "finalizers": ["snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection"],
                "annotations": {"snapshot.storage.kubernetes.io/deletion-secret-name": "late-creds",
                                "snapshot.storage.kubernetes.io/deletion-secret-namespace": ns}},
            "spec": {"deletionPolicy": "Delete", "driver": self.driver_name, "source": {"snapshotHandle": handle},
                     "volumeSnapshotRef": {"name": "nobody", "namespace": ns}}});
        snaps
            .contents
            .create(&PostParams::default(), &obj("VolumeSnapshotContent", v))
            .await
            .map_err(|e| self.fail(format!("create the static content: {e}")))?;
        self.until("the static content ready (ListSnapshots)", async |_| {
            snaps.contents.get(&stat).await.ok().filter(ready).map(|_| ())
        })
        .await?;
        let _ = snaps.contents.delete(&stat, &DeleteParams::default()).await;
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        self.until_aggregated("SnapshotDeleteError", async || {
            let lp = ListParams::default().fields(&format!("involvedObject.name={stat}"));
            Some(events.list(&lp).await.ok()?.items)
        })
        .await?;
        create(&Api::namespaced(client.clone(), &ns), &Self::secret("late-creds")).await;
        self.until("the static content gone", async |_| gone(&stat).await).await?;
        snaps.delete_snapshot("kept").await;
        let _ = snaps.contents.delete(&kept, &DeleteParams::default()).await;
        self.until("the retained content gone", async |_| gone(&kept).await).await?;
        if self.calls_ok("DeleteSnapshot") != 2 {
            return Err(self.fail(format!("not two DeleteSnapshot calls:\n{}", self.driver.logs())));
        }
        snaps.delete_class(&class).await;
        snaps.delete_class(&retain).await;
        Ok(())
    }
}
