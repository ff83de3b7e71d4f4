//! The snapshot API (`snapshot.storage.k8s.io/v1`, the CRDs of
//! external-snapshotter's `client/v8`) as the modules read it: the fields the
//! snapshotter and the provisioner use, decoded straight from the watch
//! (unknown fields skipped, `managedFields` never allocated). The CRDs are
//! not built into the apiserver: [`installed`] says whether this cluster
//! serves them, and the modules watch these kinds only then.

use std::{borrow::Cow, collections::BTreeMap};

use k8s_openapi::apimachinery::pkg::{
    api::resource::Quantity,
    apis::meta::v1::{ObjectMeta, Time},
};
use kube::{Client, Resource};
use serde::{Deserialize, Serialize};

/// The API group of the snapshot CRDs.
pub const GROUP: &str = "snapshot.storage.k8s.io";
/// The version the modules read and write.
pub const VERSION: &str = "v1";

/// Implements [`Resource`] for a snapshot kind with a static identity.
macro_rules! snapshot_resource {
    ($ty:ty, $kind:literal, $plural:literal, $scope:ty) => {
        impl Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(GROUP)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(VERSION)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// A user's request for a snapshot of a claim (or a binding to a
/// pre-provisioned content). Namespaced.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct VolumeSnapshot {
    #[serde(default, deserialize_with = "super::cached::slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotStatus>,
}
snapshot_resource!(VolumeSnapshot, "VolumeSnapshot", "volumesnapshots", k8s_openapi::NamespaceResourceScope);

/// `VolumeSnapshot.spec`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSpec {
    #[serde(default)]
    pub source: VolumeSnapshotSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
}

/// `VolumeSnapshot.spec.source`: exactly one of the two is set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_content_name: Option<String>,
}

/// `VolumeSnapshot.status` (written by the snapshot-controller).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_volume_snapshot_content_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_snapshot_name: Option<String>,
}

/// The `error` of a snapshot's or a content's status.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct SnapshotError {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The backend snapshot, bound to one VolumeSnapshot. Cluster-scoped.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct VolumeSnapshotContent {
    #[serde(default, deserialize_with = "super::cached::slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotContentSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotContentStatus>,
}
snapshot_resource!(
    VolumeSnapshotContent,
    "VolumeSnapshotContent",
    "volumesnapshotcontents",
    k8s_openapi::ClusterResourceScope
);

/// `VolumeSnapshotContent.spec`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSpec {
    /// The VolumeSnapshot this content is bound to (its `uid` is set once
    /// bound).
    #[serde(default)]
    pub volume_snapshot_ref: SnapshotRef,
    /// `Delete` or `Retain`.
    #[serde(default)]
    pub deletion_policy: String,
    #[serde(default)]
    pub driver: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    #[serde(default)]
    pub source: VolumeSnapshotContentSource,
    /// `Filesystem` or `Block`: the mode of the volume the snapshot was taken
    /// of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_volume_mode: Option<String>,
}

/// The object reference of `spec.volumeSnapshotRef` (the fields the modules read).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

/// `VolumeSnapshotContent.spec.source`: a volume to snapshot (dynamic) or an
/// existing snapshot (pre-provisioned).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_handle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
}

/// `VolumeSnapshotContent.status` (written by the snapshotter sidecar).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    /// Nanoseconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
    /// Bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_snapshot_handle: Option<String>,
}

/// The class of a snapshot: its driver, parameters and deletion policy.
/// Cluster-scoped.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotClass {
    #[serde(default, deserialize_with = "super::cached::slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub driver: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub deletion_policy: String,
}
snapshot_resource!(
    VolumeSnapshotClass,
    "VolumeSnapshotClass",
    "volumesnapshotclasses",
    k8s_openapi::ClusterResourceScope
);

/// Whether the apiserver serves `snapshot.storage.k8s.io/v1` with
/// `resource` (e.g. `volumesnapshotcontents`): false when the CRDs are not
/// installed (404, or the group without that resource). Other failures are
/// errors, so a flaky apiserver does not switch snapshots off.
pub async fn installed(client: &Client, resource: &str) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(&format!("{GROUP}/{VERSION}")).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == resource)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_decodes_the_fields_the_modules_read() {
        let json = serde_json::json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotContent",
            "metadata": {"name": "snapcontent-1", "managedFields": [{"manager": "x"}],
                         "annotations": {"snapshot.storage.kubernetes.io/deletion-secret-name": "s"}},
            "spec": {
                "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": "u-1", "kind": "VolumeSnapshot"},
                "deletionPolicy": "Delete",
                "driver": "d.example.com",
                "volumeSnapshotClassName": "c",
                "source": {"volumeHandle": "vol-1"},
                "sourceVolumeMode": "Filesystem"
            },
            "status": {"snapshotHandle": "h", "creationTime": 1700000000000000000i64, "restoreSize": 1073741824,
                       "readyToUse": true, "error": {"message": "m"}}
        });
        let c: VolumeSnapshotContent = serde_json::from_value(json).expect("decodes");
        assert_eq!(c.metadata.name.as_deref(), Some("snapcontent-1"));
        assert!(c.metadata.managed_fields.is_none());
        assert_eq!(c.spec.volume_snapshot_ref.uid.as_deref(), Some("u-1"));
        assert_eq!(c.spec.source.volume_handle.as_deref(), Some("vol-1"));
        let st = c.status.expect("status");
        assert_eq!(st.creation_time, Some(1_700_000_000_000_000_000));
        assert_eq!(st.restore_size, Some(1 << 30));
        assert_eq!(st.error.and_then(|e| e.message).as_deref(), Some("m"));
    }

    #[test]
    fn snapshot_and_class_decode() {
        let s: VolumeSnapshot = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "snap", "namespace": "ns"},
            "spec": {"source": {"persistentVolumeClaimName": "pvc"}, "volumeSnapshotClassName": "c"},
            "status": {"boundVolumeSnapshotContentName": "snapcontent-1", "readyToUse": false, "restoreSize": "1Gi"}
        }))
        .expect("decodes");
        assert_eq!(s.spec.source.persistent_volume_claim_name.as_deref(), Some("pvc"));
        assert_eq!(s.status.and_then(|st| st.restore_size).map(|q| q.0).as_deref(), Some("1Gi"));
        let c: VolumeSnapshotClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c"}, "driver": "d", "deletionPolicy": "Retain", "parameters": {"a": "b"}
        }))
        .expect("decodes");
        assert_eq!(c.deletion_policy, "Retain");
        assert_eq!(c.parameters.unwrap_or_default().get("a").map(String::as_str), Some("b"));
    }

    #[test]
    fn identities_are_the_crds() {
        assert_eq!(VolumeSnapshotContent::api_version(&()), "snapshot.storage.k8s.io/v1");
        assert_eq!(VolumeSnapshotContent::plural(&()), "volumesnapshotcontents");
        assert_eq!(VolumeSnapshot::kind(&()), "VolumeSnapshot");
        assert_eq!(VolumeSnapshotClass::plural(&()), "volumesnapshotclasses");
    }
}
