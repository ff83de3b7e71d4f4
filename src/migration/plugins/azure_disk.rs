//! Azure disk (`azureDisk` ↔ `disk.csi.azure.com`): managed disks only,
//! the disk URI as the handle (its disk name parsed back), the caching mode
//! and fstype attributes, and the zone topology of classes.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{
        AzureDiskVolumeSource, CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, TopologySelectorTerm,
        Volume,
    },
    storage::v1::StorageClass,
};

use super::{InTreePlugin, Names, Plugin, TranslateError, block_class_to_csi, inline_pv, no_param, nonempty, spec_mut};

const AZURE_DISK_TOPOLOGY_KEY: &str = "topology.disk.csi.azure.com/zone";
const MANAGED: &str = "Managed";

/// The Azure disk rules.
pub(super) struct AzureDisk;

/// Refuses a disk kind other than managed.
fn managed_only(kind: &Option<String>) -> Result<(), TranslateError> {
    match kind {
        Some(kind) if !kind.eq_ignore_ascii_case(MANAGED) => {
            Err(TranslateError::Invalid(format!("kind({kind}) is not supported in csi migration")))
        }
        _ => Ok(()),
    }
}

/// The disk name of an Azure disk URI (managed: after
/// `/providers/Microsoft.Compute/disks/`; unmanaged `http...`: after `/vhds/`).
fn azure_disk_name(uri: &str) -> Option<String> {
    let unmanaged = uri.len() > 4 && uri.is_char_boundary(4) && uri[..4].eq_ignore_ascii_case("http");
    let (marker, prefix_ok): (&str, &dyn Fn(&str) -> bool) = if unmanaged {
        ("/vhds/", &|p: &str| p.find("http").and_then(|h| p[h + 4..].find("://")).is_some())
    } else {
        ("/providers/Microsoft.Compute/disks/", &|p: &str| {
            p.find("/subscriptions/").and_then(|s| p[s + "/subscriptions/".len()..].find("/resourceGroups/")).is_some()
        })
    };
    let mut starts = Vec::new();
    let mut from = 0;
    while let Some(i) = uri[from..].find(marker) {
        starts.push(from + i);
        from += i + 1;
    }
    starts
        .into_iter()
        .rev()
        .find(|&i| uri.len() > i + marker.len() && prefix_ok(&uri[..i]))
        .map(|i| uri[i + marker.len()..].to_string())
}

/// A numeric value under the driver's zone key is an unzoned region's fault
/// domain and becomes "" (any zone).
fn unzoned_regions_cleared(terms: Vec<TopologySelectorTerm>) -> Vec<TopologySelectorTerm> {
    terms
        .into_iter()
        .map(|mut t| {
            for e in t.match_label_expressions.iter_mut().flatten() {
                if e.key == AZURE_DISK_TOPOLOGY_KEY {
                    for v in &mut e.values {
                        if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                            v.clear();
                        }
                    }
                }
            }
            t
        })
        .collect()
}

impl InTreePlugin for AzureDisk {
    fn names(&self) -> Names {
        Names {
            plugin: Plugin::AzureDisk,
            csi_driver: "disk.csi.azure.com",
            in_tree: crate::compat::translation::AZURE_DISK,
        }
    }

    fn has_pv_source(&self, spec: &PersistentVolumeSpec) -> bool {
        spec.azure_disk.is_some()
    }

    fn has_inline_source(&self, v: &Volume) -> bool {
        v.azure_disk.is_some()
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<CSIPersistentVolumeSource, TranslateError> {
        let spec = spec_mut(pv);
        let src = spec.azure_disk.clone().unwrap_or_default();
        managed_only(&src.kind)?;
        spec.azure_disk = None;
        let mut a = BTreeMap::from([("kind".to_string(), MANAGED.to_string())]);
        if let Some(c) = &src.caching_mode {
            a.insert("cachingmode".into(), c.clone());
        }
        if let Some(f) = &src.fs_type {
            a.insert("fstype".into(), f.clone());
        }
        Ok(CSIPersistentVolumeSource {
            driver: self.csi_driver().to_string(),
            volume_handle: src.disk_uri,
            fs_type: src.fs_type,
            read_only: src.read_only,
            volume_attributes: Some(a),
            ..Default::default()
        })
    }

    fn pv_to_in_tree(&self, csi: &CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), TranslateError> {
        let disk_name = azure_disk_name(&csi.volume_handle)
            .ok_or_else(|| TranslateError::Invalid(format!("could not get disk name from {}", csi.volume_handle)))?;
        let mut src = AzureDiskVolumeSource {
            disk_name,
            disk_uri: csi.volume_handle.clone(),
            fs_type: Some(csi.fs_type.clone().unwrap_or_default()),
            read_only: Some(csi.read_only.unwrap_or(false)),
            kind: Some(MANAGED.into()),
            caching_mode: None,
        };
        for (k, v) in csi.volume_attributes.iter().flatten() {
            match k.to_lowercase().as_str() {
                "cachingmode" if !v.is_empty() => src.caching_mode = Some(v.clone()),
                "fstype" if !v.is_empty() => src.fs_type = Some(v.clone()),
                _ => {}
            }
        }
        spec_mut(pv).azure_disk = Some(src);
        Ok(())
    }

    fn inline_to_csi(&self, v: &Volume, _pod_namespace: &str) -> Result<PersistentVolume, TranslateError> {
        let src = v.azure_disk.clone().unwrap_or_default();
        managed_only(&src.kind)?;
        let mut a = BTreeMap::from([("kind".to_string(), MANAGED.to_string())]);
        if let Some(c) = nonempty(&src.caching_mode) {
            a.insert("cachingmode".into(), c);
        }
        if let Some(f) = &src.fs_type {
            a.insert("fstype".into(), f.clone());
        }
        let csi = CSIPersistentVolumeSource {
            driver: self.csi_driver().to_string(),
            volume_handle: src.disk_uri.clone(),
            read_only: src.read_only,
            fs_type: src.fs_type,
            volume_attributes: Some(a),
            ..Default::default()
        };
        Ok(inline_pv(src.disk_uri, csi, "ReadWriteOnce"))
    }

    fn class_to_csi(&self, sc: StorageClass) -> Result<StorageClass, TranslateError> {
        let mut sc = block_class_to_csi(sc, Some(AZURE_DISK_TOPOLOGY_KEY), AZURE_DISK_TOPOLOGY_KEY, no_param)?;
        sc.allowed_topologies = sc.allowed_topologies.take().map(unzoned_regions_cleared);
        Ok(sc)
    }
}
