//! The SnapshotMetadataService resource (`cbt.storage.k8s.io/v1beta1`,
//! cluster-scoped, named after the driver): where clients find the server
//! (`spec.address`), the CA of its certificate (`spec.caCert`) and the
//! audience of their tokens (`spec.audience`), which the module reads when
//! `--audience` is not set. Only the fields read here are decoded.

use k8s_openapi::{ByteString, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "cbt.storage.k8s.io";
/// The version served since KEP-3314's beta.
pub const VERSION: &str = "v1beta1";
/// The resource (plural).
pub const PLURAL: &str = "snapshotmetadataservices";

/// A SnapshotMetadataService.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct SnapshotMetadataService {
    /// Its name is the driver's.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What clients read.
    #[serde(default)]
    pub spec: ServiceSpec,
}

/// `spec` of a SnapshotMetadataService.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// `host:port` the clients dial.
    #[serde(default)]
    pub address: String,
    /// The PEM of the CA that signed the server's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<ByteString>,
    /// The audience of the clients' tokens.
    #[serde(default)]
    pub audience: String,
}

crate::k8s::snapshot_api::crd_resource!(
    SnapshotMetadataService,
    GROUP,
    VERSION,
    "SnapshotMetadataService",
    PLURAL,
    kube::core::ClusterResourceScope
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_decodes_from_the_apis_json_with_the_ca_in_base64() {
        let json = serde_json::json!({
            "apiVersion": "cbt.storage.k8s.io/v1beta1", "kind": "SnapshotMetadataService",
            "metadata": {"name": "hostpath.csi.k8s.io"},
            "spec": {"address": "csi-snapshot-metadata.default:6443", "caCert": "UEVN", "audience": "backup"}
        });
        let cr: SnapshotMetadataService = serde_json::from_value(json).expect("decodes");
        assert_eq!(cr.spec.audience, "backup");
        assert_eq!(cr.spec.ca_cert, Some(ByteString(b"PEM".to_vec())));
        assert_eq!(
            <SnapshotMetadataService as kube::Resource>::url_path(&(), None),
            "/apis/cbt.storage.k8s.io/v1beta1/snapshotmetadataservices"
        );
    }
}
