//! CSI migration: the in-tree volume plugins whose volumes a CSI driver
//! serves, and the translation of their PersistentVolumes, StorageClasses
//! and inline volumes to and from the driver's CSI form.
//!
//! Pure functions, no I/O: the provisioner translates a migrated claim's
//! class and turns the CSI PV it built back into the in-tree form, and
//! translates an in-tree PV to find the volume to delete; the attacher
//! translates an in-tree PV to attach it. The rules are those of
//! `k8s.io/csi-translation-lib` v0.36 (the version of the control plane the
//! repository pins); `integration/tests/no_cluster/migration_corpus.rs` runs the real
//! library over `integration/testdata/migration-corpus.json` and requires
//! the same result here for every case.

mod plugins;
#[cfg(test)]
mod tests;
pub mod topology;

use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeSpec, Volume},
    storage::v1::StorageClass,
};

/// Why a translation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    /// No migratable in-tree source, or no in-tree plugin for the driver.
    #[error("{0}")]
    Unsupported(String),
    /// The source cannot be expressed in the other form.
    #[error("{0}")]
    Invalid(String),
    /// Zones or regions cannot be derived.
    #[error("failed to translate topology: {0}")]
    Topology(String),
}

/// An in-tree volume plugin with a CSI migration target (all GA); its
/// names and rules are in `plugins/`, one file per plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plugin {
    /// `awsElasticBlockStore` → `ebs.csi.aws.com`.
    AwsEbs,
    /// `gcePersistentDisk` → `pd.csi.storage.gke.io`.
    GcePd,
    /// `azureDisk` → `disk.csi.azure.com`.
    AzureDisk,
    /// `azureFile` → `file.csi.azure.com`.
    AzureFile,
    /// `cinder` → `cinder.csi.openstack.org`.
    Cinder,
    /// `vsphereVolume` → `csi.vsphere.vmware.com`.
    Vsphere,
    /// `portworxVolume` → `pxd.portworx.com`.
    Portworx,
}

impl Plugin {
    /// Every plugin (the order of the registry in `plugins/mod.rs`).
    pub const ALL: [Plugin; 7] = [
        Plugin::AwsEbs,
        Plugin::GcePd,
        Plugin::AzureDisk,
        Plugin::AzureFile,
        Plugin::Cinder,
        Plugin::Vsphere,
        Plugin::Portworx,
    ];

    /// The CSI driver that serves the plugin's volumes.
    pub fn csi_driver(self) -> &'static str {
        plugins::of(self).csi_driver()
    }

    /// The in-tree plugin (and provisioner) name.
    pub fn in_tree_name(self) -> &'static str {
        plugins::of(self).in_tree_name()
    }

    /// The plugin a CSI driver is the migration target of.
    pub fn for_driver(driver: &str) -> Option<Plugin> {
        plugins::find(|r| r.csi_driver() == driver)
    }

    /// The plugin of an in-tree plugin name.
    pub fn for_in_tree_name(name: &str) -> Option<Plugin> {
        plugins::find(|r| r.in_tree_name() == name)
    }

    /// The plugin of a PV spec's in-tree source, if it has a migratable one.
    pub fn of_spec(spec: &PersistentVolumeSpec) -> Option<Plugin> {
        plugins::find(|r| r.has_pv_source(spec))
    }

    /// The plugin of a pod's inline volume, if it is a migratable one.
    pub fn of_volume(v: &Volume) -> Option<Plugin> {
        plugins::find(|r| r.has_inline_source(v))
    }
}

/// Whether a PV is an in-tree volume whose plugin migrates to `driver`.
pub fn is_migrated_to(pv: &PersistentVolume, driver: &str) -> bool {
    pv.spec.as_ref().and_then(Plugin::of_spec).is_some_and(|p| p.csi_driver() == driver)
}

/// The PV in the form `driver` is called with: as it is (`false`) unless
/// it is an in-tree volume whose plugin migrates to `driver`, which comes
/// translated (`true`: migrated, upstream `TranslateInTreePVToCSI`).
/// Anything else is left for the module's request to refuse.
pub fn csi_form(pv: PersistentVolume, driver: &str) -> Result<(PersistentVolume, bool), TranslateError> {
    let in_tree = pv.spec.as_ref().is_some_and(|s| s.csi.is_none()) && is_migrated_to(&pv, driver);
    if !in_tree {
        return Ok((pv, false));
    }
    in_tree_pv_to_csi(&pv).map(|t| (t, true))
}

/// A migrated volume's handle completed from the node ID it is published to
/// (upstream `RepairVolumeHandle`), as the driver names it in `ListVolumes`:
/// the translation of a GCE PD leaves its project (and zone) `UNSPECIFIED`.
pub fn repair_volume_handle(driver: &str, handle: &str, node_id: &str) -> Result<String, TranslateError> {
    let plugin = Plugin::for_driver(driver).ok_or_else(|| {
        TranslateError::Unsupported(format!("could not find In-Tree driver name for CSI plugin {driver}"))
    })?;
    plugins::repair_handle(plugin, handle, node_id)
}

/// An in-tree PV in its CSI form (upstream `TranslateInTreePVToCSI`).
pub fn in_tree_pv_to_csi(pv: &PersistentVolume) -> Result<PersistentVolume, TranslateError> {
    let plugin = pv.spec.as_ref().and_then(Plugin::of_spec).ok_or_else(|| {
        TranslateError::Unsupported(format!(
            "could not find in-tree plugin translation logic for {:?}",
            pv.metadata.name.as_deref().unwrap_or_default()
        ))
    })?;
    plugins::pv_to_csi(plugin, pv.clone())
}

/// A CSI PV of a migration target in its in-tree form (upstream
/// `TranslateCSIPVToInTree`).
pub fn csi_pv_to_in_tree(pv: &PersistentVolume) -> Result<PersistentVolume, TranslateError> {
    let driver = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.driver.as_str())
        .ok_or_else(|| TranslateError::Unsupported("CSI persistent volume was nil".into()))?;
    let plugin = Plugin::for_driver(driver).ok_or_else(|| {
        TranslateError::Unsupported(format!("could not find in-tree plugin translation logic for {driver}"))
    })?;
    plugins::pv_to_in_tree(plugin, pv.clone())
}

/// An in-tree plugin's StorageClass in the CSI driver's terms (upstream
/// `TranslateInTreeStorageClassToCSI`).
pub fn in_tree_class_to_csi(in_tree_name: &str, sc: &StorageClass) -> Result<StorageClass, TranslateError> {
    let plugin = Plugin::for_in_tree_name(in_tree_name).ok_or_else(|| {
        TranslateError::Unsupported(format!(
            "could not find in-tree storage class parameter translation logic for {in_tree_name:?}"
        ))
    })?;
    plugins::class_to_csi(plugin, sc.clone())
}

/// A pod's in-tree inline volume as a CSI PV (upstream
/// `TranslateInTreeInlineVolumeToCSI`); `Filesystem` unless set.
pub fn inline_volume_to_csi(v: &Volume, pod_namespace: &str) -> Result<PersistentVolume, TranslateError> {
    let plugin = Plugin::of_volume(v).ok_or_else(|| {
        TranslateError::Unsupported(format!("could not find in-tree plugin translation logic for {:?}", v.name))
    })?;
    let mut pv = plugins::inline_to_csi(plugin, v, pod_namespace)?;
    let spec = pv.spec.get_or_insert_with(Default::default);
    spec.volume_mode.get_or_insert_with(|| "Filesystem".to_string());
    Ok(pv)
}
