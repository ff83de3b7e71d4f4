use super::{decide::*, *};
use crate::debug::{
    LeaderView, Phase, WaitingFor,
    query::{CallView, ModuleView, ObjectView, Page},
};

fn object(kind: &str, key: &str, waiting_for: WaitingFor, attempts: u32, error: Option<&str>) -> ObjectView {
    let (ns, name) = crate::debug::query::split_key(key);
    ObjectView {
        module: decide::module_for(kind).expect("a module's kind").into(),
        kind: kind.into(),
        namespace: ns.map(str::to_string),
        name: name.into(),
        queue: "claims".into(),
        waiting_for,
        attempts,
        last_error: error.map(str::to_string),
        next_retry: Some("2026-12-05T10:00:12Z".into()),
        next_retry_in_seconds: Some(11.2),
        csi_call: None,
        since: "2026-12-05T10:00:00Z".into(),
        waiting_seconds: 12.0,
    }
}

fn pages(objects: Vec<ObjectView>, leader: Option<LeaderView>) -> Sidecar {
    let modules = ["attacher", "provisioner", "snapshotter"]
        .iter()
        .map(|m| ModuleView {
            module: (*m).into(),
            leader: leader.clone(),
            not_done: objects.len(),
            phase: if leader.as_ref().is_some_and(|l| !l.leading) { Phase::Standby } else { Phase::Running },
        })
        .collect();
    Sidecar::Pages(vec![Page {
        driver: Some("hostpath.csi.k8s.io".into()),
        modules,
        matching: objects.len(),
        objects,
        after: None,
    }])
}

/// Two replicas' pages: a standby holding nothing, then the leader
/// holding `held`.
fn two_replicas(held: ObjectView) -> Sidecar {
    let leader = |leading| LeaderView { lease: "kube-system/l".into(), leading, holder: Some("pod-a".into()) };
    let page = |leading, objects: Vec<ObjectView>| Page {
        driver: Some("hostpath.csi.k8s.io".into()),
        modules: vec![ModuleView {
            module: "provisioner".into(),
            leader: Some(leader(leading)),
            not_done: objects.len(),
            phase: if leading { Phase::Running } else { Phase::Standby },
        }],
        matching: objects.len(),
        objects,
        after: None,
    };
    Sidecar::Pages(vec![page(false, vec![]), page(true, vec![held])])
}

fn pending(key: &str) -> Claim {
    Claim { key: key.into(), phase: Some("Pending".into()), class_name: Some("fast".into()), ..Claim::default() }
}

fn class(provisioner: &str, wffc: bool) -> Class {
    Class::Found { name: "fast".into(), provisioner: provisioner.into(), wait_for_consumer: wffc }
}

fn warning(reason: &str, message: &str, count: i32) -> Event {
    Event { kind: "Warning".into(), reason: reason.into(), message: message.into(), count }
}

#[test]
fn claims() {
    let ours = class("hostpath.csi.k8s.io", false);
    let failing = object(
        "PersistentVolumeClaim",
        "ns/data",
        WaitingFor::Driver,
        3,
        Some("rpc error: code = ResourceExhausted desc = pool full"),
    );
    let mut on_node = pending("ns/data");
    on_node.selected_node = Some("node-1".into());
    let secret = object("PersistentVolumeClaim", "ns/data", WaitingFor::Secret, 2, Some("secret \"s\" not found"));
    let mut in_flight = failing.clone();
    in_flight.csi_call =
        Some(CallView { method: "/csi.v1.Controller/CreateVolume".into(), since: "x".into(), seconds: 4.4 });
    let standby =
        LeaderView { lease: "kube-system/hostpath-csi-k8s-io".into(), leading: false, holder: Some("pod-a".into()) };
    let bound = Claim { volume_name: Some("pvc-1".into()), phase: Some("Bound".into()), ..pending("ns/data") };
    let events = [warning("ProvisioningFailed", "secret \"s\" not found", 4)];
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, Claim, Class, Sidecar, &[Event], bool, &[&str])> = vec![
        ("bound: done", bound, ours.clone(), Sidecar::NotAsked, &[], true, &["bound to PersistentVolume pvc-1"]),
        (
            "WaitForFirstConsumer without a node",
            pending("ns/data"),
            class("hostpath.csi.k8s.io", true),
            pages(vec![], None),
            &[],
            false,
            &["WaitForFirstConsumer: no pod has been scheduled with this claim yet"],
        ),
        (
            "another driver's claim",
            pending("ns/data"),
            class("other.csi.example.com", false),
            pages(vec![], None),
            &[],
            false,
            &[
                "not handled here: the claim asks for other.csi.example.com, this csi-sidecar serves hostpath.csi.k8s.io",
            ],
        ),
        (
            "the driver failing, on the selected node",
            on_node.clone(),
            class("hostpath.csi.k8s.io", true),
            pages(vec![failing.clone()], None),
            &[],
            false,
            &[
                "CreateVolume failed 3 times (last: rpc error: code = ResourceExhausted desc = pool full); next attempt in 12 s on node-1",
            ],
        ),
        (
            "a call in flight",
            pending("ns/data"),
            ours.clone(),
            pages(vec![in_flight], None),
            &[],
            false,
            &[
                "CreateVolume failed 3 times (last: rpc error: code = ResourceExhausted desc = pool full); CreateVolume in flight for 4 s",
            ],
        ),
        (
            "a missing secret, with the event",
            pending("ns/data"),
            ours.clone(),
            pages(vec![secret.clone()], None),
            &events,
            false,
            &[
                "a secret the class names is missing or cannot be read (last: secret \"s\" not found); next attempt in 12 s",
                "last warning: ProvisioningFailed (4 times): secret \"s\" not found",
            ],
        ),
        (
            "not the leader",
            pending("ns/data"),
            ours.clone(),
            pages(vec![], Some(standby)),
            &[],
            false,
            &[
                "this replica is not the leader (the Lease kube-system/hostpath-csi-k8s-io is held by pod-a): ask the leader's debug endpoint",
            ],
        ),
        (
            "the standby and the leader both asked: the leader's entry, no standby line",
            pending("ns/data"),
            ours.clone(),
            two_replicas(secret.clone()),
            &[],
            false,
            &[
                "a secret the class names is missing or cannot be read (last: secret \"s\" not found); next attempt in 12 s",
            ],
        ),
        (
            "restoring a snapshot that is not ready",
            pending("ns/data"),
            ours.clone(),
            pages(vec![object("PersistentVolumeClaim", "ns/data", WaitingFor::SnapshotReady, 1, None)], None),
            &[],
            false,
            &["the source VolumeSnapshot is not ready to use yet; next attempt in 12 s"],
        ),
        (
            "left to an external populator",
            pending("ns/data"),
            ours.clone(),
            pages(
                vec![ObjectView {
                    next_retry: None,
                    next_retry_in_seconds: None,
                    ..object("PersistentVolumeClaim", "ns/data", WaitingFor::Populator, 0, None)
                }],
                None,
            ),
            &[],
            false,
            &["its dataSourceRef is left to an external volume populator"],
        ),
        (
            "the sidecar unreachable: the events speak",
            pending("ns/data"),
            ours.clone(),
            Sidecar::Unreachable("127.0.0.1:1: connection refused".into()),
            &events,
            false,
            &[
                "csi-sidecar's debug endpoint did not answer: 127.0.0.1:1: connection refused",
                "last warning: ProvisioningFailed (4 times): secret \"s\" not found",
            ],
        ),
        (
            "held nothing: in progress",
            pending("ns/data"),
            ours.clone(),
            pages(vec![], None),
            &[],
            false,
            &["csi-sidecar holds nothing for it: provisioning has not failed; it is queued or in progress"],
        ),
        (
            "a missing class",
            pending("ns/data"),
            Class::Missing("fast".into()),
            Sidecar::NotAsked,
            &[],
            false,
            &["its StorageClass \"fast\" does not exist"],
        ),
        (
            "no class",
            pending("ns/data"),
            Class::None,
            Sidecar::NotAsked,
            &[],
            false,
            &["no StorageClass: the claim waits for a matching PersistentVolume; no provisioner makes one"],
        ),
        (
            "being deleted",
            Claim { deleting: Some(vec!["kubernetes.io/pvc-protection".into()]), ..pending("ns/data") },
            ours.clone(),
            Sidecar::NotAsked,
            &[],
            false,
            &["the claim is being deleted; finalizers left: kubernetes.io/pvc-protection"],
        ),
    ];
    for (what, c, class, sidecar, events, done, lines) in cases {
        let v = decide::claim(&c, &class, &sidecar, events);
        assert_eq!(v.done, done, "{what}: {v:?}");
        assert_eq!(v.exit_code(), if done { 0 } else { 1 }, "{what}");
        assert_eq!(v.lines, lines.iter().map(|l| l.to_string()).collect::<Vec<_>>(), "{what}");
    }
}

#[test]
fn a_bound_claim_waits_for_its_expansion() {
    let bound = Claim { volume_name: Some("pvc-1".into()), phase: Some("Bound".into()), ..pending("ns/data") };
    let mut resize =
        object("PersistentVolumeClaim", "ns/data", WaitingFor::Driver, 2, Some("rpc error: code = Internal desc = no"));
    resize.module = "resizer".into();
    resize.queue = "hostpath.csi.k8s.io-pvc".into();
    let mut modify = object("PersistentVolumeClaim", "ns/data", WaitingFor::Class, 0, None);
    modify.module = "resizer".into();
    modify.queue = "hostpath.csi.k8s.io-pvc-modify".into();
    modify.next_retry_in_seconds = None;
    let v = decide::claim(&bound, &class("hostpath.csi.k8s.io", false), &pages(vec![resize, modify], None), &[]);
    assert_eq!(v.exit_code(), 1);
    assert_eq!(
        v.lines,
        [
            "bound to PersistentVolume pvc-1",
            "resize: ControllerExpandVolume failed 2 times (last: rpc error: code = Internal desc = no); next attempt in 12 s",
            "modify: the StorageClass cannot be used",
        ]
    );
}

#[test]
fn attachments_and_snapshots() {
    let a = Attachment {
        name: "csi-1".into(),
        attacher: "hostpath.csi.k8s.io".into(),
        node: "node-1".into(),
        ..Attachment::default()
    };
    let attached = Attachment { attached: true, ..a.clone() };
    assert_eq!(decide::attachment(&attached, &Sidecar::NotAsked, &[]).lines, ["attached to node node-1"]);
    let mut failing =
        object("VolumeAttachment", "csi-1", WaitingFor::Driver, 2, Some("rpc error: code = Internal desc = boom"));
    failing.next_retry_in_seconds = None;
    let v = decide::attachment(
        &Attachment { attach_error: Some("rpc error: code = Internal desc = boom".into()), ..a.clone() },
        &pages(vec![failing], None),
        &[],
    );
    assert!(!v.done);
    assert_eq!(
        v.lines,
        [
            "not attached to node node-1 yet",
            "ControllerPublishVolume failed 2 times (last: rpc error: code = Internal desc = boom)",
            "the attachment's status says: rpc error: code = Internal desc = boom",
        ]
    );
    let other = Attachment { attacher: "other.csi".into(), ..a };
    assert!(decide::attachment(&other, &pages(vec![], None), &[]).lines[0].starts_with("not handled here"));

    let s = Snapshot { key: "ns/snap".into(), content: Some("snapcontent-1".into()), ..Snapshot::default() };
    let ready = Snapshot { ready: true, ..s.clone() };
    assert_eq!(decide::snapshot(&ready, &Sidecar::NotAsked, &[]).exit_code(), 0);
    let mut polling = object("VolumeSnapshotContent", "snapcontent-1", WaitingFor::SnapshotReady, 0, None);
    polling.next_retry_in_seconds = Some(0.4);
    let v = decide::snapshot(&s, &pages(vec![polling], None), &[]);
    assert_eq!(
        v.lines,
        [
            "not ready to use yet (content snapcontent-1)",
            "the CSI driver says the snapshot is not ready to use yet; next attempt in 1 s"
        ]
    );
    let unbound = Snapshot { content: None, source_claim: Some("data".into()), ..Snapshot::default() };
    assert_eq!(
        decide::snapshot(&unbound, &Sidecar::NotAsked, &[]).lines[0],
        "no VolumeSnapshotContent yet: the snapshot-controller makes one once the source claim data is bound"
    );
    let bound_source = Snapshot { source_claim_bound: true, ..unbound };
    assert_eq!(
        decide::snapshot(&bound_source, &Sidecar::NotAsked, &[]).lines[0],
        "no VolumeSnapshotContent yet: the source claim data is bound; the snapshot-controller has not made one yet"
    );
    let errored = Snapshot { content_error: Some("rpc error: code = Internal desc = no space".into()), ..s };
    assert!(
        decide::snapshot(&errored, &Sidecar::NotAsked, &[])
            .lines
            .contains(&"its status says: rpc error: code = Internal desc = no space".to_string())
    );
}

#[test]
fn arguments() {
    let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    let Parsed::Run(r) = parse(&args("pvc ns/data --endpoint :8080 --endpoint=127.0.0.1:9809 --kubeconfig /k")) else {
        panic!("parses")
    };
    assert_eq!((r.kind, r.namespace.as_deref(), r.name.as_str()), (Kind::Claim, Some("ns"), "data"));
    assert_eq!(r.endpoints, ["127.0.0.1:8080", "127.0.0.1:9809"]);
    assert_eq!(r.kubeconfig.as_deref(), Some("/k"));
    let Parsed::Run(r) = parse(&args("va csi-abc")) else { panic!() };
    assert_eq!((r.kind, r.namespace, r.name.as_str()), (Kind::Attachment, None, "csi-abc"));
    let Parsed::Run(r) = parse(&args("volumesnapshot ns/s")) else { panic!() };
    assert_eq!(r.kind, Kind::Snapshot);
    for (bad, says) in [
        ("pvc data", "want NAMESPACE/NAME for a PersistentVolumeClaim"),
        ("pod ns/x", "unknown kind \"pod\""),
        ("pvc", "want KIND and NAME, got 1 arguments"),
        ("va ns/x", "a VolumeAttachment has no namespace"),
        ("pvc ns/x --endpoint", "flag --endpoint needs a value"),
        ("pvc ns/x --endpoint 8080", "--endpoint \"8080\""),
        ("pvc ns/x --frob 1", "unknown flag --frob"),
        ("pvc ns/x/y", "want NAMESPACE/NAME"),
    ] {
        match parse(&args(bad)) {
            Parsed::Exit(2, text) => assert!(text.contains(says), "{bad}: {text}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(matches!(parse(&args("--help")), Parsed::Exit(0, _)));
}

#[test]
fn rendering() {
    let req = Request {
        kind: Kind::Claim,
        namespace: Some("ns".into()),
        name: "data".into(),
        endpoints: vec![],
        kubeconfig: None,
    };
    let v = Verdict { done: false, lines: vec!["a".into(), "b".into()] };
    assert_eq!(render(&req, &v), "PersistentVolumeClaim ns/data: waiting\n  - a\n  - b\n");
}

#[test]
fn a_module_not_running_yet_or_not_here_is_said() {
    let with = |module: &str, phase: Phase, driver: Option<&str>| {
        Sidecar::Pages(vec![Page {
            driver: driver.map(str::to_string),
            modules: vec![ModuleView { module: module.into(), leader: None, not_done: 0, phase }],
            matching: 0,
            objects: vec![],
            after: None,
        }])
    };
    let ours = class("hostpath.csi.k8s.io", false);
    let lines = |s: Sidecar| decide::claim(&pending("ns/data"), &ours, &s, &[]).lines;
    assert_eq!(
        lines(with("provisioner", Phase::Starting, None)),
        [
            "csi-sidecar's provisioner is still starting: it waits for its CSI driver to answer (no driver discovered yet)"
        ]
    );
    assert_eq!(
        lines(with("provisioner", Phase::SyncingCache, Some("hostpath.csi.k8s.io"))),
        ["csi-sidecar's provisioner is filling its cache from the API; it acts on objects once that is done"]
    );
    assert_eq!(
        lines(with("attacher", Phase::Running, Some("hostpath.csi.k8s.io"))),
        ["the csi-sidecar asked does not run the provisioner module: give the --endpoint of the one that does"]
    );
    let running = lines(with("provisioner", Phase::Running, Some("hostpath.csi.k8s.io")));
    assert_eq!(running, ["csi-sidecar holds nothing for it: provisioning has not failed; it is queued or in progress"]);
}
