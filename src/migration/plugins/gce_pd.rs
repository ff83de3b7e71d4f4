//! GCE PD (`gcePersistentDisk` ↔ `pd.csi.storage.gke.io`): the
//! `projects/<p>/zones|regions/<z>/disks/<name>` handle (its unknown parts
//! `UNSPECIFIED`, repaired from the node ID), the partition attribute, the
//! zone or region topology and the one access mode the driver accepts.

use k8s_openapi::api::{
    core::v1::{
        CSIPersistentVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume, PersistentVolumeSpec, Volume,
    },
    storage::v1::StorageClass,
};

use super::{
    InTreePlugin, Names, Plugin, TranslateError, attrs, block_class_to_csi, fstype_param, inline_pv, inner, nonempty,
    partition, ro_mode, spec_mut, topology, topology_err,
};

const GCE_TOPOLOGY_KEY: &str = "topology.gke.io/zone";
const UNSPECIFIED: &str = "UNSPECIFIED";

/// The GCE PD rules.
pub(super) struct GcePd;

/// GCE PD's access modes: RWX counts as RWO, and the result is one mode.
fn backward_compatible_access_modes(modes: &[String]) -> Vec<String> {
    let has = |m: &str| modes.iter().any(|x| x == m || (m == "ReadWriteOnce" && x == "ReadWriteMany"));
    let one = if has("ReadWriteOnce") {
        "ReadWriteOnce"
    } else if has("ReadOnlyMany") {
        "ReadOnlyMany"
    } else {
        "ReadWriteOnce"
    };
    vec![one.to_string()]
}

/// The partition attribute: none for partition 0.
fn partition_attr(partition: Option<i32>) -> String {
    match partition.unwrap_or(0) {
        0 => String::new(),
        p => p.to_string(),
    }
}

impl InTreePlugin for GcePd {
    fn names(&self) -> Names {
        Names {
            plugin: Plugin::GcePd,
            csi_driver: "pd.csi.storage.gke.io",
            in_tree: crate::compat::translation::GCE_PD,
        }
    }

    fn has_pv_source(&self, spec: &PersistentVolumeSpec) -> bool {
        spec.gce_persistent_disk.is_some()
    }

    fn has_inline_source(&self, v: &Volume) -> bool {
        v.gce_persistent_disk.is_some()
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<CSIPersistentVolumeSource, TranslateError> {
        let src = spec_mut(pv).gce_persistent_disk.take().unwrap_or_default();
        let labels = pv.metadata.labels.clone().unwrap_or_default();
        let zones_label = labels
            .get(topology::ZONE_BETA)
            .filter(|v| !v.is_empty())
            .or_else(|| labels.get(topology::ZONE_GA))
            .cloned()
            .unwrap_or_default();
        let zones: Vec<String> = zones_label.split(topology::MULTI_ZONE_DELIMITER).map(String::from).collect();
        let handle = if zones.len() == 1 && !zones[0].is_empty() {
            format!("projects/{UNSPECIFIED}/zones/{}/disks/{}", zones[0], src.pd_name)
        } else if zones.len() > 1 {
            let region = topology::gce_region(&zones)
                .map_err(|e| TranslateError::Invalid(format!("failed to get region from zones: {}", inner(&e))))?;
            format!("projects/{UNSPECIFIED}/regions/{region}/disks/{}", src.pd_name)
        } else {
            format!("projects/{UNSPECIFIED}/zones/{UNSPECIFIED}/disks/{}", src.pd_name)
        };
        let csi = CSIPersistentVolumeSource {
            driver: self.csi_driver().to_string(),
            volume_handle: handle,
            read_only: src.read_only,
            fs_type: src.fs_type,
            volume_attributes: attrs([("partition", partition_attr(src.partition))]),
            ..Default::default()
        };
        topology::in_tree_to_csi(pv, GCE_TOPOLOGY_KEY);
        let spec = spec_mut(pv);
        spec.access_modes = spec.access_modes.take().map(|m| backward_compatible_access_modes(&m));
        Ok(csi)
    }

    fn pv_to_in_tree(&self, csi: &CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), TranslateError> {
        let parts: Vec<&str> = csi.volume_handle.split('/').collect();
        if parts.len() < 6 {
            return Err(TranslateError::Invalid(format!(
                "failed to get id components.Got: {}, wanted 6 components or more. ",
                parts.len()
            )));
        }
        let src = GCEPersistentDiskVolumeSource {
            pd_name: parts[5].to_string(),
            fs_type: nonempty(&csi.fs_type),
            read_only: csi.read_only,
            partition: partition(csi, true)?,
        };
        topology::csi_to_in_tree(pv, GCE_TOPOLOGY_KEY, Some(topology::gce_region as topology::RegionParser))
            .map_err(topology_err)?;
        spec_mut(pv).gce_persistent_disk = Some(src);
        Ok(())
    }

    fn inline_to_csi(&self, v: &Volume, _pod_namespace: &str) -> Result<PersistentVolume, TranslateError> {
        let driver = self.csi_driver();
        let src = v.gce_persistent_disk.clone().unwrap_or_default();
        let csi = CSIPersistentVolumeSource {
            driver: driver.to_string(),
            volume_handle: format!("projects/{UNSPECIFIED}/zones/{UNSPECIFIED}/disks/{}", src.pd_name),
            read_only: src.read_only,
            fs_type: src.fs_type,
            volume_attributes: attrs([("partition", partition_attr(src.partition))]),
            ..Default::default()
        };
        let mut pv = inline_pv(format!("{driver}-{}", src.pd_name), csi, ro_mode(src.read_only));
        spec_mut(&mut pv).volume_mode = Some("Filesystem".into());
        Ok(pv)
    }

    fn class_to_csi(&self, sc: StorageClass) -> Result<StorageClass, TranslateError> {
        block_class_to_csi(sc, Some(GCE_TOPOLOGY_KEY), GCE_TOPOLOGY_KEY, fstype_param)
    }

    /// Only GCE PD handles have parts the in-tree source cannot give
    /// (`UNSPECIFIED` project, zone or region); the node ID
    /// `projects/<project>/zones/<zone>/instances/<name>` supplies them.
    fn repair_handle(&self, handle: &str, node_id: &str) -> Result<String, TranslateError> {
        let tok: Vec<&str> = handle.split('/').collect();
        if tok.len() < 6 {
            return Err(TranslateError::Invalid(format!(
                "volume handle has wrong number of elements; got {}, wanted 6 or more",
                tok.len()
            )));
        }
        if tok[1] != UNSPECIFIED {
            return Ok(handle.to_string());
        }
        let node: Vec<&str> = node_id.split('/').collect();
        if node.len() < 6 {
            return Err(TranslateError::Invalid(format!(
                "node handle has wrong number of elements; got {}, wanted 6 or more",
                node.len()
            )));
        }
        let (project, node_zone, disk) = (node[1], node[3], tok[5]);
        match tok[2] {
            "zones" => {
                let zone = if tok[3] == UNSPECIFIED { node_zone } else { tok[3] };
                Ok(format!("projects/{project}/zones/{zone}/disks/{disk}"))
            }
            "regions" => {
                let region = if tok[3] == UNSPECIFIED {
                    topology::gce_region(&[node_zone.to_string()]).map_err(|e| {
                        TranslateError::Invalid(format!("failed to get region from zone {node_zone}: {}", inner(&e)))
                    })?
                } else {
                    tok[3].to_string()
                };
                Ok(format!("projects/{project}/regions/{region}/disks/{disk}"))
            }
            other => Err(TranslateError::Invalid(format!(
                "expected volume handle to have zones or regions regionality value, got: {other}"
            ))),
        }
    }
}
