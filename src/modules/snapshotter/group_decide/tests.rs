//! Tables of the group snapshot decisions (upstream's
//! `groupsnapshot_helper.go` rules).

use super::*;
use crate::k8s::group_snapshot_api::GroupSnapshotHandles;

fn content(v: serde_json::Value) -> VolumeGroupSnapshotContent {
    let mut base = serde_json::json!({
        "metadata": {"name": "gc", "resourceVersion": "1"},
        "spec": {"driver": "d", "deletionPolicy": "Delete", "volumeGroupSnapshotClassName": "c",
                 "volumeGroupSnapshotRef": {"name": "g", "namespace": "ns", "uid": "1234-abcd"},
                 "source": {"volumeHandles": ["v1", "v2"]}}
    });
    merge(&mut base, v);
    serde_json::from_value(base).expect("group content")
}

fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                // null removes the field (as a JSON merge patch does).
                if v.is_null() {
                    a.remove(&k);
                } else {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (a, b) => *a = b,
    }
}

fn class(driver: &str, params: serde_json::Value) -> VolumeGroupSnapshotClass {
    serde_json::from_value(serde_json::json!({"metadata": {"name": "c"}, "driver": driver, "deletionPolicy": "Delete",
                                              "parameters": params}))
    .expect("class")
}

fn naming(extra: bool) -> Naming {
    Naming { prefix: "groupsnapshot".into(), uuid_length: -1, extra_metadata: extra }
}

const DELETING: &str = "2026-01-01T00:00:00Z";

#[test]
fn which_group_contents_are_the_drivers() {
    let pre = content(serde_json::json!({"spec": {"source": {"volumeHandles": null,
        "groupSnapshotHandles": {"volumeGroupSnapshotHandle": "g", "volumeSnapshotHandles": ["s"]}}}}));
    let none = content(serde_json::json!({"spec": {"source": {"volumeHandles": []}}}));
    let rows: [(&str, &VolumeGroupSnapshotContent, Option<VolumeGroupSnapshotClass>, bool); 5] = [
        ("dynamic, no class cached", &content(serde_json::json!({})), None, true),
        ("pre-provisioned", &pre, None, true),
        ("no source", &none, None, false),
        (
            "class of another driver",
            &content(serde_json::json!({})),
            Some(class("other", serde_json::json!({}))),
            false,
        ),
        ("class of the driver", &content(serde_json::json!({})), Some(class("d", serde_json::json!({}))), true),
    ];
    for (what, c, cl, want) in rows {
        assert_eq!(is_ours(c, "d", cl.as_ref()), want, "{what}");
    }
    assert!(!is_ours(&content(serde_json::json!({"spec": {"driver": "x"}})), "d", None));
}

#[test]
fn the_step_follows_upstreams_order() {
    use GroupStep::*;
    let rows: Vec<(&str, serde_json::Value, GroupStep)> = vec![
        ("new dynamic", serde_json::json!({}), Create { first: true }),
        (
            "error status, not ready: create again",
            serde_json::json!({"status": {"readyToUse": false}}),
            Create { first: false },
        ),
        (
            "ready",
            serde_json::json!({"status": {"readyToUse": true, "volumeGroupSnapshotHandle": "h"}}),
            Ready { remove_annotation: false },
        ),
        (
            "ready with the annotation",
            serde_json::json!({"metadata": {"annotations": {upstream::ANN_GROUP_BEING_CREATED: "yes"}}, "status": {"readyToUse": true}}),
            Ready { remove_annotation: true },
        ),
        (
            "pre-provisioned not ready",
            serde_json::json!({"spec": {"source": {"volumeHandles": null, "groupSnapshotHandles": {"volumeGroupSnapshotHandle": "g", "volumeSnapshotHandles": ["s"]}}}}),
            Check,
        ),
        (
            "deleting without the being-deleted annotation: not yet",
            serde_json::json!({"metadata": {"deletionTimestamp": DELETING}}),
            Create { first: true },
        ),
        (
            "deleting, policy Delete, handle",
            serde_json::json!({"metadata": {"deletionTimestamp": DELETING, "annotations": {upstream::ANN_GROUP_BEING_DELETED: "yes"}},
                "status": {"volumeGroupSnapshotHandle": "h", "readyToUse": true}}),
            Delete { group_id: Some("h".into()) },
        ),
        (
            "deleting, policy Retain",
            serde_json::json!({"metadata": {"deletionTimestamp": DELETING, "annotations": {upstream::ANN_GROUP_BEING_DELETED: "yes"}},
                "spec": {"deletionPolicy": "Retain"}, "status": {"volumeGroupSnapshotHandle": "h"}}),
            Delete { group_id: None },
        ),
        (
            "deleting, handle already cleared: the finalizer",
            serde_json::json!({"metadata": {"deletionTimestamp": DELETING, "annotations": {upstream::ANN_GROUP_BEING_DELETED: "yes"}},
                "status": {"readyToUse": null}}),
            Delete { group_id: None },
        ),
        (
            "deleting while being created: wait for the answer",
            serde_json::json!({"metadata": {"deletionTimestamp": DELETING,
                             "annotations": {upstream::ANN_GROUP_BEING_DELETED: "yes", upstream::ANN_GROUP_BEING_CREATED: "yes"}},
                "status": {"readyToUse": false}}),
            Create { first: false },
        ),
        (
            "pre-provisioned, unbound, deleting",
            serde_json::json!({"metadata": {"deletionTimestamp": DELETING}, "spec": {"volumeGroupSnapshotRef": {"uid": ""},
                "source": {"volumeHandles": null, "groupSnapshotHandles": {"volumeGroupSnapshotHandle": "g", "volumeSnapshotHandles": ["s"]}}}}),
            Delete { group_id: None },
        ),
    ];
    for (what, patch, want) in rows {
        assert_eq!(step(&content(patch)), want, "{what}");
    }
}

#[test]
fn the_create_request() {
    let c = content(serde_json::json!({}));
    let cl = class("d", serde_json::json!({"a": "b", "csi.storage.k8s.io/group-snapshotter-secret-name": "s"}));
    let r = create_request(&c, Some(&cl), &naming(false)).expect("request");
    assert_eq!(r.name, "groupsnapshot-1234-abcd");
    assert_eq!(r.source_volume_ids, ["v1", "v2"]);
    assert_eq!(r.parameters, HashMap::from([("a".to_string(), "b".to_string())]));
    let r = create_request(&c, Some(&cl), &Naming { uuid_length: 3, ..naming(true) }).expect("request");
    assert_eq!(r.name, "groupsnapshot-123");
    assert_eq!(r.parameters.get(upstream::PARAM_GROUP_SNAPSHOT_NAME).map(String::as_str), Some("g"));
    assert_eq!(r.parameters.get(upstream::PARAM_GROUP_SNAPSHOT_NAMESPACE).map(String::as_str), Some("ns"));
    assert_eq!(r.parameters.get(upstream::PARAM_GROUP_CONTENT_NAME).map(String::as_str), Some("gc"));

    let err = |c: &VolumeGroupSnapshotContent, cl: Option<&VolumeGroupSnapshotClass>| {
        create_request(c, cl, &naming(false)).unwrap_err().to_string()
    };
    let no_class = content(serde_json::json!({"spec": {"volumeGroupSnapshotClassName": null}}));
    assert_eq!(
        err(&no_class, None),
        "failed to get input parameters to create group snapshot for group snapshot content gc: \"failed to take group snapshot gc without a group snapshot class\""
    );
    assert_eq!(
        err(&c, None),
        "failed to get input parameters to create group snapshot for group snapshot content gc: \"volumegroupsnapshotclass.groupsnapshot.storage.k8s.io \\\"c\\\" not found\""
    );
    let bad = class("d", serde_json::json!({"csi.storage.k8s.io/foo": "x"}));
    assert_eq!(
        err(&c, Some(&bad)),
        "failed to remove CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/foo\" with reserved namespace csi.storage.k8s.io/"
    );
    let unbound = content(serde_json::json!({"spec": {"volumeGroupSnapshotRef": {"uid": null}}}));
    assert_eq!(
        err(&unbound, Some(&cl)),
        "failed to take group snapshot of the volumes [v1 v2]: \"cannot create group snapshot. Group snapshot content gc not bound to a group snapshot\""
    );
    let half = content(serde_json::json!({"metadata": {"annotations": {
        upstream::ANN_GROUP_DELETION_SECRET_NAME: "s", upstream::ANN_GROUP_DELETION_SECRET_NAMESPACE: ""}}}));
    assert!(err(&half, Some(&cl)).contains("secret name or namespace not specified"), "{}", err(&half, Some(&cl)));
}

#[test]
fn secrets_and_member_ids() {
    let c = content(serde_json::json!({"metadata": {"annotations": {
        upstream::ANN_GROUP_DELETION_SECRET_NAME: "s", upstream::ANN_GROUP_DELETION_SECRET_NAMESPACE: "ns"}}}));
    assert_eq!(deletion_secret_ref(&c), Ok(Some(("s".into(), "ns".into()))));
    assert_eq!(deletion_secret_ref(&content(serde_json::json!({}))), Ok(None));
    let p: BTreeMap<String, String> = [
        (upstream::PARAM_GROUP_GET_SECRET_NAME.to_string(), "${volumegroupsnapshotcontent.name}-get".to_string()),
        (upstream::PARAM_GROUP_GET_SECRET_NAMESPACE.to_string(), "kube-system".to_string()),
    ]
    .into();
    assert_eq!(get_secret_ref(Some(&p), "gc"), Ok(Some(("gc-get".into(), "kube-system".into()))));
    let half: BTreeMap<String, String> = [(upstream::PARAM_GROUP_GET_SECRET_NAME.to_string(), "x".to_string())].into();
    assert!(get_secret_ref(Some(&half), "gc").unwrap_err().contains("GroupSnapshotterGet secrets"));

    let with_list = content(serde_json::json!({"status": {"volumeGroupSnapshotHandle": "h",
        "volumeSnapshotInfoList": [{"volumeHandle": "v1", "snapshotHandle": "s1"}, {"volumeHandle": "v2", "snapshotHandle": "s2"}]}}));
    assert_eq!(delete_snapshot_ids(&with_list), Ok(vec!["s1".to_string(), "s2".to_string()]));
    let mut pre = content(serde_json::json!({"status": {"volumeGroupSnapshotHandle": "h"}}));
    pre.spec.source.group_snapshot_handles = Some(GroupSnapshotHandles {
        volume_group_snapshot_handle: "h".into(),
        volume_snapshot_handles: vec!["p1".into()],
    });
    assert_eq!(delete_snapshot_ids(&pre), Ok(vec!["p1".to_string()]));
    assert_eq!(get_request_ids(&pre), Ok(("h".to_string(), vec!["p1".to_string()])));
    assert_eq!(
        delete_snapshot_ids(&content(serde_json::json!({}))).unwrap_err().to_string(),
        "cannot delete group snapshot content gc. No snapshots found in the group snapshot"
    );
}

fn snap(id: &str, vol: &str, size: i64) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: size,
        snapshot_id: id.into(),
        source_volume_id: vol.into(),
        creation_time: Some(prost_types::Timestamp { seconds: 2, nanos: 5 }),
        ready_to_use: true,
        group_snapshot_id: "g".into(),
        accessible_topology: Vec::new(),
    }
}

#[test]
fn the_status_after_an_answer() {
    let now = Timestamp::from_second(1_800_000_000).expect("ts");
    let g = csi::VolumeGroupSnapshot {
        group_snapshot_id: "g".into(),
        snapshots: vec![snap("s1", "v1", 10), snap("s2", "v2", 0)],
        creation_time: None,
        ready_to_use: true,
    };
    let o = observe(Some(&g), true, "", now).expect("observed");
    assert_eq!(o.created, now, "no time: now");
    assert_eq!(o.members[0].creation_time, Some(2_000_000_005));
    assert_eq!(o.members[0].restore_size, Some(10));
    assert_eq!(o.members[1].restore_size, None, "size 0: none");
    let s = status_update(None, &o).expect("new status");
    assert_eq!(s.volume_group_snapshot_handle.as_deref(), Some("g"));
    assert_eq!(s.volume_snapshot_info_list.len(), 2);
    assert_eq!(status_update(Some(&s), &o), None, "nothing changed");
    let errored = VolumeGroupSnapshotContentStatus {
        ready_to_use: Some(false),
        error: Some(SnapshotError { time: None, message: Some("m".into()) }),
        ..Default::default()
    };
    let s2 = status_update(Some(&errored), &o).expect("filled");
    assert_eq!(s2.error, None, "ready clears the error");
    assert_eq!(s2.volume_snapshot_info_list.len(), 2);
    // A Get check keeps the content's handle and takes no members.
    let o = observe(Some(&g), false, "pre", now).expect("observed");
    assert_eq!((o.handle.as_str(), o.members.len()), ("pre", 0));
    assert_eq!(observe(None, true, "", now), Err(GroupError::EmptyAnswer));
    let cleared = cleared_status(Some(&s));
    assert_eq!((cleared.volume_group_snapshot_handle, cleared.ready_to_use, cleared.creation_time), (None, None, None));
    assert_eq!(cleared.volume_snapshot_info_list.len(), 2, "the member list stays");
}

#[test]
fn the_error_patch_and_the_annotations() {
    let now = Timestamp::from_second(1_800_000_000).expect("ts");
    let p = error_patch::<VolumeGroupSnapshotContentStatus>(None, "boom", now).expect("patch");
    assert_eq!(p[0]["path"], "/status");
    assert_eq!(p[0]["value"]["readyToUse"], false);
    assert_eq!(p[0]["value"]["error"]["message"], "boom");
    let st = VolumeGroupSnapshotContentStatus {
        error: Some(SnapshotError { time: None, message: Some("boom".into()) }),
        ..Default::default()
    };
    assert_eq!(error_patch(Some(&st), "boom", now), None, "the same message: nothing");
    let p = error_patch(Some(&st), "other", now).expect("patch");
    assert_eq!(p[0]["path"], "/status/error");
    assert_eq!(p[1]["path"], "/status/readyToUse");
    let c = content(serde_json::json!({"metadata": {"annotations": {"a": "b"}}}));
    let p = being_created_patch(&c);
    assert_eq!(
        p,
        serde_json::json!({"metadata": {"annotations": {upstream::ANN_GROUP_BEING_CREATED: "yes"}}}),
        "the one key merged, never the map replaced"
    );
    assert_eq!(
        remove_being_created_patch()[0]["path"],
        "/metadata/annotations/groupsnapshot.storage.kubernetes.io~1volumegroupsnapshot-being-created"
    );
}

#[test]
fn which_updates_need_a_sync() {
    let old = content(serde_json::json!({}));
    let rows = [
        ("resync", serde_json::json!({}), true),
        (
            "status only",
            serde_json::json!({"metadata": {"resourceVersion": "2"}, "status": {"readyToUse": false}}),
            false,
        ),
        (
            "becomes ready",
            serde_json::json!({"metadata": {"resourceVersion": "2"}, "status": {"readyToUse": true}}),
            true,
        ),
        (
            "being-created only",
            serde_json::json!({"metadata": {"resourceVersion": "2", "annotations": {upstream::ANN_GROUP_BEING_CREATED: "yes"}}}),
            false,
        ),
        (
            "finalizers only",
            serde_json::json!({"metadata": {"resourceVersion": "2", "finalizers": [upstream::GROUP_CONTENT_FINALIZER]}}),
            false,
        ),
        (
            "being-deleted",
            serde_json::json!({"metadata": {"resourceVersion": "2", "annotations": {upstream::ANN_GROUP_BEING_DELETED: "yes"}}}),
            true,
        ),
        (
            "deletion timestamp",
            serde_json::json!({"metadata": {"resourceVersion": "2", "deletionTimestamp": DELETING}}),
            true,
        ),
    ];
    for (what, patch, want) in rows {
        assert_eq!(should_enqueue(&old, &content(patch)), want, "{what}");
    }
}
