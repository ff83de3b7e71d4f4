//! The per-plugin translations.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{
            AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
            CSIPersistentVolumeSource, CinderPersistentVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume,
            PersistentVolumeSpec, PortworxVolumeSource, SecretReference, Volume, VsphereVirtualDiskVolumeSource,
        },
        storage::v1::StorageClass,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::{
    Plugin, TranslateError,
    topology::{self, RegionParser},
};

const AWS_TOPOLOGY_KEY: &str = "topology.ebs.csi.aws.com/zone";
const GCE_TOPOLOGY_KEY: &str = "topology.gke.io/zone";
const AZURE_DISK_TOPOLOGY_KEY: &str = "topology.disk.csi.azure.com/zone";
const CINDER_TOPOLOGY_KEY: &str = "topology.cinder.csi.openstack.org/zone";
const VSPHERE_ZONE_KEY: &str = "topology.csi.vmware.com/zone";
const VSPHERE_REGION_KEY: &str = "topology.csi.vmware.com/region";
const CSI_FSTYPE: &str = crate::compat::provisioner::PARAM_FSTYPE;
const UNSPECIFIED: &str = "UNSPECIFIED";
const MANAGED: &str = "Managed";
const AZURE_FILE_RESOURCE_GROUP: &str = "kubernetes.io/azure-file-resource-group";
const PX_SECRET_NAME: &str = "openstorage.io/auth-secret-name";
const PX_SECRET_NAMESPACE: &str = "openstorage.io/auth-secret-namespace";
const VSPHERE_INITIAL_PATH: &str = "initialvolumefilepath";

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

/// `aws://<zone>/vol-x` → `vol-x`; anything without the scheme is kept.
pub fn ebs_volume_id(id: &str) -> Result<String, TranslateError> {
    let Some(rest) = id.strip_prefix("aws://") else { return Ok(id.to_string()) };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    let aws_id = path.trim_matches('/');
    if !aws_id.starts_with("vol-") || aws_id.contains('/') {
        return Err(TranslateError::Invalid(format!(
            "failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume ({id})"
        )));
    }
    Ok(aws_id.to_string())
}

/// The PV in the CSI form.
pub fn pv_to_csi(plugin: Plugin, mut pv: PersistentVolume) -> Result<PersistentVolume, TranslateError> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let annotations = pv.metadata.annotations.clone().unwrap_or_default();
    let driver = plugin.csi_driver().to_string();
    let spec = spec_mut(&mut pv);
    let csi = match plugin {
        Plugin::AwsEbs => {
            let src = spec.aws_elastic_block_store.take().unwrap_or_default();
            let csi = CSIPersistentVolumeSource {
                driver,
                volume_handle: ebs_volume_id(&src.volume_id)?,
                read_only: src.read_only,
                fs_type: src.fs_type,
                volume_attributes: attrs([("partition", src.partition.unwrap_or(0).to_string())]),
                ..Default::default()
            };
            topology::in_tree_to_csi(&mut pv, AWS_TOPOLOGY_KEY);
            csi
        }
        Plugin::GcePd => {
            let src = spec.gce_persistent_disk.take().unwrap_or_default();
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
            let partition = match src.partition.unwrap_or(0) {
                0 => String::new(),
                p => p.to_string(),
            };
            let csi = CSIPersistentVolumeSource {
                driver,
                volume_handle: handle,
                read_only: src.read_only,
                fs_type: src.fs_type,
                volume_attributes: attrs([("partition", partition)]),
                ..Default::default()
            };
            topology::in_tree_to_csi(&mut pv, GCE_TOPOLOGY_KEY);
            let spec = spec_mut(&mut pv);
            spec.access_modes = spec.access_modes.take().map(|m| backward_compatible_access_modes(&m));
            csi
        }
        Plugin::AzureDisk => {
            let src = spec.azure_disk.clone().unwrap_or_default();
            if let Some(kind) = &src.kind
                && !kind.eq_ignore_ascii_case(MANAGED)
            {
                return Err(TranslateError::Invalid(format!("kind({kind}) is not supported in csi migration")));
            }
            spec.azure_disk = None;
            let mut a = BTreeMap::from([("kind".to_string(), MANAGED.to_string())]);
            if let Some(c) = &src.caching_mode {
                a.insert("cachingmode".into(), c.clone());
            }
            if let Some(f) = &src.fs_type {
                a.insert("fstype".into(), f.clone());
            }
            CSIPersistentVolumeSource {
                driver,
                volume_handle: src.disk_uri,
                fs_type: src.fs_type,
                read_only: src.read_only,
                volume_attributes: Some(a),
                ..Default::default()
            }
        }
        Plugin::AzureFile => {
            let src = spec.azure_file.clone().unwrap_or_default();
            let account = storage_account(&src.secret_name).unwrap_or_else(|| src.secret_name.clone());
            let rg = annotations.get(AZURE_FILE_RESOURCE_GROUP).cloned().unwrap_or_default();
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
            CSIPersistentVolumeSource {
                driver,
                node_stage_secret_ref: Some(SecretReference {
                    name: Some(src.secret_name.clone()),
                    namespace: Some(namespace),
                }),
                read_only: src.read_only,
                volume_attributes: attrs([("sharename", src.share_name.clone())]),
                volume_handle: handle,
                ..Default::default()
            }
        }
        Plugin::Cinder => {
            let src = spec.cinder.take().unwrap_or_default();
            let csi = CSIPersistentVolumeSource {
                driver,
                volume_handle: src.volume_id,
                read_only: src.read_only,
                fs_type: src.fs_type,
                volume_attributes: Some(BTreeMap::new()),
                ..Default::default()
            };
            topology::in_tree_to_csi(&mut pv, CINDER_TOPOLOGY_KEY);
            csi
        }
        Plugin::Vsphere => {
            let src = spec.vsphere_volume.take().unwrap_or_default();
            let mut a = BTreeMap::new();
            if let Some(p) = nonempty(&src.storage_policy_name) {
                a.insert("storagepolicyname".to_string(), p);
            }
            let csi = CSIPersistentVolumeSource {
                driver,
                volume_handle: src.volume_path,
                fs_type: src.fs_type,
                volume_attributes: Some(a),
                ..Default::default()
            };
            topology::vsphere_in_tree_to_csi(&mut pv, VSPHERE_ZONE_KEY, VSPHERE_REGION_KEY);
            csi
        }
        Plugin::Portworx => {
            let src = spec.portworx_volume.take().unwrap_or_default();
            let secret = match (annotations.get(PX_SECRET_NAME), annotations.get(PX_SECRET_NAMESPACE)) {
                (Some(n), Some(ns)) => Some(SecretReference { name: Some(n.clone()), namespace: Some(ns.clone()) }),
                _ => None,
            };
            CSIPersistentVolumeSource {
                driver,
                volume_handle: src.volume_id,
                fs_type: src.fs_type,
                volume_attributes: Some(BTreeMap::new()),
                controller_publish_secret_ref: secret.clone(),
                node_stage_secret_ref: secret.clone(),
                node_publish_secret_ref: secret.clone(),
                controller_expand_secret_ref: secret.clone(),
                node_expand_secret_ref: secret,
                ..Default::default()
            }
        }
    };
    spec_mut(&mut pv).csi = Some(csi);
    Ok(pv)
}

/// The message of a topology error without the outer prefix.
fn inner(e: &TranslateError) -> String {
    match e {
        TranslateError::Topology(m) | TranslateError::Invalid(m) | TranslateError::Unsupported(m) => m.clone(),
    }
}

/// The PV in the in-tree form.
pub fn pv_to_in_tree(plugin: Plugin, mut pv: PersistentVolume) -> Result<PersistentVolume, TranslateError> {
    let csi = csi_of(&pv)?;
    let topology_err =
        |e: TranslateError| TranslateError::Invalid(format!("failed to translate topology: {}", inner(&e)));
    let partition = |required_nonempty: bool| -> Result<Option<i32>, TranslateError> {
        match csi.volume_attributes.as_ref().and_then(|a| a.get("partition")) {
            Some(p) if required_nonempty && p.is_empty() => Ok(None),
            Some(p) => atoi(p)
                .map(Some)
                .ok_or_else(|| TranslateError::Invalid(format!("failed to convert partition {p} to integer"))),
            None => Ok(None),
        }
    };
    match plugin {
        Plugin::AwsEbs => {
            let src = AWSElasticBlockStoreVolumeSource {
                volume_id: csi.volume_handle.clone(),
                fs_type: nonempty(&csi.fs_type),
                read_only: csi.read_only,
                partition: partition(false)?.filter(|p| *p != 0),
            };
            topology::csi_to_in_tree(&mut pv, AWS_TOPOLOGY_KEY, Some(topology::aws_region as RegionParser))
                .map_err(topology_err)?;
            let spec = spec_mut(&mut pv);
            spec.csi = None;
            spec.aws_elastic_block_store = Some(src);
        }
        Plugin::GcePd => {
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
                partition: partition(true)?,
            };
            topology::csi_to_in_tree(&mut pv, GCE_TOPOLOGY_KEY, Some(topology::gce_region as RegionParser))
                .map_err(topology_err)?;
            let spec = spec_mut(&mut pv);
            spec.csi = None;
            spec.gce_persistent_disk = Some(src);
        }
        Plugin::AzureDisk => {
            let disk_name = azure_disk_name(&csi.volume_handle).ok_or_else(|| {
                TranslateError::Invalid(format!("could not get disk name from {}", csi.volume_handle))
            })?;
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
            let spec = spec_mut(&mut pv);
            spec.csi = None;
            spec.azure_disk = Some(src);
        }
        Plugin::AzureFile => {
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
            let spec = spec_mut(&mut pv);
            spec.csi = None;
            spec.azure_file = Some(src);
            let ann = pv.metadata.annotations.get_or_insert_with(BTreeMap::new);
            if !resource_group.is_empty() {
                ann.insert(AZURE_FILE_RESOURCE_GROUP.into(), resource_group);
            }
        }
        Plugin::Cinder => {
            let src = CinderPersistentVolumeSource {
                volume_id: csi.volume_handle.clone(),
                fs_type: nonempty(&csi.fs_type),
                read_only: csi.read_only,
                secret_ref: None,
            };
            topology::csi_to_in_tree(&mut pv, CINDER_TOPOLOGY_KEY, None).map_err(topology_err)?;
            let spec = spec_mut(&mut pv);
            spec.csi = None;
            spec.cinder = Some(src);
        }
        Plugin::Vsphere => {
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
            topology::vsphere_csi_to_in_tree(&mut pv, VSPHERE_ZONE_KEY, VSPHERE_REGION_KEY);
            let spec = spec_mut(&mut pv);
            spec.csi = None;
            spec.vsphere_volume = Some(src);
        }
        Plugin::Portworx => {
            let spec = spec_mut(&mut pv);
            spec.csi = None;
            spec.portworx_volume = Some(PortworxVolumeSource {
                volume_id: csi.volume_handle.clone(),
                fs_type: nonempty(&csi.fs_type),
                read_only: csi.read_only,
            });
        }
    }
    Ok(pv)
}

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

/// A pod's inline in-tree volume as a CSI PV.
pub fn inline_to_csi(plugin: Plugin, v: &Volume, pod_namespace: &str) -> Result<PersistentVolume, TranslateError> {
    let driver = plugin.csi_driver().to_string();
    let ro_mode = |ro: Option<bool>| if ro == Some(true) { "ReadOnlyMany" } else { "ReadWriteOnce" };
    Ok(match plugin {
        Plugin::AwsEbs => {
            let src = v.aws_elastic_block_store.clone().unwrap_or_default();
            let handle = ebs_volume_id(&src.volume_id)?;
            let csi = CSIPersistentVolumeSource {
                driver: driver.clone(),
                volume_handle: handle.clone(),
                read_only: src.read_only,
                fs_type: src.fs_type,
                volume_attributes: attrs([("partition", src.partition.unwrap_or(0).to_string())]),
                ..Default::default()
            };
            inline_pv(format!("{driver}-{handle}"), csi, "ReadWriteOnce")
        }
        Plugin::GcePd => {
            let src = v.gce_persistent_disk.clone().unwrap_or_default();
            let partition = match src.partition.unwrap_or(0) {
                0 => String::new(),
                p => p.to_string(),
            };
            let csi = CSIPersistentVolumeSource {
                driver: driver.clone(),
                volume_handle: format!("projects/{UNSPECIFIED}/zones/{UNSPECIFIED}/disks/{}", src.pd_name),
                read_only: src.read_only,
                fs_type: src.fs_type,
                volume_attributes: attrs([("partition", partition)]),
                ..Default::default()
            };
            let mut pv = inline_pv(format!("{driver}-{}", src.pd_name), csi, ro_mode(src.read_only));
            spec_mut(&mut pv).volume_mode = Some("Filesystem".into());
            pv
        }
        Plugin::AzureDisk => {
            let src = v.azure_disk.clone().unwrap_or_default();
            if let Some(kind) = &src.kind
                && !kind.eq_ignore_ascii_case(MANAGED)
            {
                return Err(TranslateError::Invalid(format!("kind({kind}) is not supported in csi migration")));
            }
            let mut a = BTreeMap::from([("kind".to_string(), MANAGED.to_string())]);
            if let Some(c) = nonempty(&src.caching_mode) {
                a.insert("cachingmode".into(), c);
            }
            if let Some(f) = &src.fs_type {
                a.insert("fstype".into(), f.clone());
            }
            let csi = CSIPersistentVolumeSource {
                driver,
                volume_handle: src.disk_uri.clone(),
                read_only: src.read_only,
                fs_type: src.fs_type,
                volume_attributes: Some(a),
                ..Default::default()
            };
            inline_pv(src.disk_uri, csi, "ReadWriteOnce")
        }
        Plugin::AzureFile => {
            let src = v.azure_file.clone().unwrap_or_default();
            let account = storage_account(&src.secret_name).unwrap_or_else(|| src.secret_name.clone());
            let ns = if pod_namespace.is_empty() { "default" } else { pod_namespace };
            let handle = format!("#{account}#{}#{}#{ns}", src.share_name, v.name);
            let csi = CSIPersistentVolumeSource {
                driver,
                volume_handle: handle.clone(),
                read_only: src.read_only,
                volume_attributes: attrs([("sharename", src.share_name.clone())]),
                node_stage_secret_ref: Some(SecretReference {
                    name: Some(src.secret_name.clone()),
                    namespace: Some(ns.to_string()),
                }),
                ..Default::default()
            };
            inline_pv(handle, csi, "ReadWriteMany")
        }
        Plugin::Cinder => {
            let src = v.cinder.clone().unwrap_or_default();
            let csi = CSIPersistentVolumeSource {
                driver: driver.clone(),
                volume_handle: src.volume_id.clone(),
                read_only: src.read_only,
                fs_type: src.fs_type,
                volume_attributes: Some(BTreeMap::new()),
                ..Default::default()
            };
            inline_pv(format!("{driver}-{}", src.volume_id), csi, "ReadWriteOnce")
        }
        Plugin::Vsphere => {
            let src = v.vsphere_volume.clone().unwrap_or_default();
            if nonempty(&src.storage_policy_name).is_some() {
                // Upstream dereferences the new PV's (nil) in-tree source
                // here and panics; refuse instead.
                return Err(TranslateError::Invalid(
                    "inline vSphere volumes with a storagePolicyName cannot be translated".into(),
                ));
            }
            let csi = CSIPersistentVolumeSource {
                driver: driver.clone(),
                volume_handle: src.volume_path.clone(),
                fs_type: src.fs_type,
                volume_attributes: Some(BTreeMap::new()),
                ..Default::default()
            };
            inline_pv(format!("{driver}-{}", src.volume_path), csi, "ReadWriteOnce")
        }
        Plugin::Portworx => {
            let src = v.portworx_volume.clone().unwrap_or_default();
            let csi = CSIPersistentVolumeSource {
                driver: driver.clone(),
                volume_handle: src.volume_id.clone(),
                fs_type: src.fs_type,
                volume_attributes: Some(BTreeMap::new()),
                ..Default::default()
            };
            inline_pv(format!("{driver}-{}", src.volume_id), csi, ro_mode(src.read_only))
        }
    })
}

/// The class in the CSI driver's terms.
pub fn class_to_csi(plugin: Plugin, mut sc: StorageClass) -> Result<StorageClass, TranslateError> {
    let old = sc.parameters.clone().unwrap_or_default();
    let zone_key = match plugin {
        Plugin::AwsEbs => Some(AWS_TOPOLOGY_KEY),
        Plugin::GcePd => Some(GCE_TOPOLOGY_KEY),
        Plugin::AzureDisk => Some(AZURE_DISK_TOPOLOGY_KEY),
        _ => None,
    };
    let mut params = BTreeMap::new();
    let mut generated = None;
    match plugin {
        Plugin::AwsEbs | Plugin::GcePd | Plugin::AzureDisk | Plugin::Cinder => {
            for (k, v) in &old {
                match (k.to_lowercase().as_str(), zone_key) {
                    ("fstype", _) if plugin != Plugin::AzureDisk => {
                        params.insert(CSI_FSTYPE.to_string(), v.clone());
                    }
                    ("zone", Some(key)) => generated = Some(topology::selector(key, vec![v.clone()])),
                    ("zones", Some(key)) => {
                        generated = Some(topology::selector(key, v.split(',').map(String::from).collect()))
                    }
                    ("iopspergb", _) if plugin == Plugin::AwsEbs => {
                        params.insert(k.clone(), v.clone());
                        params.insert("allowautoiopspergbincrease".to_string(), "true".to_string());
                    }
                    _ => {
                        params.insert(k.clone(), v.clone());
                    }
                }
            }
            let allowed = sc.allowed_topologies.as_ref().filter(|t| !t.is_empty());
            let key = zone_key.unwrap_or(CINDER_TOPOLOGY_KEY);
            match (generated, allowed) {
                (Some(_), Some(_)) => {
                    return Err(TranslateError::Invalid(
                        "cannot simultaneously set allowed topologies and zone/zones parameters".into(),
                    ));
                }
                (Some(g), None) => sc.allowed_topologies = Some(g),
                (None, Some(a)) => sc.allowed_topologies = Some(topology::allowed_topologies(a, key)),
                (None, None) => {}
            }
            if plugin == Plugin::AzureDisk {
                sc.allowed_topologies = sc.allowed_topologies.take().map(unzoned_regions_cleared);
            }
            sc.parameters = Some(params);
        }
        Plugin::AzureFile => {}
        Plugin::Vsphere => {
            for (k, v) in &old {
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
        }
        Plugin::Portworx => {
            const NAMES: [&str; 6] = [
                "provisioner-secret-name",
                "controller-publish-secret-name",
                "node-publish-secret-name",
                "node-stage-secret-name",
                "controller-expand-secret-name",
                "node-expand-secret-name",
            ];
            for (k, v) in &old {
                let lower = k.to_lowercase();
                if lower == PX_SECRET_NAME || lower == PX_SECRET_NAMESPACE {
                    for n in NAMES {
                        let key =
                            if lower == PX_SECRET_NAME { n.to_string() } else { n.replace("-name", "-namespace") };
                        params.insert(format!("csi.storage.k8s.io/{key}"), v.clone());
                    }
                } else {
                    params.insert(k.clone(), v.clone());
                }
            }
            if !params.is_empty() {
                sc.parameters = Some(params);
            }
            sc.provisioner = plugin.csi_driver().to_string();
        }
    }
    Ok(sc)
}

/// Azure disk: a numeric value under the driver's zone key is an unzoned
/// region's fault domain and becomes "" (any zone).
fn unzoned_regions_cleared(
    terms: Vec<k8s_openapi::api::core::v1::TopologySelectorTerm>,
) -> Vec<k8s_openapi::api::core::v1::TopologySelectorTerm> {
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

/// A migrated volume's handle completed from the node ID it is attached to
/// (upstream `RepairVolumeHandle`). Only GCE PD handles have parts the
/// in-tree source cannot give (`UNSPECIFIED` project, zone or region); the
/// node ID `projects/<project>/zones/<zone>/instances/<name>` supplies them.
pub fn repair_handle(plugin: Plugin, handle: &str, node_id: &str) -> Result<String, TranslateError> {
    if plugin != Plugin::GcePd {
        return Ok(handle.to_string());
    }
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
