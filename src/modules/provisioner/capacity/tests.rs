//! Tables of the capacity decisions.

use k8s_openapi::{
    api::{
        core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm},
        storage::v1::{CSINodeDriver, CSINodeSpec},
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, Time},
};

use super::*;

const DRIVER: &str = "d.example.com";

fn csinode(name: &str, drivers: &[(&str, Option<&[&str]>)]) -> CSINode {
    CSINode {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: CSINodeSpec {
            drivers: drivers
                .iter()
                .map(|(d, keys)| CSINodeDriver {
                    name: d.to_string(),
                    node_id: name.into(),
                    topology_keys: keys.map(|k| k.iter().map(|s| s.to_string()).collect()),
                    allocatable: None,
                })
                .collect(),
        },
    }
}

fn seg(pairs: &[(&str, &str)]) -> Segment {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn item(pairs: &[(&str, &str)], class: &str) -> Item {
    Item { segment: seg(pairs), class: class.into() }
}

#[test]
fn segments_from_csinodes_and_node_labels() {
    let labels = |n: &str| -> Option<BTreeMap<String, String>> {
        match n {
            "a" => Some(seg(&[("zone", "z1"), ("rack", "r1"), ("other", "x")])),
            "b" => Some(seg(&[("zone", "z1"), ("rack", "r1")])),
            "c" => Some(seg(&[("zone", "z2"), ("rack", "r2")])),
            "no-rack" => Some(seg(&[("zone", "z3")])),
            "plain" => Some(BTreeMap::new()),
            _ => None,
        }
    };
    let keys: &[&str] = &["zone", "rack"];
    let table: Vec<(&str, Vec<CSINode>, Vec<Segment>)> = vec![
        ("no CSINodes", vec![], vec![]),
        (
            "two nodes share a segment, a third has its own; other labels ignored",
            vec![
                csinode("a", &[(DRIVER, Some(keys))]),
                csinode("b", &[(DRIVER, Some(keys))]),
                csinode("c", &[(DRIVER, Some(keys))]),
            ],
            vec![seg(&[("rack", "r1"), ("zone", "z1")]), seg(&[("rack", "r2"), ("zone", "z2")])],
        ),
        ("another driver's node", vec![csinode("a", &[("other.example.com", Some(keys))])], vec![]),
        ("a CSINode whose Node is gone", vec![csinode("gone", &[(DRIVER, Some(keys))])], vec![]),
        ("a Node still missing a key's label", vec![csinode("no-rack", &[(DRIVER, Some(keys))])], vec![]),
        (
            "a driver without topology keys: the empty segment",
            vec![csinode("plain", &[(DRIVER, None)])],
            vec![seg(&[])],
        ),
    ];
    for (what, nodes, want) in table {
        let got: Vec<Segment> = segments(nodes.iter(), &labels, DRIVER).into_iter().collect();
        assert_eq!(got, want, "{what}");
    }
}

fn sc(name: &str, provisioner: &str, mode: Option<&str>) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        provisioner: provisioner.into(),
        volume_binding_mode: mode.map(String::from),
        ..Default::default()
    }
}

#[test]
fn which_classes_are_tracked() {
    let table = [
        (sc("wffc", DRIVER, Some("WaitForFirstConsumer")), false, true),
        (sc("imm", DRIVER, Some("Immediate")), false, false),
        (sc("imm", DRIVER, Some("Immediate")), true, true),
        (sc("unset", DRIVER, None), false, true),
        (sc("other", "other.example.com", Some("WaitForFirstConsumer")), true, false),
    ];
    for (class, immediate, want) in table {
        assert_eq!(class_tracked(&class, DRIVER, immediate), want, "{:?} immediate={immediate}", class.metadata.name);
    }
}

fn object(name: &str, class: &str, topology: Option<LabelSelector>, created: i64) -> CSIStorageCapacity {
    CSIStorageCapacity {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            creation_timestamp: Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + created).expect("time"),
            )),
            ..Default::default()
        },
        storage_class_name: class.into(),
        node_topology: topology,
        capacity: Some(Quantity("1Gi".into())),
        maximum_volume_size: None,
    }
}

fn labels_sel(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector { match_labels: Some(seg(pairs)), match_expressions: None })
}

#[test]
fn obsolete_and_duplicate_objects_are_deleted_the_oldest_kept() {
    let z1 = [("zone", "z1")];
    let desired: BTreeSet<Item> = [item(&z1, "fast"), item(&z1, "slow")].into();
    let objects = [
        object("keep", "fast", labels_sel(&z1), 0),
        object("dup-newer", "fast", labels_sel(&z1), 5),
        object("class-gone", "gone", labels_sel(&z1), 0),
        object("segment-gone", "slow", labels_sel(&[("zone", "z9")]), 0),
        object("no-topology", "slow", None, 0),
        object(
            "expressions",
            "slow",
            Some(LabelSelector {
                match_labels: Some(seg(&z1)),
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "zone".into(),
                    operator: "Exists".into(),
                    values: None,
                }]),
            }),
            0,
        ),
    ];
    let got: Vec<String> = to_delete(objects.iter(), &desired).into_iter().map(|(n, _)| n).collect();
    assert_eq!(got, ["class-gone", "dup-newer", "expressions", "no-topology", "segment-gone"]);
    // goal 2, current 1 (slow has no object), obsolete 4 (the duplicate is not counted).
    assert_eq!(counts(objects.iter(), &desired), (2, 1, 4));
    let empty: BTreeSet<Item> = BTreeSet::new();
    assert_eq!(to_delete(objects.iter(), &empty).len(), objects.len(), "nothing desired: everything goes");
}

#[test]
fn an_empty_topology_selector_is_the_empty_segment() {
    let o = object("x", "fast", Some(LabelSelector::default()), 0);
    assert_eq!(item_of(&o), Some(item(&[], "fast")));
}

#[test]
fn answers_are_checked() {
    let i = item(&[("zone", "z1")], "fast");
    assert_eq!(check_answer(&i, 0, None), Ok(Answer { available: 0, maximum: None }), "zero is published");
    assert_eq!(check_answer(&i, 5, Some(3)), Ok(Answer { available: 5, maximum: Some(3) }));
    let e = check_answer(&i, -1, None).unwrap_err();
    assert_eq!(e.to_string(), "the driver reported a negative available_capacity -1 for fast@{zone=z1}");
    assert!(matches!(check_answer(&i, 1, Some(-2)), Err(AnswerError::NegativeMaximum(-2, _))));
}

fn owner(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        name: "ctrl".into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

#[test]
fn a_new_object_has_upstreams_name_labels_topology_and_owner() {
    let i = item(&[("zone", "z1")], "fast");
    let o = new_object(
        &i,
        Answer { available: 1 << 30, maximum: Some(1 << 20) },
        DRIVER,
        "external-provisioner",
        Some(&owner("u")),
    );
    assert_eq!(o.metadata.generate_name.as_deref(), Some("csisc-"));
    let l = o.metadata.labels.clone().unwrap_or_default();
    assert_eq!(l["csi.storage.k8s.io/drivername"], DRIVER);
    assert_eq!(l["csi.storage.k8s.io/managed-by"], "external-provisioner");
    assert_eq!(o.capacity, Some(Quantity("1Gi".into())));
    assert_eq!(o.maximum_volume_size, Some(Quantity("1Mi".into())));
    assert_eq!(item_of(&o), Some(i));
    assert!(owned_by(&o, &owner("u")));
    let none = new_object(&item(&[], "fast"), Answer { available: 0, maximum: None }, DRIVER, "m", None);
    assert_eq!(none.metadata.owner_references, None);
    assert_eq!(none.maximum_volume_size, None);
}

#[test]
fn updates_only_when_something_changed() {
    let mut o = object("x", "fast", labels_sel(&[]), 0);
    o.maximum_volume_size = Some(Quantity("1Mi".into()));
    o.metadata.owner_references = Some(vec![owner("u")]);
    let same = Answer { available: 1 << 30, maximum: Some(1 << 20) };
    let table: Vec<(&str, Answer, Option<OwnerReference>, Option<serde_json::Value>)> = vec![
        ("unchanged", same, Some(owner("u")), None),
        ("unchanged, no owner wanted", same, None, None),
        (
            "less capacity",
            Answer { available: 1 << 29, ..same },
            None,
            Some(serde_json::json!({"capacity": "512Mi", "maximumVolumeSize": "1Mi"})),
        ),
        (
            "maximum no longer reported",
            Answer { maximum: None, ..same },
            None,
            Some(serde_json::json!({"capacity": "1Gi", "maximumVolumeSize": null})),
        ),
        (
            "another owner: added",
            same,
            Some(owner("v")),
            Some(serde_json::json!({"capacity": "1Gi", "maximumVolumeSize": "1Mi",
                "metadata": {"ownerReferences": [owner("u"), owner("v")]}})),
        ),
    ];
    for (what, answer, own, want) in table {
        assert_eq!(update(&o, answer, own.as_ref()), want, "{what}");
    }
}

fn term(exprs: &[(&str, &str, &[&str])]) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(
            exprs
                .iter()
                .map(|(k, op, v)| NodeSelectorRequirement {
                    key: k.to_string(),
                    operator: op.to_string(),
                    values: Some(v.iter().map(|s| s.to_string()).collect()),
                })
                .collect(),
        ),
        match_fields: None,
    }
}

#[test]
fn segments_of_a_pv_node_affinity() {
    let affinity = VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![
                term(&[("zone", "In", &["z1"]), ("rack", "In", &["r1"])]),
                term(&[("zone", "In", &["z1", "z2"])]),
                term(&[("zone", "NotIn", &["z1"])]),
                term(&[("zone", "In", &["z3"])]),
            ],
        }),
    };
    assert_eq!(affinity_segments(&affinity), vec![seg(&[("rack", "r1"), ("zone", "z1")]), seg(&[("zone", "z3")])]);
    assert!(affinity_segments(&VolumeNodeAffinity::default()).is_empty());
}

#[test]
fn the_owner_walk() {
    let pod = ObjectMeta {
        name: Some("p-0".into()),
        namespace: Some("ns".into()),
        uid: Some("pod-uid".into()),
        owner_references: Some(vec![
            OwnerReference { controller: None, ..owner("not-the-controller") },
            OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "rs".into(),
                uid: "rs-uid".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ]),
        ..Default::default()
    };
    let done = |api: &str, kind: &str, name: &str, uid: &str| {
        OwnerStep::Done(OwnerReference {
            api_version: api.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: None,
        })
    };
    assert_eq!(owner_step(&pod, "v1", "Pod", 0), Ok(done("v1", "Pod", "p-0", "pod-uid")), "level 0: the pod");
    assert_eq!(owner_step(&pod, "v1", "Pod", 1), Ok(done("apps/v1", "ReplicaSet", "rs", "rs-uid")), "level 1: unread");
    assert_eq!(
        owner_step(&pod, "v1", "Pod", 2),
        Ok(OwnerStep::Follow {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "rs".into(),
            levels: 1
        })
    );
    let orphan = ObjectMeta { owner_references: None, ..pod };
    assert_eq!(
        owner_step(&orphan, "v1", "Pod", 1),
        Err("v1/Pod \"p-0\" in namespace \"ns\" has no controlling owner, cannot unwind the ownership further".into())
    );
}

#[test]
fn node_deployment_managed_by_is_per_node_and_a_label_value() {
    assert_eq!(node_managed_by("external-provisioner", "node-1"), "external-provisioner-node-1");
    let long = "ip-10-0-0-1.eu-west-1.compute.internal.example.com.extra";
    let a = node_managed_by("external-provisioner", long);
    let b = node_managed_by("external-provisioner", &format!("{long}2"));
    assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
    assert_ne!(a, b);
    assert!(a.starts_with("external-provisioner-ip-10"), "{a}");
    assert!(a.chars().last().is_some_and(|c| c.is_ascii_alphanumeric()));
}
