//! Cinder (`cinder` ↔ `cinder.csi.openstack.org`): the volume ID as the
//! handle and the zone topology (no region); class parameters are kept.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{
        CSIPersistentVolumeSource, CinderPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, Volume,
    },
    storage::v1::StorageClass,
};

use super::{
    InTreePlugin, Names, Plugin, TranslateError, block_class_to_csi, fstype_param, inline_pv, nonempty, spec_mut,
    topology, topology_err,
};

const CINDER_TOPOLOGY_KEY: &str = "topology.cinder.csi.openstack.org/zone";

/// The Cinder rules.
pub(super) struct Cinder;

impl InTreePlugin for Cinder {
    fn names(&self) -> Names {
        Names {
            plugin: Plugin::Cinder,
            csi_driver: "cinder.csi.openstack.org",
            in_tree: crate::compat::translation::CINDER,
        }
    }

    fn has_pv_source(&self, spec: &PersistentVolumeSpec) -> bool {
        spec.cinder.is_some()
    }

    fn has_inline_source(&self, v: &Volume) -> bool {
        v.cinder.is_some()
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<CSIPersistentVolumeSource, TranslateError> {
        let src = spec_mut(pv).cinder.take().unwrap_or_default();
        let csi = CSIPersistentVolumeSource {
            driver: self.csi_driver().to_string(),
            volume_handle: src.volume_id,
            read_only: src.read_only,
            fs_type: src.fs_type,
            volume_attributes: Some(BTreeMap::new()),
            ..Default::default()
        };
        topology::in_tree_to_csi(pv, CINDER_TOPOLOGY_KEY);
        Ok(csi)
    }

    fn pv_to_in_tree(&self, csi: &CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), TranslateError> {
        let src = CinderPersistentVolumeSource {
            volume_id: csi.volume_handle.clone(),
            fs_type: nonempty(&csi.fs_type),
            read_only: csi.read_only,
            secret_ref: None,
        };
        topology::csi_to_in_tree(pv, CINDER_TOPOLOGY_KEY, None).map_err(topology_err)?;
        spec_mut(pv).cinder = Some(src);
        Ok(())
    }

    fn inline_to_csi(&self, v: &Volume, _pod_namespace: &str) -> Result<PersistentVolume, TranslateError> {
        let driver = self.csi_driver();
        let src = v.cinder.clone().unwrap_or_default();
        let csi = CSIPersistentVolumeSource {
            driver: driver.to_string(),
            volume_handle: src.volume_id.clone(),
            read_only: src.read_only,
            fs_type: src.fs_type,
            volume_attributes: Some(BTreeMap::new()),
            ..Default::default()
        };
        Ok(inline_pv(format!("{driver}-{}", src.volume_id), csi, "ReadWriteOnce"))
    }

    /// `zone` and `zones` stay parameters; allowed topologies move to the
    /// driver's zone key.
    fn class_to_csi(&self, sc: StorageClass) -> Result<StorageClass, TranslateError> {
        block_class_to_csi(sc, None, CINDER_TOPOLOGY_KEY, fstype_param)
    }
}
