//! vSphere (`vsphereVolume` ↔ `csi.vsphere.vmware.com`): the volume path as
//! the handle, the storage policy attribute, the driver's zone and region
//! keys, and the class parameters the driver takes as migration parameters.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{
        CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, Volume, VsphereVirtualDiskVolumeSource,
    },
    storage::v1::StorageClass,
};

use super::{CSI_FSTYPE, InTreePlugin, Names, Plugin, TranslateError, inline_pv, nonempty, spec_mut, topology};

const VSPHERE_ZONE_KEY: &str = "topology.csi.vmware.com/zone";
const VSPHERE_REGION_KEY: &str = "topology.csi.vmware.com/region";
const VSPHERE_INITIAL_PATH: &str = "initialvolumefilepath";

/// The vSphere rules.
pub(super) struct Vsphere;

impl InTreePlugin for Vsphere {
    fn names(&self) -> Names {
        Names {
            plugin: Plugin::Vsphere,
            csi_driver: "csi.vsphere.vmware.com",
            in_tree: crate::compat::translation::VSPHERE,
        }
    }

    fn has_pv_source(&self, spec: &PersistentVolumeSpec) -> bool {
        spec.vsphere_volume.is_some()
    }

    fn has_inline_source(&self, v: &Volume) -> bool {
        v.vsphere_volume.is_some()
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<CSIPersistentVolumeSource, TranslateError> {
        let src = spec_mut(pv).vsphere_volume.take().unwrap_or_default();
        let mut a = BTreeMap::new();
        if let Some(p) = nonempty(&src.storage_policy_name) {
            a.insert("storagepolicyname".to_string(), p);
        }
        let csi = CSIPersistentVolumeSource {
            driver: self.csi_driver().to_string(),
            volume_handle: src.volume_path,
            fs_type: src.fs_type,
            volume_attributes: Some(a),
            ..Default::default()
        };
        topology::vsphere_in_tree_to_csi(pv, VSPHERE_ZONE_KEY, VSPHERE_REGION_KEY);
        Ok(csi)
    }

    fn pv_to_in_tree(&self, csi: &CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), TranslateError> {
        let src = VsphereVirtualDiskVolumeSource {
            fs_type: nonempty(&csi.fs_type),
            volume_path: csi
                .volume_attributes
                .as_ref()
                .and_then(|a| a.get(VSPHERE_INITIAL_PATH))
                .cloned()
                .unwrap_or_default(),
            ..Default::default()
        };
        topology::vsphere_csi_to_in_tree(pv, VSPHERE_ZONE_KEY, VSPHERE_REGION_KEY);
        spec_mut(pv).vsphere_volume = Some(src);
        Ok(())
    }

    fn inline_to_csi(&self, v: &Volume, _pod_namespace: &str) -> Result<PersistentVolume, TranslateError> {
        let driver = self.csi_driver();
        let src = v.vsphere_volume.clone().unwrap_or_default();
        if nonempty(&src.storage_policy_name).is_some() {
            // Upstream dereferences the new PV's (nil) in-tree source
            // here and panics; refuse instead.
            return Err(TranslateError::Invalid(
                "inline vSphere volumes with a storagePolicyName cannot be translated".into(),
            ));
        }
        let csi = CSIPersistentVolumeSource {
            driver: driver.to_string(),
            volume_handle: src.volume_path.clone(),
            fs_type: src.fs_type,
            volume_attributes: Some(BTreeMap::new()),
            ..Default::default()
        };
        Ok(inline_pv(format!("{driver}-{}", src.volume_path), csi, "ReadWriteOnce"))
    }

    fn class_to_csi(&self, mut sc: StorageClass) -> Result<StorageClass, TranslateError> {
        let mut params = BTreeMap::new();
        for (k, v) in sc.parameters.iter().flatten() {
            let lower = k.to_lowercase();
            let new_key = match lower.as_str() {
                "fstype" => CSI_FSTYPE.to_string(),
                "storagepolicyname" => lower.clone(),
                "datastore"
                | "diskformat"
                | "hostfailurestotolerate"
                | "forceprovisioning"
                | "cachereservation"
                | "diskstripes"
                | "objectspacereservation"
                | "iopslimit" => format!("{lower}-migrationparam"),
                // Not supported by the CSI driver: dropped, as upstream.
                _ => continue,
            };
            params.insert(new_key, v.clone());
        }
        params.insert("csimigration".to_string(), "true".to_string());
        if let Some(a) = sc.allowed_topologies.as_ref().filter(|t| !t.is_empty()) {
            sc.allowed_topologies = Some(topology::allowed_topologies(a, VSPHERE_ZONE_KEY));
        }
        sc.parameters = Some(params);
        Ok(sc)
    }
}
