//! The per-plugin translations: the [`InTreePlugin`] rules each plugin's
//! file implements, the registry of the seven plugins, the dispatch from a
//! [`Plugin`] to its rules, and the helpers several plugins share.

mod aws_ebs;
mod azure_disk;
mod azure_file;
mod cinder;
mod gce_pd;
mod portworx;
mod vsphere;

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, Volume},
        storage::v1::StorageClass,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::{Plugin, TranslateError, topology};

const CSI_FSTYPE: &str = crate::compat::provisioner::PARAM_FSTYPE;

/// A plugin, its CSI driver and its in-tree name.
#[derive(Clone, Copy)]
pub(super) struct Names {
    pub plugin: Plugin,
    pub csi_driver: &'static str,
    pub in_tree: &'static str,
}

/// One in-tree plugin's names and translation rules.
pub(super) trait InTreePlugin: Sync {
    /// The plugin these are the rules of, and its two names.
    fn names(&self) -> Names;

    /// The plugin these are the rules of.
    fn plugin(&self) -> Plugin {
        self.names().plugin
    }

    /// The CSI driver that serves the plugin's volumes.
    fn csi_driver(&self) -> &'static str {
        self.names().csi_driver
    }

    /// The in-tree plugin (and provisioner) name.
    fn in_tree_name(&self) -> &'static str {
        self.names().in_tree
    }

    /// Whether a PV spec has this plugin's in-tree source.
    fn has_pv_source(&self, spec: &PersistentVolumeSpec) -> bool;

    /// Whether a pod's volume is this plugin's inline source.
    fn has_inline_source(&self, v: &Volume) -> bool;

    /// Takes the in-tree source off the PV (rewriting what else it needs,
    /// such as its topology) and returns the CSI source that replaces it.
    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<CSIPersistentVolumeSource, TranslateError>;

    /// Puts the in-tree source of `csi` on the PV (rewriting what else it
    /// needs); the caller then removes the CSI source.
    fn pv_to_in_tree(&self, csi: &CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), TranslateError>;

    /// A pod's inline volume of this plugin as a CSI PV.
    fn inline_to_csi(&self, v: &Volume, pod_namespace: &str) -> Result<PersistentVolume, TranslateError>;

    /// The class in the CSI driver's terms.
    fn class_to_csi(&self, sc: StorageClass) -> Result<StorageClass, TranslateError>;

    /// A migrated handle completed from the node ID; only GCE PD has parts
    /// to complete, every other plugin keeps the handle.
    fn repair_handle(&self, handle: &str, _node_id: &str) -> Result<String, TranslateError> {
        Ok(handle.to_string())
    }
}

/// Every plugin's rules, in the order of [`Plugin::ALL`].
static PLUGINS: [&dyn InTreePlugin; 7] = [
    &aws_ebs::AwsEbs,
    &gce_pd::GcePd,
    &azure_disk::AzureDisk,
    &azure_file::AzureFile,
    &cinder::Cinder,
    &vsphere::Vsphere,
    &portworx::Portworx,
];

/// The rules of a plugin.
pub(super) fn of(plugin: Plugin) -> &'static dyn InTreePlugin {
    PLUGINS[plugin as usize]
}

/// The first plugin, in the registry's order, whose rules `pick` takes.
pub(super) fn find(pick: impl Fn(&dyn InTreePlugin) -> bool) -> Option<Plugin> {
    PLUGINS.iter().find(|r| pick(**r)).map(|r| r.plugin())
}

/// The PV in the CSI form.
pub fn pv_to_csi(plugin: Plugin, mut pv: PersistentVolume) -> Result<PersistentVolume, TranslateError> {
    let csi = of(plugin).pv_to_csi(&mut pv)?;
    spec_mut(&mut pv).csi = Some(csi);
    Ok(pv)
}

/// The PV in the in-tree form.
pub fn pv_to_in_tree(plugin: Plugin, mut pv: PersistentVolume) -> Result<PersistentVolume, TranslateError> {
    let csi = csi_of(&pv)?;
    of(plugin).pv_to_in_tree(&csi, &mut pv)?;
    spec_mut(&mut pv).csi = None;
    Ok(pv)
}

/// A pod's inline in-tree volume as a CSI PV.
pub fn inline_to_csi(plugin: Plugin, v: &Volume, pod_namespace: &str) -> Result<PersistentVolume, TranslateError> {
    of(plugin).inline_to_csi(v, pod_namespace)
}

/// The class in the CSI driver's terms.
pub fn class_to_csi(plugin: Plugin, sc: StorageClass) -> Result<StorageClass, TranslateError> {
    of(plugin).class_to_csi(sc)
}

/// A migrated volume's handle completed from the node ID it is attached to
/// (upstream `RepairVolumeHandle`); see [`InTreePlugin::repair_handle`].
pub fn repair_handle(plugin: Plugin, handle: &str, node_id: &str) -> Result<String, TranslateError> {
    of(plugin).repair_handle(handle, node_id)
}

fn nonempty(s: &Option<String>) -> Option<String> {
    s.clone().filter(|s| !s.is_empty())
}

fn attrs<const N: usize>(pairs: [(&str, String); N]) -> Option<BTreeMap<String, String>> {
    Some(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn spec_mut(pv: &mut PersistentVolume) -> &mut PersistentVolumeSpec {
    pv.spec.get_or_insert_with(Default::default)
}

fn csi_of(pv: &PersistentVolume) -> Result<CSIPersistentVolumeSource, TranslateError> {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.clone())
        .ok_or_else(|| TranslateError::Invalid("pv is nil or CSI source not defined on pv".into()))
}

fn atoi(s: &str) -> Option<i32> {
    // Go's strconv.Atoi: optional sign, decimal digits.
    s.parse::<i64>().ok().and_then(|v| i32::try_from(v).ok()).filter(|_| !s.starts_with('+') || s.len() > 1)
}

/// The message of a topology error without the outer prefix.
fn inner(e: &TranslateError) -> String {
    match e {
        TranslateError::Topology(m) | TranslateError::Invalid(m) | TranslateError::Unsupported(m) => m.clone(),
    }
}

/// A topology error of the translation back to in-tree.
fn topology_err(e: TranslateError) -> TranslateError {
    TranslateError::Invalid(format!("failed to translate topology: {}", inner(&e)))
}

/// The `partition` attribute of a CSI source as a number; with
/// `required_nonempty`, an empty one counts as absent.
fn partition(csi: &CSIPersistentVolumeSource, required_nonempty: bool) -> Result<Option<i32>, TranslateError> {
    match csi.volume_attributes.as_ref().and_then(|a| a.get("partition")) {
        Some(p) if required_nonempty && p.is_empty() => Ok(None),
        Some(p) => atoi(p)
            .map(Some)
            .ok_or_else(|| TranslateError::Invalid(format!("failed to convert partition {p} to integer"))),
        None => Ok(None),
    }
}

/// The access mode of an inline volume with a `readOnly` flag.
fn ro_mode(ro: Option<bool>) -> &'static str {
    if ro == Some(true) { "ReadOnlyMany" } else { "ReadWriteOnce" }
}

fn inline_pv(name: String, csi: CSIPersistentVolumeSource, mode: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta { name: Some(name), ..Default::default() },
        spec: Some(PersistentVolumeSpec {
            csi: Some(csi),
            access_modes: Some(vec![mode.to_string()]),
            ..Default::default()
        }),
        status: None,
    }
}

/// A class parameter a plugin translates its own way, as `(lowercase key,
/// key, value, new parameters)`; true when it took the parameter.
type ParamRule = fn(&str, &str, &str, &mut BTreeMap<String, String>) -> bool;

/// `fstype` becomes the CSI fstype parameter.
fn fstype_param(lower: &str, _key: &str, value: &str, params: &mut BTreeMap<String, String>) -> bool {
    if lower != "fstype" {
        return false;
    }
    params.insert(CSI_FSTYPE.to_string(), value.to_string());
    true
}

/// No parameter translated specially.
fn no_param(_: &str, _: &str, _: &str, _: &mut BTreeMap<String, String>) -> bool {
    false
}

/// The class translation of the block plugins (EBS, GCE PD, Azure disk,
/// Cinder): parameters kept except those `rule` takes; with a `zone_key`,
/// `zone`/`zones` become allowed topologies on it; in-tree allowed
/// topologies are rewritten to `topology_key`.
fn block_class_to_csi(
    mut sc: StorageClass,
    zone_key: Option<&str>,
    topology_key: &str,
    rule: ParamRule,
) -> Result<StorageClass, TranslateError> {
    let old = sc.parameters.clone().unwrap_or_default();
    let mut params = BTreeMap::new();
    let mut generated = None;
    for (k, v) in &old {
        let lower = k.to_lowercase();
        if rule(&lower, k, v, &mut params) {
            continue;
        }
        match (lower.as_str(), zone_key) {
            ("zone", Some(key)) => generated = Some(topology::selector(key, vec![v.clone()])),
            ("zones", Some(key)) => generated = Some(topology::selector(key, v.split(',').map(String::from).collect())),
            _ => {
                params.insert(k.clone(), v.clone());
            }
        }
    }
    let allowed = sc.allowed_topologies.as_ref().filter(|t| !t.is_empty());
    match (generated, allowed) {
        (Some(_), Some(_)) => {
            return Err(TranslateError::Invalid(
                "cannot simultaneously set allowed topologies and zone/zones parameters".into(),
            ));
        }
        (Some(g), None) => sc.allowed_topologies = Some(g),
        (None, Some(a)) => sc.allowed_topologies = Some(topology::allowed_topologies(a, topology_key)),
        (None, None) => {}
    }
    sc.parameters = Some(params);
    Ok(sc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_follows_plugin_all() {
        for (i, p) in Plugin::ALL.into_iter().enumerate() {
            assert_eq!(PLUGINS[i].plugin(), p);
            assert_eq!(of(p).plugin(), p);
        }
    }
}
