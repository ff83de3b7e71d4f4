//! Portworx (`portworxVolume` ↔ `pxd.portworx.com`): the volume ID as the
//! handle, and the auth secret (PV annotations, class parameters) as the
//! CSI secret references and their class parameters.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{
        CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, PortworxVolumeSource, SecretReference,
        Volume,
    },
    storage::v1::StorageClass,
};

use super::{InTreePlugin, Names, Plugin, TranslateError, inline_pv, nonempty, ro_mode, spec_mut};

const PX_SECRET_NAME: &str = "openstorage.io/auth-secret-name";
const PX_SECRET_NAMESPACE: &str = "openstorage.io/auth-secret-namespace";

/// The Portworx rules.
pub(super) struct Portworx;

impl InTreePlugin for Portworx {
    fn names(&self) -> Names {
        Names {
            plugin: Plugin::Portworx,
            csi_driver: "pxd.portworx.com",
            in_tree: crate::compat::translation::PORTWORX,
        }
    }

    fn has_pv_source(&self, spec: &PersistentVolumeSpec) -> bool {
        spec.portworx_volume.is_some()
    }

    fn has_inline_source(&self, v: &Volume) -> bool {
        v.portworx_volume.is_some()
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<CSIPersistentVolumeSource, TranslateError> {
        let annotations = pv.metadata.annotations.clone().unwrap_or_default();
        let src = spec_mut(pv).portworx_volume.take().unwrap_or_default();
        let secret = match (annotations.get(PX_SECRET_NAME), annotations.get(PX_SECRET_NAMESPACE)) {
            (Some(n), Some(ns)) => Some(SecretReference { name: Some(n.clone()), namespace: Some(ns.clone()) }),
            _ => None,
        };
        Ok(CSIPersistentVolumeSource {
            driver: self.csi_driver().to_string(),
            volume_handle: src.volume_id,
            fs_type: src.fs_type,
            volume_attributes: Some(BTreeMap::new()),
            controller_publish_secret_ref: secret.clone(),
            node_stage_secret_ref: secret.clone(),
            node_publish_secret_ref: secret.clone(),
            controller_expand_secret_ref: secret.clone(),
            node_expand_secret_ref: secret,
            ..Default::default()
        })
    }

    fn pv_to_in_tree(&self, csi: &CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), TranslateError> {
        spec_mut(pv).portworx_volume = Some(PortworxVolumeSource {
            volume_id: csi.volume_handle.clone(),
            fs_type: nonempty(&csi.fs_type),
            read_only: csi.read_only,
        });
        Ok(())
    }

    fn inline_to_csi(&self, v: &Volume, _pod_namespace: &str) -> Result<PersistentVolume, TranslateError> {
        let driver = self.csi_driver();
        let src = v.portworx_volume.clone().unwrap_or_default();
        let csi = CSIPersistentVolumeSource {
            driver: driver.to_string(),
            volume_handle: src.volume_id.clone(),
            fs_type: src.fs_type,
            volume_attributes: Some(BTreeMap::new()),
            ..Default::default()
        };
        Ok(inline_pv(format!("{driver}-{}", src.volume_id), csi, ro_mode(src.read_only)))
    }

    /// The auth secret's name and namespace become those of every CSI
    /// secret; the provisioner becomes the driver.
    fn class_to_csi(&self, mut sc: StorageClass) -> Result<StorageClass, TranslateError> {
        const NAMES: [&str; 6] = [
            "provisioner-secret-name",
            "controller-publish-secret-name",
            "node-publish-secret-name",
            "node-stage-secret-name",
            "controller-expand-secret-name",
            "node-expand-secret-name",
        ];
        let mut params = BTreeMap::new();
        for (k, v) in sc.parameters.iter().flatten() {
            let lower = k.to_lowercase();
            if lower == PX_SECRET_NAME || lower == PX_SECRET_NAMESPACE {
                for n in NAMES {
                    let key = if lower == PX_SECRET_NAME { n.to_string() } else { n.replace("-name", "-namespace") };
                    params.insert(format!("{}{key}", crate::compat::storage_class::PREFIX), v.clone());
                }
            } else {
                params.insert(k.clone(), v.clone());
            }
        }
        if !params.is_empty() {
            sc.parameters = Some(params);
        }
        sc.provisioner = self.csi_driver().to_string();
        Ok(sc)
    }
}
