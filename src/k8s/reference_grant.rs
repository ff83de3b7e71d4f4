//! Gateway API's ReferenceGrant (`gateway.networking.k8s.io/v1beta1`), as
//! the provisioner reads it for a cross-namespace data source
//! (`dataSourceRef.namespace`, feature gate `CrossNamespaceVolumeDataSource`):
//! a grant in the source's namespace lets claims of another namespace use it.
//! Only the fields that decision reads are decoded.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::compat::provisioner::{REFERENCE_GRANT_GROUP, REFERENCE_GRANT_VERSION};

/// One grant: objects of the `from` kinds in the `from` namespaces may
/// refer to the `to` objects of the grant's own namespace.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ReferenceGrant {
    #[serde(default, deserialize_with = "super::cached::slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ReferenceGrantSpec,
}

/// `spec`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ReferenceGrantSpec {
    /// Who may refer.
    #[serde(default)]
    pub from: Vec<GrantFrom>,
    /// What may be referred to.
    #[serde(default)]
    pub to: Vec<GrantTo>,
}

/// `spec.from[]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct GrantFrom {
    /// API group (`""`: core).
    #[serde(default)]
    pub group: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
    /// Namespace of the referring objects.
    #[serde(default)]
    pub namespace: String,
}

/// `spec.to[]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct GrantTo {
    /// API group (`""`: core).
    #[serde(default)]
    pub group: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
    /// One object, or (absent or empty) every object of the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

crate::k8s::snapshot_api::crd_resource!(
    ReferenceGrant,
    REFERENCE_GRANT_GROUP,
    REFERENCE_GRANT_VERSION,
    "ReferenceGrant",
    "referencegrants",
    k8s_openapi::NamespaceResourceScope
);

#[cfg(test)]
mod tests {
    use kube::Resource;

    use super::*;

    #[test]
    fn decodes_a_grant() {
        let g: ReferenceGrant = serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": "g", "namespace": "src"},
            "spec": {"from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": "dst"}],
                     "to": [{"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"}]}
        }))
        .expect("decodes");
        assert_eq!(g.spec.from[0].namespace, "dst");
        assert_eq!(g.spec.to[0].name, None);
        assert_eq!(ReferenceGrant::api_version(&()), "gateway.networking.k8s.io/v1beta1");
    }
}
