//! AWS EBS (`awsElasticBlockStore` ↔ `ebs.csi.aws.com`): the volume ID
//! without its `aws://<zone>/` prefix, the partition attribute, the zone
//! topology and the `iopsPerGB` class parameter.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{
        AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, Volume,
    },
    storage::v1::StorageClass,
};

use super::{
    InTreePlugin, Names, Plugin, TranslateError, attrs, block_class_to_csi, fstype_param, inline_pv, nonempty,
    partition, spec_mut, topology, topology_err,
};

const AWS_TOPOLOGY_KEY: &str = "topology.ebs.csi.aws.com/zone";

/// The AWS EBS rules.
pub(super) struct AwsEbs;

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

/// `iopsPerGB` is kept and allows the driver to raise the IOPS.
fn iops_param(lower: &str, key: &str, value: &str, params: &mut BTreeMap<String, String>) -> bool {
    if lower != "iopspergb" {
        return fstype_param(lower, key, value, params);
    }
    params.insert(key.to_string(), value.to_string());
    params.insert("allowautoiopspergbincrease".to_string(), "true".to_string());
    true
}

impl InTreePlugin for AwsEbs {
    fn names(&self) -> Names {
        Names { plugin: Plugin::AwsEbs, csi_driver: "ebs.csi.aws.com", in_tree: crate::compat::translation::AWS_EBS }
    }

    fn has_pv_source(&self, spec: &PersistentVolumeSpec) -> bool {
        spec.aws_elastic_block_store.is_some()
    }

    fn has_inline_source(&self, v: &Volume) -> bool {
        v.aws_elastic_block_store.is_some()
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<CSIPersistentVolumeSource, TranslateError> {
        let src = spec_mut(pv).aws_elastic_block_store.take().unwrap_or_default();
        let csi = CSIPersistentVolumeSource {
            driver: self.csi_driver().to_string(),
            volume_handle: ebs_volume_id(&src.volume_id)?,
            read_only: src.read_only,
            fs_type: src.fs_type,
            volume_attributes: attrs([("partition", src.partition.unwrap_or(0).to_string())]),
            ..Default::default()
        };
        topology::in_tree_to_csi(pv, AWS_TOPOLOGY_KEY);
        Ok(csi)
    }

    fn pv_to_in_tree(&self, csi: &CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), TranslateError> {
        let src = AWSElasticBlockStoreVolumeSource {
            volume_id: csi.volume_handle.clone(),
            fs_type: nonempty(&csi.fs_type),
            read_only: csi.read_only,
            partition: partition(csi, false)?.filter(|p| *p != 0),
        };
        topology::csi_to_in_tree(pv, AWS_TOPOLOGY_KEY, Some(topology::aws_region as topology::RegionParser))
            .map_err(topology_err)?;
        spec_mut(pv).aws_elastic_block_store = Some(src);
        Ok(())
    }

    fn inline_to_csi(&self, v: &Volume, _pod_namespace: &str) -> Result<PersistentVolume, TranslateError> {
        let driver = self.csi_driver();
        let src = v.aws_elastic_block_store.clone().unwrap_or_default();
        let handle = ebs_volume_id(&src.volume_id)?;
        let csi = CSIPersistentVolumeSource {
            driver: driver.to_string(),
            volume_handle: handle.clone(),
            read_only: src.read_only,
            fs_type: src.fs_type,
            volume_attributes: attrs([("partition", src.partition.unwrap_or(0).to_string())]),
            ..Default::default()
        };
        Ok(inline_pv(format!("{driver}-{handle}"), csi, "ReadWriteOnce"))
    }

    fn class_to_csi(&self, sc: StorageClass) -> Result<StorageClass, TranslateError> {
        block_class_to_csi(sc, Some(AWS_TOPOLOGY_KEY), AWS_TOPOLOGY_KEY, iops_param)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PersistentVolume;
    use serde_json::json;

    use super::ebs_volume_id;
    use crate::migration::{csi_pv_to_in_tree, in_tree_pv_to_csi, is_migrated_to, topology};

    fn pv(v: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(v).expect("test PV")
    }

    #[test]
    fn ebs_volume_ids() {
        for (id, want) in [
            ("vol-1", Some("vol-1")),
            ("aws://us-east-1a/vol-1", Some("vol-1")),
            ("aws:///vol-2", Some("vol-2")),
            ("aws://us-east-1a/snap-1", None),
            ("aws://us-east-1a/a/vol-1", None),
        ] {
            assert_eq!(ebs_volume_id(id).ok().as_deref(), want, "{id}");
        }
    }

    #[test]
    fn in_tree_ebs_pv_gets_handle_and_csi_topology() {
        let p = pv(json!({"metadata": {"name": "pv1", "labels": {"topology.kubernetes.io/zone": "us-east-1a"}},
            "spec": {"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-1", "fsType": "xfs"},
                     "accessModes": ["ReadWriteOnce"]}}));
        assert!(is_migrated_to(&p, "ebs.csi.aws.com"));
        assert!(!is_migrated_to(&p, "pd.csi.storage.gke.io"));
        let csi = in_tree_pv_to_csi(&p).expect("translated");
        let spec = csi.spec.expect("spec");
        assert!(spec.aws_elastic_block_store.is_none());
        let c = spec.csi.expect("csi");
        assert_eq!((c.driver.as_str(), c.volume_handle.as_str()), ("ebs.csi.aws.com", "vol-1"));
        let term = &spec.node_affinity.expect("affinity").required.expect("required").node_selector_terms[0];
        let req = &term.match_expressions.as_ref().expect("reqs")[0];
        assert_eq!(req.key, "topology.ebs.csi.aws.com/zone");
        assert_eq!(req.values.as_deref(), Some(&["us-east-1a".to_string()][..]));
    }

    #[test]
    fn csi_pv_back_to_in_tree_adds_region() {
        let p = pv(
            json!({"metadata": {"name": "pv1"}, "spec": {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-9"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["eu-west-1b"]}]}]}}}}),
        );
        let t = csi_pv_to_in_tree(&p).expect("translated");
        let labels = t.metadata.labels.expect("labels");
        assert_eq!(labels.get(topology::ZONE_GA).map(String::as_str), Some("eu-west-1b"));
        assert_eq!(labels.get(topology::REGION_GA).map(String::as_str), Some("eu-west-1"));
        assert_eq!(t.spec.expect("spec").aws_elastic_block_store.expect("ebs").volume_id, "vol-9");
    }
}
