//! The snapshot API (`snapshot.storage.k8s.io/v1`, the CRDs of
//! external-snapshotter's `client/v8`) as the modules read it: the fields the
//! snapshotter and the provisioner use, decoded straight from the watch
//! (unknown fields skipped, `managedFields` never allocated). The CRDs are
//! not built into the apiserver: [`installed`] says whether this cluster
//! serves them, and the modules watch these kinds only then.

use k8s_openapi::apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Time};
use kube::Client;
use serde::{Deserialize, Serialize};

/// The API group of the snapshot CRDs.
pub const GROUP: &str = "snapshot.storage.k8s.io";
/// The version the modules read and write.
pub const VERSION: &str = "v1";

/// Implements [`Resource`](kube::Resource) for a CRD kind with a static
/// identity. Without a group and version, those of the calling module
/// (`GROUP` and `VERSION`: this one's, or `group_snapshot_api`'s).
macro_rules! crd_resource {
    ($ty:ty, $kind:literal, $plural:expr, $scope:ty) => {
        $crate::k8s::snapshot_api::crd_resource!($ty, GROUP, VERSION, $kind, $plural, $scope);
    };
    ($ty:ty, $group:expr, $version:expr, $kind:literal, $plural:expr, $scope:ty) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($kind)
            }
            fn group(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($group)
            }
            fn version(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($version)
            }
            fn plural(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($plural)
            }
            fn meta(&self) -> &::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use crd_resource;

/// Defines a CRD kind of `metadata`, `spec` and an optional `status` (the
/// `metadata` slimmed as the watches decode it), and its [`Resource`](kube::Resource).
macro_rules! crd_object {
    ($(#[$doc:meta])* $ty:ident { spec: $spec:ty, status: $status:ty }, $kind:literal, $plural:literal, $scope:ty) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, ::serde::Deserialize, ::serde::Serialize, PartialEq)]
        pub struct $ty {
            #[serde(default, deserialize_with = "super::cached::slim_meta")]
            pub metadata: ::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            #[serde(default)]
            pub spec: $spec,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub status: Option<$status>,
        }
        $crate::k8s::snapshot_api::crd_resource!($ty, $kind, $plural, $scope);
    };
}
pub(super) use crd_object;

/// Defines a cluster-scoped class kind: its driver, parameters and deletion
/// policy (the same fields in both groups), and its [`Resource`](kube::Resource).
macro_rules! crd_class {
    ($(#[$doc:meta])* $ty:ident, $kind:literal, $plural:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, ::serde::Deserialize, ::serde::Serialize, PartialEq)]
        #[serde(rename_all = "camelCase")]
        pub struct $ty {
            #[serde(default, deserialize_with = "super::cached::slim_meta")]
            pub metadata: ::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            #[serde(default)]
            pub driver: String,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub parameters: Option<::std::collections::BTreeMap<String, String>>,
            /// `Delete` or `Retain`.
            #[serde(default)]
            pub deletion_policy: String,
        }
        $crate::k8s::snapshot_api::crd_resource!($ty, $kind, $plural, ::k8s_openapi::ClusterResourceScope);
    };
}
pub(super) use crd_class;

crd_object!(
    /// A user's request for a snapshot of a claim (or a binding to a
    /// pre-provisioned content). Namespaced.
    VolumeSnapshot { spec: VolumeSnapshotSpec, status: VolumeSnapshotStatus },
    "VolumeSnapshot",
    "volumesnapshots",
    k8s_openapi::NamespaceResourceScope
);

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

crd_object!(
    /// The backend snapshot, bound to one VolumeSnapshot. Cluster-scoped.
    VolumeSnapshotContent { spec: VolumeSnapshotContentSpec, status: VolumeSnapshotContentStatus },
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

crd_class!(
    /// The class of a snapshot: its driver, parameters and deletion policy.
    /// Cluster-scoped.
    VolumeSnapshotClass,
    "VolumeSnapshotClass",
    "volumesnapshotclasses"
);

/// Whether the apiserver serves `snapshot.storage.k8s.io/v1` with
/// `resource` (e.g. `volumesnapshotcontents`): false when the CRDs are not
/// installed (404, or the group without that resource). Other failures are
/// errors, so a flaky apiserver does not switch snapshots off.
pub async fn installed(client: &Client, resource: &str) -> Result<bool, kube::Error> {
    serves(client, &format!("{GROUP}/{VERSION}"), &[resource]).await
}

/// Whether the apiserver serves `group_version` with every one of
/// `resources`: false on a 404 (the CRDs are not installed) or when one is
/// missing; other failures are errors.
pub async fn serves(client: &Client, group_version: &str, resources: &[&str]) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => Ok(resources.iter().all(|n| list.resources.iter().any(|r| &r.name == n))),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::Resource;

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
    fn the_macro_defined_kinds_serialize_in_the_crd_shape() {
        let class = VolumeSnapshotClass {
            metadata: ObjectMeta { name: Some("c".into()), ..Default::default() },
            driver: "d".into(),
            parameters: None,
            deletion_policy: "Delete".into(),
        };
        assert_eq!(
            serde_json::to_value(&class).expect("encodes"),
            serde_json::json!({"metadata": {"name": "c"}, "driver": "d", "deletionPolicy": "Delete"})
        );
        let snap = VolumeSnapshot {
            metadata: ObjectMeta { name: Some("s".into()), ..Default::default() },
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&snap).expect("encodes"),
            serde_json::json!({"metadata": {"name": "s"}, "spec": {"source": {}}})
        );
    }

    #[test]
    fn identities_are_the_crds() {
        assert_eq!(VolumeSnapshotContent::api_version(&()), "snapshot.storage.k8s.io/v1");
        assert_eq!(VolumeSnapshotContent::plural(&()), "volumesnapshotcontents");
        assert_eq!(VolumeSnapshot::kind(&()), "VolumeSnapshot");
        assert_eq!(VolumeSnapshotClass::plural(&()), "volumesnapshotclasses");
    }
}
