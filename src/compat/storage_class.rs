//! The reserved StorageClass parameters (`csi.storage.k8s.io/`): the keys
//! external-provisioner reads secrets from, and the metadata keys it (and
//! the resizer's modifier) adds to a driver call.

/// The reserved prefix of parameter keys.
pub const PREFIX: &str = "csi.storage.k8s.io/";
/// `--extra-create-metadata` / `--extra-modify-metadata`: the claim's name.
pub const PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
/// The claim's namespace.
pub const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
/// The volume's name.
pub const PV_NAME: &str = "csi.storage.k8s.io/pv/name";

/// The parameters naming one kind of secret: its name and namespace keys,
/// and the deprecated `csi*SecretName`/`csi*SecretNamespace` keys where
/// upstream still reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecretParams {
    /// The key of the secret's name (a template).
    pub name: &'static str,
    /// The key of the secret's namespace (a template).
    pub namespace: &'static str,
    /// The deprecated name and namespace keys.
    pub deprecated: Option<(&'static str, &'static str)>,
}

/// CreateVolume / DeleteVolume.
pub const PROVISIONER_SECRET: SecretParams = SecretParams {
    name: "csi.storage.k8s.io/provisioner-secret-name",
    namespace: "csi.storage.k8s.io/provisioner-secret-namespace",
    deprecated: Some(("csiProvisionerSecretName", "csiProvisionerSecretNamespace")),
};
/// `spec.csi.controllerPublishSecretRef`.
pub const CONTROLLER_PUBLISH_SECRET: SecretParams = SecretParams {
    name: "csi.storage.k8s.io/controller-publish-secret-name",
    namespace: "csi.storage.k8s.io/controller-publish-secret-namespace",
    deprecated: Some(("csiControllerPublishSecretName", "csiControllerPublishSecretNamespace")),
};
/// `spec.csi.nodeStageSecretRef`.
pub const NODE_STAGE_SECRET: SecretParams = SecretParams {
    name: "csi.storage.k8s.io/node-stage-secret-name",
    namespace: "csi.storage.k8s.io/node-stage-secret-namespace",
    deprecated: Some(("csiNodeStageSecretName", "csiNodeStageSecretNamespace")),
};
/// `spec.csi.nodePublishSecretRef`.
pub const NODE_PUBLISH_SECRET: SecretParams = SecretParams {
    name: "csi.storage.k8s.io/node-publish-secret-name",
    namespace: "csi.storage.k8s.io/node-publish-secret-namespace",
    deprecated: Some(("csiNodePublishSecretName", "csiNodePublishSecretNamespace")),
};
/// `spec.csi.controllerExpandSecretRef`.
pub const CONTROLLER_EXPAND_SECRET: SecretParams = SecretParams {
    name: "csi.storage.k8s.io/controller-expand-secret-name",
    namespace: "csi.storage.k8s.io/controller-expand-secret-namespace",
    deprecated: None,
};
/// `spec.csi.nodeExpandSecretRef`.
pub const NODE_EXPAND_SECRET: SecretParams = SecretParams {
    name: "csi.storage.k8s.io/node-expand-secret-name",
    namespace: "csi.storage.k8s.io/node-expand-secret-namespace",
    deprecated: None,
};
/// The PV's controller-modify secret annotations.
pub const CONTROLLER_MODIFY_SECRET: SecretParams = SecretParams {
    name: "csi.storage.k8s.io/controller-modify-secret-name",
    namespace: "csi.storage.k8s.io/controller-modify-secret-namespace",
    deprecated: None,
};
/// The fallback for every kind without its own keys.
pub const DEFAULT_SECRET: SecretParams = SecretParams {
    name: "csi.storage.k8s.io/secret-name",
    namespace: "csi.storage.k8s.io/secret-namespace",
    deprecated: None,
};
