//! The provisioner's data sources against the real kube-apiserver, the real
//! PV binder and PVC protection (kube-controller-manager) and the real CSI
//! mock driver: clones with the cloning-protection finalizer on the source,
//! the checks that refuse a clone (upstream's events, no CreateVolume), a
//! populator's kind left alone, and cross-namespace sources (the apiserver
//! of this binary runs with `CrossNamespaceVolumeDataSource`, so
//! `dataSourceRef.namespace` is kept) with and without ReferenceGrants;
//! restores from VolumeSnapshots bound by the real snapshot-controller
//! (pre-provisioned contents whose status the test writes as a snapshotter
//! would), the refused restores, the snapshot-finalizer sweep, and a restore
//! of a snapshot csi-sidecar's own snapshotter module made ready.

use std::{path::PathBuf, sync::OnceLock, time::Duration};

use csi_sidecar_integration::{
    cluster::{ControlPlane, launcher_bin},
    component_bin,
    kube_support::{
        TestNamespace, bound_pv, create, events_for, pvc, storage_class, unique_name, wait_deleted, wait_event,
        wait_for,
    },
    process::Proc,
    symlinked_bin, wait_until,
};
use k8s_openapi::{
    api::core::v1::{PersistentVolume, PersistentVolumeClaim, TypedLocalObjectReference, TypedObjectReference},
    api::storage::v1::StorageClass,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams},
};

const T: Duration = Duration::from_secs(30);
const CLONE_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";

/// This binary's control plane: the snapshot CRDs and the real
/// snapshot-controller, and the apiserver's `CrossNamespaceVolumeDataSource`
/// gate, which the shared one lacks.
fn control_plane() -> &'static ControlPlane {
    static CP: OnceLock<ControlPlane> = OnceLock::new();
    CP.get_or_init(|| {
        ControlPlane::spawn_launcher(
            &launcher_bin(),
            &["--snapshots", "--apiserver-arg", "--feature-gates=CrossNamespaceVolumeDataSource=true"],
        )
        .unwrap_or_else(|e| panic!("starting the control plane failed: {e:#}"))
    })
}

/// The mock driver (requests logged as JSON) and a provisioner serving it.
struct Setup {
    driver_name: String,
    driver: Proc,
    provisioner: Proc,
    // Last: the processes' logs are read (and shown on a failure) before
    // their directory goes.
    _dir: tempfile::TempDir,
}

impl Setup {
    fn start(cp: &ControlPlane, extra: &[&str]) -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        let driver_name = format!("{}.csi.example.com", unique_name("src"));
        let csi: PathBuf = dir.path().join("csi.sock");
        let driver = Proc::spawn(
            "csi-mock-driver",
            &component_bin("csi-mock-driver"),
            &[
                format!("--endpoint=unix://{}", csi.display()),
                format!("--name={driver_name}"),
                "--node-id=node-1".into(),
                "--verbose".into(),
            ],
            dir.path(),
        );
        let mut args = vec![
            format!("--csi-address={}", csi.display()),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            "--retry-interval-start=200ms".to_string(),
            "--retry-interval-max=2s".to_string(),
            "-v=5".to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let provisioner =
            Proc::spawn("csi-provisioner", &symlinked_bin(dir.path(), "csi-provisioner"), &args, dir.path());
        Setup { driver_name, driver, provisioner, _dir: dir }
    }

    /// The requests of every CreateVolume the driver served (as JSON).
    fn create_requests(&self) -> Vec<serde_json::Value> {
        let logs = self.driver.logs();
        let mut out = Vec::new();
        let mut in_create = false;
        for line in logs.lines() {
            if line.contains("/csi.v1.Controller/") {
                in_create = line.contains("/csi.v1.Controller/CreateVolume ->");
            } else if in_create && let Some(json) = line.split_once("request: ").map(|(_, j)| j) {
                out.push(serde_json::from_str(json).unwrap_or_else(|e| panic!("request JSON {json}: {e}")));
            }
        }
        out
    }

    /// CreateVolume requests for the volume named `pv`.
    fn creates_of(&self, pv: &str) -> Vec<serde_json::Value> {
        self.create_requests().into_iter().filter(|r| r["name"] == pv).collect()
    }
}

fn clone_of(name: &str, class: &str, size: &str, source: &str) -> PersistentVolumeClaim {
    let mut c = pvc(name, Some(class), size);
    c.spec.as_mut().expect("spec").data_source =
        Some(TypedLocalObjectReference { api_group: None, kind: "PersistentVolumeClaim".into(), name: source.into() });
    c
}

fn with_ref(
    mut c: PersistentVolumeClaim,
    group: Option<&str>,
    kind: &str,
    name: &str,
    namespace: Option<&str>,
) -> PersistentVolumeClaim {
    c.spec.as_mut().expect("spec").data_source_ref = Some(TypedObjectReference {
        api_group: group.map(Into::into),
        kind: kind.into(),
        name: name.into(),
        namespace: namespace.map(Into::into),
    });
    c
}

fn finalizers(c: &PersistentVolumeClaim) -> Vec<String> {
    c.metadata.finalizers.clone().unwrap_or_default()
}

fn pv_name_of(c: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", c.metadata.uid.as_deref().expect("uid"))
}

#[tokio::test]
async fn clone_carries_the_source_volume_and_protects_the_source_until_no_clone_needs_it() {
    let cp = control_plane();
    let ns = TestNamespace::new(&cp.client().await, "clone").await;
    let s = Setup::start(cp, &[]);
    let classes = Api::<StorageClass>::all(ns.client().clone());
    let sc_name = ns.scoped("sc");
    create(&classes, &storage_class(&sc_name, &s.driver_name)).await;
    // Another class of the same driver: upstream lets a clone change class.
    let other_sc = ns.scoped("other");
    create(&classes, &storage_class(&other_sc, &s.driver_name)).await;
    let late_sc = ns.scoped("late");
    let mut late = storage_class(&late_sc, &s.driver_name);
    late.volume_binding_mode = Some("WaitForFirstConsumer".into());
    create(&classes, &late).await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();

    create(&pvcs, &pvc("src", Some(&sc_name), "2Mi")).await;
    let src_pv = bound_pv(T, &ns, "src").await;
    let handle = src_pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle).expect("handle");

    let clone = create(&pvcs, &clone_of("copy", &other_sc, "3Mi", "src")).await;
    let clone_pv = bound_pv(T, &ns, "copy").await;
    assert_eq!(clone_pv.metadata.name.as_deref(), Some(pv_name_of(&clone).as_str()));
    let creates = s.creates_of(&pv_name_of(&clone));
    assert_eq!(creates.len(), 1, "one CreateVolume for the clone: {creates:?}");
    assert_eq!(creates[0]["volumeContentSource"]["volume"]["volumeId"], handle, "{}", creates[0]);
    wait_event(T, &ns, "copy", "ProvisioningSucceeded", "Successfully provisioned volume").await;

    // The finalizer stays on the source after the clone is provisioned,
    // appended after the admission plugin's, as upstream's provisioner does.
    let src = pvcs.get("src").await.expect("source");
    assert_eq!(finalizers(&src), ["kubernetes.io/pvc-protection", CLONE_FINALIZER]);

    // A second clone that waits for a consumer stays Pending: while it
    // does, the source being deleted keeps the finalizer.
    create(&pvcs, &clone_of("waiting", &late_sc, "2Mi", "src")).await;
    pvcs.delete("src", &DeleteParams::default()).await.expect("delete source");
    let deleting = wait_for(&pvcs, "src", T, |c| c.metadata.deletion_timestamp.is_some()).await;
    assert!(finalizers(&deleting).iter().any(|f| f == CLONE_FINALIZER));
    // Proof the controller looked at it and kept it.
    wait_until("the cloning-protection controller keeps the source", T, async || {
        let logs = s.provisioner.logs();
        (logs.contains("Clone source still needed"), ())
    })
    .await;
    let still = pvcs.get("src").await.expect("source still there");
    assert!(finalizers(&still).iter().any(|f| f == CLONE_FINALIZER), "{:?}", finalizers(&still));

    // No Pending clone left: the finalizer goes, and so does the source.
    pvcs.delete("waiting", &DeleteParams::default()).await.expect("delete waiting clone");
    wait_deleted(&pvcs, "src", T).await;
    // By this provisioner (its log line follows the write the test saw).
    wait_until("the provisioner logs the release", T, async || {
        (s.provisioner.logs().contains("Removed the cloning-protection finalizer"), ())
    })
    .await;
    // The clone's volume is its own.
    assert!(pvcs.get("copy").await.is_ok());
    ns.delete().await;
}

#[tokio::test]
async fn refused_clones_get_upstreams_events_and_no_create_volume() {
    let cp = control_plane();
    let ns = TestNamespace::new(&cp.client().await, "refuse").await;
    let other_ns = TestNamespace::new(&cp.client().await, "refuse-src").await;
    let s = Setup::start(cp, &[]);
    let classes = Api::<StorageClass>::all(ns.client().clone());
    let sc_name = ns.scoped("sc");
    create(&classes, &storage_class(&sc_name, &s.driver_name)).await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    create(&pvcs, &pvc("src", Some(&sc_name), "2Mi")).await;
    bound_pv(T, &ns, "src").await;
    // A claim bound to a static volume of another driver.
    let foreign_pv = ns.scoped("foreign");
    let mut pv = csi_sidecar_integration::kube_support::csi_pv(&foreign_pv, "other.csi.example.com", "h-1", "2Mi");
    pv.spec.as_mut().expect("spec").storage_class_name = Some(sc_name.clone());
    create(&Api::<PersistentVolume>::all(ns.client().clone()), &pv).await;
    let mut foreign = pvc("foreign", Some(&sc_name), "2Mi");
    foreign.spec.as_mut().expect("spec").volume_name = Some(foreign_pv.clone());
    create(&pvcs, &foreign).await;
    bound_pv(T, &ns, "foreign").await;

    let smaller = create(&pvcs, &clone_of("smaller", &sc_name, "1Mi", "src")).await;
    let mut block = clone_of("block", &sc_name, "2Mi", "src");
    block.spec.as_mut().expect("spec").volume_mode = Some("Block".into());
    let block = create(&pvcs, &block).await;
    let across = create(&pvcs, &clone_of("across", &sc_name, "2Mi", "foreign")).await;
    let missing = create(&pvcs, &clone_of("missing", &sc_name, "2Mi", "nope")).await;
    let cross = create(
        &pvcs,
        &with_ref(pvc("cross", Some(&sc_name), "2Mi"), None, "PersistentVolumeClaim", "src", Some(other_ns.name())),
    )
    .await;
    let populated =
        create(&pvcs, &with_ref(pvc("populated", Some(&sc_name), "2Mi"), Some("example.com"), "Backup", "b", None))
            .await;

    // Reported as upstream's provisioning library does: without a StorageClass prefix.
    let handle = |kind: &str, name: &str| format!("error getting handle for DataSource Type {kind} by Name {name}: ");
    wait_event(T,
        &ns,
        "smaller",
        "ProvisioningFailed",
        &format!("{}error, new PVC request must be greater than or equal in size to the specified PVC data source, requested 1048576 but source is 2097152", handle("PersistentVolumeClaim", "src")),
    )
    .await;
    wait_event(T,
        &ns,
        "block",
        "ProvisioningFailed",
        &format!("{}the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block", handle("PersistentVolumeClaim", "src")),
    )
    .await;
    wait_event(
        T,
        &ns,
        "across",
        "ProvisioningFailed",
        &format!("{}claim in dataSource not bound or invalid", handle("PersistentVolumeClaim", "foreign")),
    )
    .await;
    wait_event(
        T,
        &ns,
        "missing",
        "ProvisioningFailed",
        &format!(
            "{}error getting PVC nope (namespace \"{}\") from api server: persistentvolumeclaim \"nope\" not found",
            handle("PersistentVolumeClaim", "nope"),
            ns.name()
        ),
    )
    .await;
    wait_event(
        T,
        &ns,
        "cross",
        "ProvisioningFailed",
        "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled",
    )
    .await;
    wait_event(T, &ns, "populated", "Provisioning", "Assuming an external populator will provision the volume").await;
    // Retried (a refusal is not final): a second attempt proves the system
    // had the chance to call the driver, and did not.
    wait_until("the refused clones are retried", T, async || {
        let evs = events_for(&ns, "smaller").await;
        let count = evs
            .iter()
            .filter(|e| e.reason.as_deref() == Some("ProvisioningFailed"))
            .map(|e| e.count.unwrap_or(1))
            .sum::<i32>();
        (count >= 2, count)
    })
    .await;
    for c in [&smaller, &block, &across, &missing, &cross, &populated] {
        assert_eq!(s.creates_of(&pv_name_of(c)), Vec::<serde_json::Value>::new(), "{:?}", c.metadata.name);
    }
    // The populator's claim is left alone: no failure event, still Pending.
    let evs = events_for(&ns, "populated").await;
    assert!(evs.iter().all(|e| e.reason.as_deref() != Some("ProvisioningFailed")), "{evs:?}");
    let populated = pvcs.get("populated").await.expect("populated");
    assert_eq!(populated.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    // A refused clone put no finalizer on a source.
    let foreign = pvcs.get("foreign").await.expect("foreign");
    assert!(!finalizers(&foreign).iter().any(|f| f == CLONE_FINALIZER), "{:?}", finalizers(&foreign));
    assert!(!s.provisioner.logs().contains("panicked"), "{}", s.provisioner.logs());
    ns.delete().await;
    other_ns.delete().await;
}

/// The ReferenceGrant CRD, as much of it as the test needs (Gateway API's
/// schema is not needed to store and serve grants).
fn reference_grant_crd() -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "referencegrants.gateway.networking.k8s.io",
                     "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/1538"}},
        "spec": {
            "group": "gateway.networking.k8s.io",
            "names": {"kind": "ReferenceGrant", "listKind": "ReferenceGrantList", "plural": "referencegrants", "singular": "referencegrant"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1beta1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .expect("CRD")
}

#[tokio::test]
async fn cross_namespace_clone_needs_a_reference_grant() {
    let cp = control_plane();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "xns").await;
    let src_ns = TestNamespace::new(&client, "xns-src").await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.create(&Default::default(), &reference_grant_crd()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create the ReferenceGrant CRD: {e}"),
    }
    wait_for(&crds, "referencegrants.gateway.networking.k8s.io", T, |c| {
        c.status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| c.type_ == "Established" && c.status == "True")
    })
    .await;
    let s = Setup::start(cp, &["--feature-gates=CrossNamespaceVolumeDataSource=true"]);
    let sc_name = ns.scoped("sc");
    create(&Api::<StorageClass>::all(client.clone()), &storage_class(&sc_name, &s.driver_name)).await;
    let src_claims: Api<PersistentVolumeClaim> = src_ns.api();
    create(&src_claims, &pvc("src", Some(&sc_name), "2Mi")).await;
    let src_pv = bound_pv(T, &src_ns, "src").await;
    let handle = src_pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle).expect("handle");

    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    let cross = create(
        &pvcs,
        &with_ref(pvc("cross", Some(&sc_name), "2Mi"), None, "PersistentVolumeClaim", "src", Some(src_ns.name())),
    )
    .await;
    wait_event(
        T,
        &ns,
        "cross",
        "ProvisioningFailed",
        &format!(
            "accessing {}/src of PersistentVolumeClaim dataSource from {}/cross isn't allowed",
            src_ns.name(),
            ns.name()
        ),
    )
    .await;
    assert!(s.creates_of(&pv_name_of(&cross)).is_empty());

    let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1beta1", "ReferenceGrant");
    let grants: Api<DynamicObject> = Api::namespaced_with(client.clone(), src_ns.name(), &ApiResource::from_gvk(&gvk));
    let grant: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
        "metadata": {"name": "clones"},
        "spec": {"from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": ns.name()}],
                 "to": [{"group": "", "kind": "PersistentVolumeClaim", "name": "src"}]}
    }))
    .expect("grant");
    create(&grants, &grant).await;
    bound_pv(T, &ns, "cross").await;
    let creates = s.creates_of(&pv_name_of(&cross));
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert_eq!(creates[0]["volumeContentSource"]["volume"]["volumeId"], handle);
    let src = src_claims.get("src").await.expect("source");
    assert!(finalizers(&src).iter().any(|f| f == CLONE_FINALIZER), "{:?}", finalizers(&src));
    ns.delete().await;
    src_ns.delete().await;
}

const SNAPSHOT_FINALIZER: &str = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";

fn snapshot_api(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind))
}

fn snapshot_obj(kind: &str, mut v: serde_json::Value) -> DynamicObject {
    v["apiVersion"] = "snapshot.storage.k8s.io/v1".into();
    v["kind"] = kind.into();
    serde_json::from_value(v).expect("object")
}

/// A pre-provisioned VolumeSnapshotContent of `driver` (snapshot handle
/// `handle`, taken of a Filesystem volume) and the VolumeSnapshot `name`
/// bound to it; `ready`: its status as a snapshotter would write it (the
/// snapshot-controller copies it to the snapshot). Returns the content's name.
async fn snapshot(ns: &TestNamespace, driver: &str, name: &str, handle: &str, ready: Option<i64>) -> String {
    let client = ns.client().clone();
    let contents: Api<DynamicObject> = Api::all_with(client.clone(), &snapshot_api("VolumeSnapshotContent"));
    let snapshots: Api<DynamicObject> = Api::namespaced_with(client, ns.name(), &snapshot_api("VolumeSnapshot"));
    let content = ns.scoped(&format!("content-{name}"));
    let spec = serde_json::json!({
        "metadata": {"name": content},
        "spec": {"deletionPolicy": "Retain", "driver": driver, "source": {"snapshotHandle": handle},
                 "sourceVolumeMode": "Filesystem", "volumeSnapshotRef": {"name": name, "namespace": ns.name()}}
    });
    create(&contents, &snapshot_obj("VolumeSnapshotContent", spec)).await;
    if let Some(size) = ready {
        let status = serde_json::json!({"status": {"snapshotHandle": handle, "readyToUse": true, "restoreSize": size}});
        contents.patch_status(&content, &PatchParams::default(), &Patch::Merge(&status)).await.expect("content status");
    }
    let snap =
        serde_json::json!({"metadata": {"name": name}, "spec": {"source": {"volumeSnapshotContentName": content}}});
    create(&snapshots, &snapshot_obj("VolumeSnapshot", snap)).await;
    // Bound by the snapshot-controller (and, when ready, marked so).
    wait_for(&snapshots, name, T, |s| {
        s.data["status"]["boundVolumeSnapshotContentName"] == content.as_str()
            && (ready.is_none() || s.data["status"]["readyToUse"] == true)
    })
    .await;
    content
}

fn restore_of(name: &str, class: &str, size: &str, snapshot: &str) -> PersistentVolumeClaim {
    let mut c = pvc(name, Some(class), size);
    c.spec.as_mut().expect("spec").data_source = Some(TypedLocalObjectReference {
        api_group: Some("snapshot.storage.k8s.io".into()),
        kind: "VolumeSnapshot".into(),
        name: snapshot.into(),
    });
    c
}

fn dyn_finalizers(o: &DynamicObject) -> Vec<String> {
    o.metadata.finalizers.clone().unwrap_or_default()
}

#[tokio::test]
async fn restores_from_a_ready_snapshot_and_refuses_what_upstream_refuses() {
    let cp = control_plane();
    let ns = TestNamespace::new(&cp.client().await, "restore").await;
    let s = Setup::start(cp, &[]);
    let sc_name = ns.scoped("sc");
    create(&Api::<StorageClass>::all(ns.client().clone()), &storage_class(&sc_name, &s.driver_name)).await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    // The mock driver starts with snapshots "1".."3".
    let content = snapshot(&ns, &s.driver_name, "ready", "1", Some(2 << 20)).await;
    snapshot(&ns, &s.driver_name, "unready", "2", None).await;

    let restored = create(&pvcs, &restore_of("restored", &sc_name, "2Mi", "ready")).await;
    bound_pv(T, &ns, "restored").await;
    let creates = s.creates_of(&pv_name_of(&restored));
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert_eq!(creates[0]["volumeContentSource"]["snapshot"]["snapshotId"], "1", "{}", creates[0]);
    // The provisioner's finalizer is gone once the PV exists.
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(ns.client().clone(), ns.name(), &snapshot_api("VolumeSnapshot"));
    wait_for(&snapshots, "ready", T, |o| !dyn_finalizers(o).iter().any(|f| f == SNAPSHOT_FINALIZER)).await;

    let handle = |name: &str| format!("error getting handle for DataSource Type VolumeSnapshot by Name {name}: ");
    let unready = create(&pvcs, &restore_of("from-unready", &sc_name, "2Mi", "unready")).await;
    let smaller = create(&pvcs, &restore_of("smaller", &sc_name, "1Mi", "ready")).await;
    let mut block = restore_of("block", &sc_name, "2Mi", "ready");
    block.spec.as_mut().expect("spec").volume_mode = Some("Block".into());
    let block = create(&pvcs, &block).await;
    wait_event(
        T,
        &ns,
        "from-unready",
        "ProvisioningFailed",
        &format!("{}snapshot unready is not Ready", handle("unready")),
    )
    .await;
    wait_event(
        T,
        &ns,
        "smaller",
        "ProvisioningFailed",
        &format!(
            "{}requested volume size 1048576 is less than the size 2097152 for the source snapshot ready",
            handle("ready")
        ),
    )
    .await;
    wait_event(T,
        &ns,
        "block",
        "ProvisioningFailed",
        &format!(
            "{}requested volume {}/block modifies the mode of the source volume but does not have permission to do so. \
             snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent {content}",
            handle("ready"),
            ns.name()
        ),
    )
    .await;
    // Retried refusals: the system had the chance to call the driver.
    wait_until("the refused restores are retried", T, async || {
        let evs = events_for(&ns, "smaller").await;
        let count = evs
            .iter()
            .filter(|e| e.reason.as_deref() == Some("ProvisioningFailed"))
            .map(|e| e.count.unwrap_or(1))
            .sum::<i32>();
        (count >= 2, count)
    })
    .await;
    for c in [&unready, &smaller, &block] {
        assert_eq!(s.creates_of(&pv_name_of(c)), Vec::<serde_json::Value>::new(), "{:?}", c.metadata.name);
    }
    // While they wait, the snapshot they name keeps the provisioner's
    // finalizer only if a restore got as far as protecting it: these did not.
    let ready = snapshots.get("ready").await.expect("snapshot");
    assert!(!dyn_finalizers(&ready).iter().any(|f| f == SNAPSHOT_FINALIZER), "{:?}", dyn_finalizers(&ready));
    ns.delete().await;
}

/// Two claims restore from one snapshot: the first one's PV being saved
/// does not release the snapshot while the other still waits for its
/// volume (upstream drops the finalizer after any one restore); once no
/// claim needs it, the sweep does.
#[tokio::test]
async fn a_snapshot_keeps_its_protection_while_another_restore_waits() {
    let cp = control_plane();
    let ns = TestNamespace::new(&cp.client().await, "restore2").await;
    let s = Setup::start(cp, &["--snapshot-orphan-sweep-interval=1s"]);
    let classes = Api::<StorageClass>::all(ns.client().clone());
    let sc_name = ns.scoped("sc");
    create(&classes, &storage_class(&sc_name, &s.driver_name)).await;
    let late_sc = ns.scoped("late");
    let mut late = storage_class(&late_sc, &s.driver_name);
    late.volume_binding_mode = Some("WaitForFirstConsumer".into());
    create(&classes, &late).await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    snapshot(&ns, &s.driver_name, "shared", "1", Some(1 << 20)).await;
    // The second restore waits for a consumer (none comes): Pending.
    create(&pvcs, &restore_of("waiting", &late_sc, "1Mi", "shared")).await;
    let restored = create(&pvcs, &restore_of("restored", &sc_name, "1Mi", "shared")).await;
    bound_pv(T, &ns, "restored").await;
    assert_eq!(s.creates_of(&pv_name_of(&restored)).len(), 1);
    // The success event follows the release decision.
    wait_event(T, &ns, "restored", "ProvisioningSucceeded", "Successfully provisioned volume").await;
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(ns.client().clone(), ns.name(), &snapshot_api("VolumeSnapshot"));
    let shared = snapshots.get("shared").await.expect("snapshot");
    assert!(
        dyn_finalizers(&shared).iter().any(|f| f == SNAPSHOT_FINALIZER),
        "the waiting restore still needs the snapshot: {:?}",
        dyn_finalizers(&shared)
    );
    // No claim needs it any more: the sweep releases it.
    pvcs.delete("waiting", &DeleteParams::default()).await.expect("delete the waiting restore");
    wait_for(&snapshots, "shared", T, |o| !dyn_finalizers(o).iter().any(|f| f == SNAPSHOT_FINALIZER)).await;
    ns.delete().await;
}

#[tokio::test]
async fn the_sweep_removes_orphaned_snapshot_finalizers_only() {
    let cp = control_plane();
    let ns = TestNamespace::new(&cp.client().await, "sweep").await;
    let s = Setup::start(cp, &["--snapshot-orphan-sweep-interval=1s"]);
    let late_sc = ns.scoped("late");
    let mut late = storage_class(&late_sc, &s.driver_name);
    late.volume_binding_mode = Some("WaitForFirstConsumer".into());
    create(&Api::<StorageClass>::all(ns.client().clone()), &late).await;
    snapshot(&ns, &s.driver_name, "orphan", "1", Some(1 << 20)).await;
    snapshot(&ns, &s.driver_name, "needed", "2", Some(1 << 20)).await;
    // A restore waiting for a consumer needs "needed".
    create(&ns.api::<PersistentVolumeClaim>(), &restore_of("waiting", &late_sc, "1Mi", "needed")).await;
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(ns.client().clone(), ns.name(), &snapshot_api("VolumeSnapshot"));
    // The needed one first: the sweep that clears the orphan's finalizer
    // saw both (one watch delivers changes in order).
    for name in ["needed", "orphan"] {
        let current = snapshots.get(name).await.expect("snapshot");
        let mut finalizers = dyn_finalizers(&current);
        finalizers.push(SNAPSHOT_FINALIZER.into());
        let patch = serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": current.metadata.resource_version}});
        snapshots.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("add finalizer");
    }
    wait_for(&snapshots, "orphan", T, |o| !dyn_finalizers(o).iter().any(|f| f == SNAPSHOT_FINALIZER)).await;
    wait_until("the provisioner logs the orphan's release", T, async || {
        (s.provisioner.logs().contains("Removed an orphaned snapshot source finalizer"), ())
    })
    .await;
    let needed = snapshots.get("needed").await.expect("snapshot");
    assert!(dyn_finalizers(&needed).iter().any(|f| f == SNAPSHOT_FINALIZER), "{:?}", dyn_finalizers(&needed));
    assert!(!s.provisioner.logs().contains(&format!("snapshot={}/needed", ns.name())), "{}", s.provisioner.logs());
    ns.delete().await;
}

/// The whole restore flow with csi-sidecar's own snapshotter: a snapshot of
/// a bound claim (the snapshot-controller creates the content, the
/// snapshotter module calls CreateSnapshot and makes it ready), restored
/// into a new claim whose CreateVolume carries the snapshot's handle.
#[tokio::test]
async fn restores_a_snapshot_taken_by_the_snapshotter_module() {
    use csi_sidecar_integration::snapshots::SnapApis;
    let cp = control_plane();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "snapflow").await;
    let s = Setup::start(cp, &[]);
    let snapshotter = Proc::spawn(
        "csi-snapshotter",
        &symlinked_bin(s._dir.path(), "csi-snapshotter"),
        &[
            format!("--csi-address={}", s._dir.path().join("csi.sock").display()),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            "-v=5".to_string(),
        ],
        s._dir.path(),
    );
    let sc_name = ns.scoped("sc");
    create(&Api::<StorageClass>::all(client.clone()), &storage_class(&sc_name, &s.driver_name)).await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    create(&pvcs, &pvc("src", Some(&sc_name), "2Mi")).await;
    bound_pv(T, &ns, "src").await;
    let snaps = SnapApis::new(&client, ns.name());
    let snap_class = ns.scoped("snapclass");
    snaps.class(&snap_class, &s.driver_name, "Delete", serde_json::Value::Null).await;
    let content_name = snaps.snapshot_of("snap", &snap_class, "src").await;
    snaps.wait_snapshot_ready("snap", Duration::from_secs(60)).await;
    let content = snaps.wait_content_ready(&content_name, T).await;
    let handle = content.data["status"]["snapshotHandle"].as_str().expect("snapshot handle").to_string();
    assert!(snapshotter.logs().contains("CreateSnapshot"), "{}", snapshotter.logs());

    let restored = create(&pvcs, &restore_of("restored", &sc_name, "2Mi", "snap")).await;
    bound_pv(T, &ns, "restored").await;
    let creates = s.creates_of(&pv_name_of(&restored));
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert_eq!(creates[0]["volumeContentSource"]["snapshot"]["snapshotId"], handle.as_str(), "{}", creates[0]);
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns.name(), &snapshot_api("VolumeSnapshot"));
    wait_for(&snapshots, "snap", T, |o| !dyn_finalizers(o).iter().any(|f| f == SNAPSHOT_FINALIZER)).await;
    ns.delete().await;
}
