//! Table tests of the translation; the full comparison with the real
//! csi-translation-lib is `integration/tests/migration_corpus.rs`.

use k8s_openapi::api::{core::v1::PersistentVolume, storage::v1::StorageClass};
use serde_json::json;

use super::*;

fn pv(v: serde_json::Value) -> PersistentVolume {
    serde_json::from_value(v).expect("test PV")
}

#[test]
fn plugins_round_trip_names() {
    for p in Plugin::ALL {
        assert_eq!(Plugin::for_driver(p.csi_driver()), Some(p));
        assert_eq!(Plugin::for_in_tree_name(p.in_tree_name()), Some(p));
    }
    assert_eq!(Plugin::for_driver("hostpath.csi.k8s.io"), None);
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
        assert_eq!(plugins::ebs_volume_id(id).ok().as_deref(), want, "{id}");
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
    let p =
        pv(json!({"metadata": {"name": "pv1"}, "spec": {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-9"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["eu-west-1b"]}]}]}}}}));
    let t = csi_pv_to_in_tree(&p).expect("translated");
    let labels = t.metadata.labels.expect("labels");
    assert_eq!(labels.get(topology::ZONE_GA).map(String::as_str), Some("eu-west-1b"));
    assert_eq!(labels.get(topology::REGION_GA).map(String::as_str), Some("eu-west-1"));
    assert_eq!(t.spec.expect("spec").aws_elastic_block_store.expect("ebs").volume_id, "vol-9");
}

#[test]
fn region_parsers() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(topology::aws_region(&s(&["us-east-1a", "us-east-1b"])).ok().as_deref(), Some("us-east-1"));
    assert_eq!(topology::aws_region(&s(&["us-west-2-lax-1a"])).ok().as_deref(), Some("us-west-2"));
    assert!(topology::aws_region(&s(&["us-east-1a", "eu-west-1a"])).is_err());
    assert!(topology::aws_region(&[]).is_err());
    assert_eq!(topology::gce_region(&s(&["us-central1-a", "us-central1-b"])).ok().as_deref(), Some("us-central1"));
    assert!(topology::gce_region(&s(&["us-central1"])).is_err());
}

#[test]
fn classes() {
    let sc: StorageClass =
        serde_json::from_value(json!({"metadata": {"name": "gp2"}, "provisioner": "kubernetes.io/aws-ebs",
        "parameters": {"type": "gp2", "fsType": "ext4", "zones": "a,b", "iopsPerGB": "10"}}))
        .expect("sc");
    let t = in_tree_class_to_csi("kubernetes.io/aws-ebs", &sc).expect("translated");
    let p = t.parameters.expect("params");
    assert_eq!(p.get("csi.storage.k8s.io/fstype").map(String::as_str), Some("ext4"));
    assert_eq!(p.get("iopsPerGB").map(String::as_str), Some("10"));
    assert_eq!(p.get("allowautoiopspergbincrease").map(String::as_str), Some("true"));
    assert!(!p.contains_key("zones") && !p.contains_key("fsType"));
    let terms = t.allowed_topologies.expect("topologies");
    let e = &terms[0].match_label_expressions.as_ref().expect("exprs")[0];
    assert_eq!((e.key.as_str(), e.values.len()), ("topology.ebs.csi.aws.com/zone", 2));
    assert!(in_tree_class_to_csi("example.com/other", &sc).is_err());
    let px: StorageClass =
        serde_json::from_value(json!({"metadata": {"name": "px"}, "provisioner": "kubernetes.io/portworx-volume",
        "parameters": {"openstorage.io/auth-secret-name": "s", "repl": "2"}}))
        .expect("sc");
    let t = in_tree_class_to_csi("kubernetes.io/portworx-volume", &px).expect("translated");
    assert_eq!(t.provisioner, "pxd.portworx.com");
    assert_eq!(t.parameters.expect("params").len(), 7);
}

#[test]
fn errors_are_errors_not_panics() {
    let azure = pv(
        json!({"metadata": {"name": "a"}, "spec": {"azureDisk": {"diskName": "d", "diskURI": "u", "kind": "Shared"}}}),
    );
    assert!(in_tree_pv_to_csi(&azure).is_err());
    let file = pv(json!({"metadata": {"name": "f"}, "spec": {"azureFile": {"secretName": "s", "shareName": "x"}}}));
    assert!(in_tree_pv_to_csi(&file).is_err(), "no secret namespace and no claimRef");
    let csi_pv = pv(
        json!({"metadata": {"name": "g"}, "spec": {"csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "short"}}}),
    );
    assert!(csi_pv_to_in_tree(&csi_pv).is_err());
    let plain = pv(json!({"metadata": {"name": "n"}, "spec": {"csi": {"driver": "x", "volumeHandle": "1"}}}));
    assert!(in_tree_pv_to_csi(&plain).is_err());
}
