//! Every CSI call csi-sidecar makes, as a typed method of [`Connection`]:
//! the gRPC client is built here and only here, each call gets its deadline,
//! its `csi_sidecar_operations_seconds` sample under upstream's method name
//! and its redacted trace log from [`Connection::call`].

use std::time::Duration;

use tonic::Status;

use super::{
    connection::Connection,
    proto::csi::v1::{
        self as csi, controller_client::ControllerClient, group_controller_client::GroupControllerClient,
        identity_client::IdentityClient, node_client::NodeClient, snapshot_metadata_client::SnapshotMetadataClient,
    },
};

/// One RPC: its full method name as a constant of [`method`] and its typed
/// method on [`Connection`] (`{}`: the request is empty and not a parameter).
macro_rules! rpc {
    ($name:ident($constant:ident = $full:literal, $client:ident, $req:ident -> $resp:ident)) => {
        #[doc = $full]
        pub const $constant: &str = $full;

        impl Connection {
            #[doc = concat!("`", $full, "` with a deadline of `timeout`.")]
            pub async fn $name(&self, timeout: Duration, req: csi::$req) -> Result<csi::$resp, Status> {
                self.call($constant, timeout, req, |ch, r| async move { $client::new(ch).$name(r).await }).await
            }
        }
    };
    ($name:ident($constant:ident = $full:literal, $client:ident, $req:ident {} -> $resp:ident)) => {
        #[doc = $full]
        pub const $constant: &str = $full;

        impl Connection {
            #[doc = concat!("`", $full, "` with a deadline of `timeout`.")]
            pub async fn $name(&self, timeout: Duration) -> Result<csi::$resp, Status> {
                self.call($constant, timeout, csi::$req {}, |ch, r| async move { $client::new(ch).$name(r).await })
                    .await
            }
        }
    };
}

/// A server-streaming call's responses under the call's deadline: once it
/// passes, the next read is DeadlineExceeded, whatever the driver does (a
/// driver need not enforce the grpc-timeout it was sent). Dropping it
/// cancels the call.
pub struct CallStream<T> {
    inner: tonic::Streaming<T>,
    deadline: tokio::time::Instant,
}

impl<T> CallStream<T> {
    pub(super) fn new(inner: tonic::Streaming<T>, deadline: tokio::time::Instant) -> Self {
        CallStream { inner, deadline }
    }

    /// The next response; `None` when the driver ended the stream with OK.
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        match tokio::time::timeout_at(self.deadline, self.inner.message()).await {
            Ok(next) => next,
            Err(_) => Err(Status::deadline_exceeded(crate::compat::DEADLINE_EXCEEDED_MESSAGE)),
        }
    }
}

/// One server-streaming RPC: its method name as a constant of [`method`]
/// and its typed method on [`Connection`], which opens the stream; the
/// caller reads it and records its outcome ([`Connection::record_call`]).
macro_rules! stream_rpc {
    ($name:ident($constant:ident = $full:literal, $client:ident, $req:ident -> stream $resp:ident)) => {
        #[doc = $full]
        pub const $constant: &str = $full;

        impl Connection {
            #[doc = concat!("Opens `", $full, "`, the whole stream under a deadline of `timeout`.")]
            pub async fn $name(&self, timeout: Duration, req: csi::$req) -> Result<CallStream<csi::$resp>, Status> {
                self.open_stream($constant, timeout, req, |ch, r| async move { $client::new(ch).$name(r).await }).await
            }
        }
    };
}

/// Full gRPC method names, as upstream labels them, each with its call.
pub mod method {
    use super::*;

    rpc!(probe(PROBE = "/csi.v1.Identity/Probe", IdentityClient, ProbeRequest {} -> ProbeResponse));
    rpc!(get_plugin_info(GET_PLUGIN_INFO = "/csi.v1.Identity/GetPluginInfo", IdentityClient,
        GetPluginInfoRequest {} -> GetPluginInfoResponse));
    rpc!(get_plugin_capabilities(GET_PLUGIN_CAPABILITIES = "/csi.v1.Identity/GetPluginCapabilities", IdentityClient,
        GetPluginCapabilitiesRequest {} -> GetPluginCapabilitiesResponse));
    rpc!(controller_get_capabilities(
        CONTROLLER_GET_CAPABILITIES = "/csi.v1.Controller/ControllerGetCapabilities",
        ControllerClient, ControllerGetCapabilitiesRequest {} -> ControllerGetCapabilitiesResponse));
    rpc!(create_volume(CREATE_VOLUME = "/csi.v1.Controller/CreateVolume", ControllerClient,
        CreateVolumeRequest -> CreateVolumeResponse));
    rpc!(delete_volume(DELETE_VOLUME = "/csi.v1.Controller/DeleteVolume", ControllerClient,
        DeleteVolumeRequest -> DeleteVolumeResponse));
    rpc!(controller_publish_volume(CONTROLLER_PUBLISH_VOLUME = "/csi.v1.Controller/ControllerPublishVolume",
        ControllerClient, ControllerPublishVolumeRequest -> ControllerPublishVolumeResponse));
    rpc!(controller_unpublish_volume(
        CONTROLLER_UNPUBLISH_VOLUME = "/csi.v1.Controller/ControllerUnpublishVolume",
        ControllerClient, ControllerUnpublishVolumeRequest -> ControllerUnpublishVolumeResponse));
    rpc!(list_volumes(LIST_VOLUMES = "/csi.v1.Controller/ListVolumes", ControllerClient,
        ListVolumesRequest -> ListVolumesResponse));
    rpc!(get_capacity(GET_CAPACITY = "/csi.v1.Controller/GetCapacity", ControllerClient,
        GetCapacityRequest -> GetCapacityResponse));
    rpc!(controller_expand_volume(CONTROLLER_EXPAND_VOLUME = "/csi.v1.Controller/ControllerExpandVolume",
        ControllerClient, ControllerExpandVolumeRequest -> ControllerExpandVolumeResponse));
    rpc!(controller_modify_volume(CONTROLLER_MODIFY_VOLUME = "/csi.v1.Controller/ControllerModifyVolume",
        ControllerClient, ControllerModifyVolumeRequest -> ControllerModifyVolumeResponse));
    rpc!(create_snapshot(CREATE_SNAPSHOT = "/csi.v1.Controller/CreateSnapshot", ControllerClient,
        CreateSnapshotRequest -> CreateSnapshotResponse));
    rpc!(delete_snapshot(DELETE_SNAPSHOT = "/csi.v1.Controller/DeleteSnapshot", ControllerClient,
        DeleteSnapshotRequest -> DeleteSnapshotResponse));
    rpc!(list_snapshots(LIST_SNAPSHOTS = "/csi.v1.Controller/ListSnapshots", ControllerClient,
        ListSnapshotsRequest -> ListSnapshotsResponse));
    rpc!(node_get_info(NODE_GET_INFO = "/csi.v1.Node/NodeGetInfo", NodeClient,
        NodeGetInfoRequest {} -> NodeGetInfoResponse));
    rpc!(node_get_capabilities(NODE_GET_CAPABILITIES = "/csi.v1.Node/NodeGetCapabilities", NodeClient,
        NodeGetCapabilitiesRequest {} -> NodeGetCapabilitiesResponse));
    rpc!(group_controller_get_capabilities(
        GROUP_CONTROLLER_GET_CAPABILITIES = "/csi.v1.GroupController/GroupControllerGetCapabilities",
        GroupControllerClient, GroupControllerGetCapabilitiesRequest {} -> GroupControllerGetCapabilitiesResponse));
    rpc!(create_volume_group_snapshot(
        CREATE_VOLUME_GROUP_SNAPSHOT = "/csi.v1.GroupController/CreateVolumeGroupSnapshot",
        GroupControllerClient, CreateVolumeGroupSnapshotRequest -> CreateVolumeGroupSnapshotResponse));
    rpc!(delete_volume_group_snapshot(
        DELETE_VOLUME_GROUP_SNAPSHOT = "/csi.v1.GroupController/DeleteVolumeGroupSnapshot",
        GroupControllerClient, DeleteVolumeGroupSnapshotRequest -> DeleteVolumeGroupSnapshotResponse));
    rpc!(get_volume_group_snapshot(GET_VOLUME_GROUP_SNAPSHOT = "/csi.v1.GroupController/GetVolumeGroupSnapshot",
        GroupControllerClient, GetVolumeGroupSnapshotRequest -> GetVolumeGroupSnapshotResponse));

    stream_rpc!(get_metadata_allocated(GET_METADATA_ALLOCATED = "/csi.v1.SnapshotMetadata/GetMetadataAllocated",
        SnapshotMetadataClient, GetMetadataAllocatedRequest -> stream GetMetadataAllocatedResponse));
    stream_rpc!(get_metadata_delta(GET_METADATA_DELTA = "/csi.v1.SnapshotMetadata/GetMetadataDelta",
        SnapshotMetadataClient, GetMetadataDeltaRequest -> stream GetMetadataDeltaResponse));

    // The health monitor's calls: their typed methods are in `health.rs`
    // (`ListVolumes` above, decoded there with the v1.12 volume condition).
    /// `/csi.v1.Controller/ControllerGetVolume` (answer decoded with the v1.12 volume condition).
    pub const CONTROLLER_GET_VOLUME: &str = "/csi.v1.Controller/ControllerGetVolume";
    /// `/csi.v1.Controller/ControllerListVolumeHealth` (CSI v1.13, alpha).
    pub const CONTROLLER_LIST_VOLUME_HEALTH: &str = "/csi.v1.Controller/ControllerListVolumeHealth";
    /// `/csi.v1.Controller/ControllerGetVolumeHealth` (CSI v1.13, alpha).
    pub const CONTROLLER_GET_VOLUME_HEALTH: &str = "/csi.v1.Controller/ControllerGetVolumeHealth";
}
