//! The world the snapshot benches start from (bench-snapshotter,
//! bench-isolation, bench-snapshot-metadata): a control plane of their own
//! with the snapshot-controller, the sidecar's identity, and a namespace
//! with a StorageClass and a VolumeSnapshotClass of the bench's driver.

use anyhow::Result;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::{Api, Client, api::PostParams};

use crate::{
    bench::{create_namespace, sidecar_kubeconfig},
    cluster::{ControlPlane, try_launcher_bin},
    kube_support::storage_class,
    snapshots::SnapApis,
};

/// A snapshot bench's control plane and namespace.
pub struct SnapshotWorld {
    pub cp: ControlPlane,
    /// Admin credentials.
    pub admin: Client,
    /// The sidecar's kubeconfig ([`sidecar_kubeconfig`]).
    pub kubeconfig: std::path::PathBuf,
    /// The snapshot kinds in the namespace.
    pub snaps: SnapApis,
}

impl SnapshotWorld {
    /// Starts the control plane; creates namespace `ns`, and StorageClass
    /// and VolumeSnapshotClass (Delete) `class` of `driver`.
    pub async fn start(ns: &str, class: &str, driver: &str) -> Result<SnapshotWorld> {
        eprintln!("starting the control plane with snapshot-controller ...");
        let cp = ControlPlane::spawn_launcher(&try_launcher_bin()?, &["--snapshots"])?;
        let admin: Client = cp.client().await;
        let kubeconfig = sidecar_kubeconfig(&cp, &admin).await?;
        create_namespace(&admin, ns).await?;
        Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &storage_class(class, driver)).await?;
        let snaps = SnapApis::new(&admin, ns);
        snaps.class(class, driver, "Delete", serde_json::Value::Null).await;
        Ok(SnapshotWorld { cp, admin, kubeconfig, snaps })
    }
}
