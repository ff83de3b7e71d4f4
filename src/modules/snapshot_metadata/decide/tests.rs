use super::*;

fn refused(code: Code, message: &str) -> Result<(), Refusal> {
    Err(Refusal::new(code, message))
}

#[test]
fn a_request_missing_a_field_is_refused_in_upstreams_order() {
    let all = |token, namespace, snapshot| Asked::Allocated { token, namespace, snapshot };
    let delta = |token, namespace, base_id, target| Asked::Delta { token, namespace, base_id, target };
    let bad = Code::InvalidArgument;
    let cases = [
        ("allocated, complete", all("t", "ns", "snap"), Ok(())),
        ("allocated, nothing: the token first", all("", "", ""), refused(bad, "securityToken is missing")),
        ("allocated, no namespace", all("t", "", ""), refused(bad, "namespace parameter cannot be empty")),
        ("allocated, no snapshot", all("t", "ns", ""), refused(bad, "snapshotName cannot be empty")),
        ("delta, complete", delta("t", "ns", "handle-1", "snap"), Ok(())),
        ("delta, nothing: the token first", delta("", "", "", ""), refused(bad, "securityToken is missing")),
        ("delta, no namespace", delta("t", "", "", ""), refused(bad, "namespace parameter cannot be empty")),
        ("delta, no base: before the target", delta("t", "ns", "", ""), refused(bad, "baseSnapshotId cannot be empty")),
        ("delta, no target", delta("t", "ns", "handle-1", ""), refused(bad, "targetSnapshotName cannot be empty")),
    ];
    for (what, asked, want) in cases {
        assert_eq!(validate(&asked), want, "{what}");
    }
}

#[test]
fn a_token_authenticates_only_for_the_audience() {
    let ours = ["csi-sidecar.example.com".to_string()];
    let theirs = ["someone-else".to_string()];
    let status = |authenticated, audiences| Reviewed::Status { authenticated, audiences };
    let no = refused(Code::Unauthenticated, "unauthenticated user");
    let cases = [
        ("authenticated for the audience", status(true, &ours[..]), Ok(())),
        ("authenticated for another audience", status(true, &theirs[..]), no.clone()),
        ("authenticated for none", status(true, &[][..]), no.clone()),
        ("not authenticated", status(false, &ours[..]), no),
        (
            "the review failed",
            Reviewed::Failed("connection refused"),
            refused(Code::Internal, "failed to authenticate user: connection refused"),
        ),
    ];
    for (what, review, want) in cases {
        assert_eq!(authenticated(&review, "csi-sidecar.example.com"), want, "{what}");
    }
}

#[test]
fn a_user_without_get_volumesnapshots_is_denied_with_the_reviews_reason() {
    assert_eq!(authorized(Ok((true, ""))), Ok(()));
    let denied = "user does not have permissions to perform the operation: no RBAC policy matched";
    assert_eq!(authorized(Ok((false, "no RBAC policy matched"))), refused(Code::PermissionDenied, denied));
    assert_eq!(authorized(Err("timeout")), refused(Code::Internal, "failed to authorize the user: timeout"));
}

#[test]
fn a_snapshot_must_be_ready_and_bound_and_its_content_ready_with_a_handle_of_this_driver() {
    let snap = |ready, content| Ok(SnapshotSeen { ready, content });
    assert_eq!(bound_content("ns", "s", snap(true, Some("c1"))), Ok("c1"));
    let unavailable = |m: &str| Err(Refusal::new(Code::Unavailable, m));
    assert_eq!(
        bound_content("ns", "s", snap(false, Some("c1"))),
        unavailable("the VolumeSnapshot is not yet ready, name: s")
    );
    let unbound = "boundVolumeSnapshotContentName is not set in VolumeSnapshot status, name: s";
    assert_eq!(bound_content("ns", "s", snap(true, None)), unavailable(unbound));
    assert_eq!(bound_content("ns", "s", snap(true, Some(""))), unavailable(unbound));
    let gone = "failed to get VolumeSnapshot 'ns/s': not found";
    assert_eq!(bound_content("ns", "s", Err("not found")), unavailable(gone));

    let content = |ready, handle, driver| Ok(ContentSeen { ready, handle, driver });
    let d = "fault.example.com";
    assert_eq!(snapshot_handle("s", "c1", content(true, Some("h1"), d), d), Ok("h1"));
    let not_ready = "the VolumeSnapshotContent is not yet ready, name: c1";
    assert_eq!(snapshot_handle("s", "c1", content(false, Some("h1"), d), d), unavailable(not_ready));
    let no_handle = "snapshotHandle is not set in VolumeSnapshotContent status, name: c1";
    assert_eq!(snapshot_handle("s", "c1", content(true, None, d), d), unavailable(no_handle));
    let other = "VolumeSnapshot 's' does not belong to the CSI driver 'fault.example.com'";
    assert_eq!(
        snapshot_handle("s", "c1", content(true, Some("h1"), "other.example.com"), d),
        Err(Refusal::new(Code::InvalidArgument, other))
    );
    let unreadable = "failed to get VolumeSnapshotContent 'c1': forbidden";
    assert_eq!(snapshot_handle("s", "c1", Err("forbidden"), d), unavailable(unreadable));
}

#[test]
fn a_snapshot_without_a_class_takes_the_drivers_one_default_class() {
    let d = "fault.example.com";
    let class = |name, driver, default| ClassSeen { name, driver, default };
    let unavailable = |m: &str| Err(Refusal::new(Code::Unavailable, m));
    let classes = [class("a", d, false), class("b", d, true), class("c", "other.example.com", true)];
    assert_eq!(default_class(&classes, d), Ok("b"));
    let none = "no default VolumeSnapshotClass is set for the CSI driver 'fault.example.com'";
    assert_eq!(default_class(&classes[..1], d), unavailable(none));
    assert_eq!(default_class(&classes[2..], d), unavailable(none), "another driver's default is not this one's");
    let two = [class("b", d, true), class("b2", d, true)];
    let several = "multiple default VolumeSnapshotClasses are set for the CSI driver 'fault.example.com'";
    assert_eq!(default_class(&two, d), unavailable(several));
}
