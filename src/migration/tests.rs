//! Table tests of the translation; the full comparison with the real
//! csi-translation-lib is `integration/tests/no_cluster/migration_corpus.rs`.

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
