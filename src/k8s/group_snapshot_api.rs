//! The group snapshot API (`groupsnapshot.storage.k8s.io/v1`, the CRDs of
//! external-snapshotter's `client/v8`, served as v1, v1beta2 and v1beta1;
//! csi-snapshotter v8.7 reads and writes v1) as the snapshotter reads it:
//! VolumeGroupSnapshotContents and VolumeGroupSnapshotClasses, decoded
//! straight from the watch with the fields the module uses (`managedFields`
//! never allocated). [`installed`] says whether the cluster serves both.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use serde::{Deserialize, Serialize};

use super::snapshot_api::{SnapshotError, SnapshotRef, crd_class, crd_object};

/// The API group of the group snapshot CRDs.
pub const GROUP: &str = "groupsnapshot.storage.k8s.io";
/// The version the snapshotter reads and writes (upstream v8.7's).
pub const VERSION: &str = "v1";

crd_object!(
    /// The backend group snapshot, bound to one VolumeGroupSnapshot.
    /// Cluster-scoped.
    VolumeGroupSnapshotContent { spec: VolumeGroupSnapshotContentSpec, status: VolumeGroupSnapshotContentStatus },
    "VolumeGroupSnapshotContent",
    "volumegroupsnapshotcontents",
    k8s_openapi::ClusterResourceScope
);

/// `VolumeGroupSnapshotContent.spec`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupSnapshotContentSpec {
    /// The VolumeGroupSnapshot this content is bound to.
    #[serde(default)]
    pub volume_group_snapshot_ref: SnapshotRef,
    /// `Delete` or `Retain`.
    #[serde(default)]
    pub deletion_policy: String,
    #[serde(default)]
    pub driver: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_snapshot_class_name: Option<String>,
    #[serde(default)]
    pub source: VolumeGroupSnapshotContentSource,
}

/// `spec.source`: volumes to snapshot (dynamic) or an existing group
/// snapshot (pre-provisioned).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupSnapshotContentSource {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_handles: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_snapshot_handles: Option<GroupSnapshotHandles>,
}

/// A pre-provisioned group snapshot and its members.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GroupSnapshotHandles {
    #[serde(default)]
    pub volume_group_snapshot_handle: String,
    #[serde(default)]
    pub volume_snapshot_handles: Vec<String>,
}

/// `VolumeGroupSnapshotContent.status` (written by the sidecar).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupSnapshotContentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_snapshot_handle: Option<String>,
    /// RFC 3339 (unlike a content's nanoseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
    /// One entry per member snapshot: snapshot-controller creates the
    /// member VolumeSnapshots and contents from it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_snapshot_info_list: Vec<VolumeSnapshotInfo>,
}

/// One member of a group snapshot.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotInfo {
    #[serde(default)]
    pub volume_handle: String,
    #[serde(default)]
    pub snapshot_handle: String,
    /// Nanoseconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// Bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
}

crd_class!(
    /// The class of a group snapshot. Cluster-scoped.
    VolumeGroupSnapshotClass,
    "VolumeGroupSnapshotClass",
    "volumegroupsnapshotclasses"
);

/// Whether the apiserver serves `groupsnapshot.storage.k8s.io/v1` with
/// both VolumeGroupSnapshotContents and VolumeGroupSnapshotClasses (what
/// upstream's start-up list checks); false when the CRDs are missing.
/// Other failures are errors.
pub async fn installed(client: &Client) -> Result<bool, kube::Error> {
    super::snapshot_api::serves(
        client,
        &format!("{GROUP}/{VERSION}"),
        &["volumegroupsnapshotcontents", "volumegroupsnapshotclasses"],
    )
    .await
}

#[cfg(test)]
mod tests {
    use kube::Resource;

    use super::*;

    #[test]
    fn group_content_decodes_the_fields_the_snapshotter_reads() {
        let c: VolumeGroupSnapshotContent = serde_json::from_value(serde_json::json!({
            "apiVersion": "groupsnapshot.storage.k8s.io/v1",
            "kind": "VolumeGroupSnapshotContent",
            "metadata": {"name": "groupsnapcontent-1", "managedFields": [{"manager": "x"}]},
            "spec": {
                "volumeGroupSnapshotRef": {"name": "g", "namespace": "ns", "uid": "u-1"},
                "deletionPolicy": "Delete", "driver": "d", "volumeGroupSnapshotClassName": "c",
                "source": {"volumeHandles": ["a", "b"]}
            },
            "status": {"volumeGroupSnapshotHandle": "h", "creationTime": "2026-01-02T03:04:05Z", "readyToUse": true,
                       "volumeSnapshotInfoList": [{"volumeHandle": "a", "snapshotHandle": "s-a",
                                                   "creationTime": 5, "readyToUse": true, "restoreSize": 7}]}
        }))
        .expect("decodes");
        assert!(c.metadata.managed_fields.is_none());
        assert_eq!(c.spec.source.volume_handles, ["a", "b"]);
        assert_eq!(c.spec.volume_group_snapshot_ref.uid.as_deref(), Some("u-1"));
        let st = c.status.expect("status");
        assert_eq!(st.volume_snapshot_info_list[0].snapshot_handle, "s-a");
        assert_eq!(st.volume_snapshot_info_list[0].restore_size, Some(7));
        assert_eq!(VolumeGroupSnapshotContent::api_version(&()), "groupsnapshot.storage.k8s.io/v1");
        assert_eq!(VolumeGroupSnapshotClass::plural(&()), "volumegroupsnapshotclasses");
        let pre: VolumeGroupSnapshotContent = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"source": {"groupSnapshotHandles": {"volumeGroupSnapshotHandle": "g", "volumeSnapshotHandles": ["x"]}}}
        }))
        .expect("decodes");
        assert_eq!(pre.spec.source.group_snapshot_handles.map(|h| h.volume_snapshot_handles), Some(vec!["x".into()]));
    }
}
