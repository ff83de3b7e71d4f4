//! Tables of what a content or group content waits for.

use super::*;
use crate::k8s::{
    group_snapshot_api::VolumeGroupSnapshotClass,
    snapshot_api::{VolumeSnapshotClass, VolumeSnapshotContentStatus},
};
use crate::modules::snapshotter::{decide, group_decide};

fn content(uid: Option<&str>) -> VolumeSnapshotContent {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "snapcontent-1"},
        "spec": {"driver": "d", "deletionPolicy": "Delete", "volumeSnapshotClassName": "class",
                 "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": uid},
                 "source": {"volumeHandle": "vol-1"}},
    }))
    .expect("content")
}

fn group_content(uid: Option<&str>, handles: &[&str]) -> VolumeGroupSnapshotContent {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gc"},
        "spec": {"driver": "d", "deletionPolicy": "Delete", "volumeGroupSnapshotClassName": "c",
                 "volumeGroupSnapshotRef": {"name": "g", "namespace": "ns", "uid": uid},
                 "source": {"volumeHandles": handles}},
    }))
    .expect("group content")
}

fn naming() -> decide::Naming {
    decide::Naming { prefix: "snapshot".into(), uuid_length: -1, extra_metadata: false }
}

#[test]
fn what_each_content_error_waits_for() {
    let s = || "x".to_string();
    let boxed = |e: SnapError| Box::new(e);
    let table = [
        (SnapError::NoClass(s()), WaitingFor::Class),
        (SnapError::ClassNotFound(s()), WaitingFor::Class),
        (SnapError::UnknownReserved(s()), WaitingFor::Class),
        (SnapError::CheckClass { class: s(), content: s(), error: s() }, WaitingFor::Class),
        (SnapError::ListSecretRef { content: s(), error: s() }, WaitingFor::Class),
        (SnapError::SecretIncomplete(s()), WaitingFor::Secret),
        (SnapError::Credentials(s()), WaitingFor::Secret),
        (SnapError::ListCredentials { content: s(), error: s() }, WaitingFor::Secret),
        (SnapError::CreateInput { content: s(), source: boxed(SnapError::ClassNotFound(s())) }, WaitingFor::Class),
        (SnapError::CreateInput { content: s(), source: boxed(SnapError::Credentials(s())) }, WaitingFor::Secret),
        (
            SnapError::MemberCredentials { content: s(), source: boxed(SnapError::SecretIncomplete(s())) },
            WaitingFor::Secret,
        ),
        (SnapError::NotBound(s()), WaitingFor::Dependent),
        (SnapError::Take { volume: s(), error: s() }, WaitingFor::Driver),
        (SnapError::EmptyAnswer, WaitingFor::Driver),
        (SnapError::List { content: s(), error: s() }, WaitingFor::Driver),
        (SnapError::AddAnnotation { content: s(), error: s() }, WaitingFor::ApiServer),
        (SnapError::RemoveAnnotation { content: s(), error: s() }, WaitingFor::ApiServer),
        (SnapError::Status { content: s(), error: s() }, WaitingFor::ApiServer),
    ];
    for (e, want) in table {
        assert_eq!(e.waiting_for(), want, "{e:?}");
    }
}

#[test]
fn a_create_refused_for_an_unbound_content_waits_for_its_binding() {
    let class: VolumeSnapshotClass = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "class"}, "driver": "d", "deletionPolicy": "Delete"}))
    .expect("class");
    let unbound = content(None);
    let e = decide::create_request(&unbound, Some(&class), &naming()).expect_err("unbound");
    assert_eq!(create_waiting(&unbound, &e), WaitingFor::Dependent, "{e}");
    let e = decide::create_request(&unbound, None, &naming()).expect_err("no class");
    assert_eq!(create_waiting(&unbound, &e), WaitingFor::Class, "the class first: {e}");
    let bound = content(Some("uid-1"));
    let failed = SnapError::Take { volume: "vol-1".into(), error: "rpc error: code = Internal desc = boom".into() };
    assert_eq!(create_waiting(&bound, &failed), WaitingFor::Driver);
    assert_eq!(Step::Wait.waiting_for(), Some(WaitingFor::Dependent));
    assert_eq!(Step::Create { first: true }.waiting_for(), None);
}

#[test]
fn what_each_group_content_error_waits_for() {
    let s = || "x".to_string();
    let table = [
        (GroupError::NoClass(s()), WaitingFor::Class),
        (GroupError::ClassNotFound(s()), WaitingFor::Class),
        (GroupError::Parameters(SnapError::UnknownReserved(s())), WaitingFor::Class),
        (GroupError::CheckClass { class: s(), content: s(), error: s() }, WaitingFor::Class),
        (GroupError::SecretRef { content: s(), error: s() }, WaitingFor::Class),
        (GroupError::SecretIncomplete(s()), WaitingFor::Secret),
        (GroupError::Credentials(s()), WaitingFor::Secret),
        (GroupError::GetCredentials { content: s(), error: s() }, WaitingFor::Secret),
        (GroupError::CreateInput { content: s(), source: Box::new(GroupError::Credentials(s())) }, WaitingFor::Secret),
        (GroupError::NotBound(s()), WaitingFor::Dependent),
        (GroupError::NoVolumes(s()), WaitingFor::Dependent),
        (GroupError::NoMembersToGet(s()), WaitingFor::Dependent),
        (GroupError::NoMembersToDelete(s()), WaitingFor::Dependent),
        (GroupError::Take { volumes: s(), error: s() }, WaitingFor::Driver),
        (GroupError::EmptyAnswer, WaitingFor::Driver),
        (GroupError::Get { content: s(), error: s() }, WaitingFor::Driver),
        (GroupError::AddAnnotation { content: s(), error: s() }, WaitingFor::ApiServer),
        (GroupError::RemoveAnnotation { content: s(), error: s() }, WaitingFor::ApiServer),
        (GroupError::Status { content: s(), error: s() }, WaitingFor::ApiServer),
    ];
    for (e, want) in table {
        assert_eq!(e.waiting_for(), want, "{e:?}");
    }
}

#[test]
fn a_group_create_refused_before_the_call_waits_for_snapshot_controller() {
    let class: VolumeGroupSnapshotClass = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "c"}, "driver": "d", "deletionPolicy": "Delete"}))
    .expect("class");
    for c in [group_content(None, &["v1"]), group_content(Some("uid-1"), &[])] {
        let e = group_decide::create_request(&c, Some(&class), &naming()).expect_err("refused");
        assert_eq!(group_create_waiting(&c, &e), WaitingFor::Dependent, "{e}");
    }
    let c = group_content(Some("uid-1"), &["v1"]);
    let failed = GroupError::Take { volumes: "[v1]".into(), error: "rpc error: code = Internal desc = boom".into() };
    assert_eq!(group_create_waiting(&c, &failed), WaitingFor::Driver);
}

#[test]
fn after_an_answer_a_content_waits_for_readiness_or_its_deletion() {
    let with = |ready: Option<bool>, deleting: bool| {
        let mut c = content(Some("uid-1"));
        c.status = Some(VolumeSnapshotContentStatus { ready_to_use: ready, ..Default::default() });
        if deleting {
            c.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        c
    };
    let table = [
        (Some(true), false, None),
        (Some(true), true, Some(WaitingFor::Retry)),
        (Some(false), false, Some(WaitingFor::SnapshotReady)),
        (None, false, Some(WaitingFor::SnapshotReady)),
        (Some(false), true, Some(WaitingFor::SnapshotReady)),
    ];
    for (ready, deleting, want) in table {
        assert_eq!(after_answer(&with(ready, deleting)), want, "ready {ready:?}, deleting {deleting}");
    }
}
