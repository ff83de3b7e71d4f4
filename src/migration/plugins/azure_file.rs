//! Azure File (`azureFile` ↔ `file.csi.azure.com`): the
//! `<resource group>#<account>#<share>#<name>#<namespace>` handle, the
//! storage account taken from the secret name, the secret reference and the
//! resource-group annotation; classes are left as they are.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{
        AzureFilePersistentVolumeSource, CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
        SecretReference, Volume,
    },
    storage::v1::StorageClass,
};

use super::{InTreePlugin, Names, Plugin, TranslateError, attrs, inline_pv, spec_mut};

use crate::compat::translation::AZURE_FILE_RESOURCE_GROUP;

/// The Azure File rules.
pub(super) struct AzureFile;

/// Go's `regexp` `azure-storage-account-(.+)-secret` on a secret name: the
/// text between the first prefix and the last `-secret` after it.
fn storage_account(secret_name: &str) -> Option<String> {
    const PREFIX: &str = "azure-storage-account-";
    const SUFFIX: &str = "-secret";
    let mut from = 0;
    while let Some(i) = secret_name[from..].find(PREFIX) {
        let start = from + i + PREFIX.len();
        if let Some(j) = secret_name[start..].rfind(SUFFIX)
            && j >= 1
        {
            return Some(secret_name[start..start + j].to_string());
        }
        from += i + 1;
    }
    None
}

impl InTreePlugin for AzureFile {
    fn names(&self) -> Names {
        Names {
            plugin: Plugin::AzureFile,
            csi_driver: "file.csi.azure.com",
            in_tree: crate::compat::translation::AZURE_FILE,
        }
    }

    fn has_pv_source(&self, spec: &PersistentVolumeSpec) -> bool {
        spec.azure_file.is_some()
    }

    fn has_inline_source(&self, v: &Volume) -> bool {
        v.azure_file.is_some()
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<CSIPersistentVolumeSource, TranslateError> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let rg = pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(AZURE_FILE_RESOURCE_GROUP))
            .cloned()
            .unwrap_or_default();
        let spec = spec_mut(pv);
        let src = spec.azure_file.clone().unwrap_or_default();
        let account = storage_account(&src.secret_name).unwrap_or_else(|| src.secret_name.clone());
        let namespace = match &src.secret_namespace {
            Some(ns) => ns.clone(),
            None => spec.claim_ref.as_ref().and_then(|c| c.namespace.clone()).unwrap_or_default(),
        };
        if namespace.is_empty() {
            return Err(TranslateError::Invalid(
                "could not find a secret namespace in PersistentVolumeSource or ClaimRef".into(),
            ));
        }
        spec.azure_file = None;
        let handle = format!("{rg}#{account}#{}#{name}#{namespace}", src.share_name);
        Ok(CSIPersistentVolumeSource {
            driver: self.csi_driver().to_string(),
            node_stage_secret_ref: Some(SecretReference {
                name: Some(src.secret_name.clone()),
                namespace: Some(namespace),
            }),
            read_only: src.read_only,
            volume_attributes: attrs([("sharename", src.share_name.clone())]),
            volume_handle: handle,
            ..Default::default()
        })
    }

    fn pv_to_in_tree(&self, csi: &CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), TranslateError> {
        let mut src = AzureFilePersistentVolumeSource { read_only: csi.read_only, ..Default::default() };
        for (k, v) in csi.volume_attributes.iter().flatten() {
            match k.to_lowercase().as_str() {
                "sharename" => src.share_name = v.clone(),
                "secretname" => src.secret_name = v.clone(),
                "secretnamespace" => src.secret_namespace = Some(v.clone()),
                _ => {}
            }
        }
        if let Some(r) = &csi.node_stage_secret_ref
            && r.name.as_deref().is_some_and(|n| !n.is_empty())
        {
            src.secret_name = r.name.clone().unwrap_or_default();
            src.secret_namespace = Some(r.namespace.clone().unwrap_or_default());
        }
        let mut resource_group = String::new();
        if src.share_name.is_empty() || src.secret_name.is_empty() {
            let seg: Vec<&str> = csi.volume_handle.split('#').collect();
            if seg.len() < 3 {
                return Err(TranslateError::Invalid(format!(
                    "error parsing volume id: {:?}, should at least contain two #",
                    csi.volume_handle
                )));
            }
            if src.share_name.is_empty() {
                src.share_name = seg[2].to_string();
            }
            if src.secret_name.is_empty() {
                src.secret_name = format!("azure-storage-account-{}-secret", seg[1]);
            }
            resource_group = seg[0].to_string();
        }
        src.secret_namespace.get_or_insert_with(|| "default".to_string());
        spec_mut(pv).azure_file = Some(src);
        let ann = pv.metadata.annotations.get_or_insert_with(BTreeMap::new);
        if !resource_group.is_empty() {
            ann.insert(AZURE_FILE_RESOURCE_GROUP.into(), resource_group);
        }
        Ok(())
    }

    fn inline_to_csi(&self, v: &Volume, pod_namespace: &str) -> Result<PersistentVolume, TranslateError> {
        let src = v.azure_file.clone().unwrap_or_default();
        let account = storage_account(&src.secret_name).unwrap_or_else(|| src.secret_name.clone());
        let ns = if pod_namespace.is_empty() { "default" } else { pod_namespace };
        let handle = format!("#{account}#{}#{}#{ns}", src.share_name, v.name);
        let csi = CSIPersistentVolumeSource {
            driver: self.csi_driver().to_string(),
            volume_handle: handle.clone(),
            read_only: src.read_only,
            volume_attributes: attrs([("sharename", src.share_name.clone())]),
            node_stage_secret_ref: Some(SecretReference {
                name: Some(src.secret_name.clone()),
                namespace: Some(ns.to_string()),
            }),
            ..Default::default()
        };
        Ok(inline_pv(handle, csi, "ReadWriteMany"))
    }

    fn class_to_csi(&self, sc: StorageClass) -> Result<StorageClass, TranslateError> {
        Ok(sc)
    }
}
