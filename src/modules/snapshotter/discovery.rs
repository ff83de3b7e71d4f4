//! What the snapshotter finds served at start: the snapshot API (waited
//! for), the group snapshot API and the driver's group capability.

use std::time::Duration;

use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::{
    compat::{self, snapshotter as upstream},
    csi::{Connection, proto::csi::v1 as csi},
    k8s::snapshot_api,
};

/// How often a missing snapshot API is looked for again at start.
const CRD_RETRY: Duration = Duration::from_secs(5);

/// Waits until the apiserver serves VolumeSnapshotContents; `false` on
/// shutdown. (Upstream's informers retry their lists for as long.)
pub(super) async fn wait_for_api(client: &Client, shutdown: &CancellationToken) -> bool {
    let mut said = false;
    loop {
        match snapshot_api::installed(client, "volumesnapshotcontents").await {
            Ok(true) => return true,
            Ok(false) if !said => {
                tracing::error!(
                    "The snapshot.storage.k8s.io/v1 API is not served (snapshot CRDs not installed); waiting"
                );
                said = true;
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "Cannot discover snapshot.storage.k8s.io/v1; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(CRD_RETRY) => {}
        }
    }
}

/// Whether group snapshots are served in this run (the gate is on): the
/// group API must be installed (else they are off for this run, with a
/// warning, as upstream); then the driver's GroupController capability is
/// asked for, and its absence is only a warning (upstream's behaviour:
/// group contents then fail at the driver and get its error).
pub(super) async fn group_api(client: &Client, csi: &Connection, driver: &str, timeout: Duration) -> bool {
    match crate::k8s::group_snapshot_api::installed(client).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(
                "VolumeGroupSnapshot CRDs were not found; disabling the VolumeGroupSnapshot feature for this run. Install the VolumeGroupSnapshot CRDs to use this feature"
            );
            return false;
        }
        Err(e) => {
            tracing::warn!(error = %e, "VolumeGroupSnapshot CRDs were not found; disabling the VolumeGroupSnapshot feature for this run");
            return false;
        }
    }
    use csi::group_controller_service_capability::{Type, rpc::Type as GroupRpc};
    match csi.group_controller_get_capabilities(timeout).await {
        Ok(r) => {
            let can = r.capabilities.iter().any(|c| {
                matches!(&c.r#type, Some(Type::Rpc(rpc)) if rpc.r#type == GroupRpc::CreateDeleteGetVolumeGroupSnapshot as i32)
            });
            if !can {
                tracing::warn!("{}", upstream::text_no_group_capability(driver));
            }
        }
        Err(s) => tracing::error!(
            error = %compat::grpc_error_text(&s),
            "error determining if driver supports create/delete group snapshot operations"
        ),
    }
    true
}
