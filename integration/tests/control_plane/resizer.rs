//! resizer against the real kube-apiserver (its PVC resize validation and
//! status subresource), the real PV binder and attach-detach controllers and
//! the real CSI mock driver, in one csi-sidecar process with the provisioner
//! (and the attacher for the offline-expansion test).

use std::{path::PathBuf, time::Duration};

use csi_sidecar_integration::{
    cluster::ControlPlane,
    component_bin,
    kube_support::{TestNamespace, create, csi_node, node, pod, pvc, storage_class, unique_name, wait_for},
    process::Proc,
    sidecar_bin, wait_until,
};
use k8s_openapi::api::{
    core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::{CSINode, StorageClass},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};

const T: Duration = Duration::from_secs(60);
const ANN_NOT_REQUIRED: &str = "volume.kubernetes.io/node-expansion-not-required";
const ANN_PRE_RESIZE: &str = "volume.alpha.kubernetes.io/pre-resize-capacity";

struct Setup {
    driver_name: String,
    node: String,
    driver: Proc,
    sidecar: Proc,
    ns: TestNamespace,
    sc: String,
    /// Last: the processes (and their logs, printed on failure) go first.
    _dir: tempfile::TempDir,
}

impl Setup {
    /// The mock driver with `driver_args`, and `modules` (each with its
    /// fast-retry flags) in one csi-sidecar process.
    async fn start(prefix: &str, driver_args: &[&str], modules: &[&str]) -> Setup {
        let cp = ControlPlane::shared();
        let client = cp.client().await;
        let ns = TestNamespace::new(&client, prefix).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let driver_name = format!("{}.csi.example.com", unique_name("rsz"));
        let node_name = ns.scoped("node");
        let csi: PathBuf = dir.path().join("csi.sock");
        let mut args = vec![
            format!("--endpoint=unix://{}", csi.display()),
            format!("--name={driver_name}"),
            format!("--node-id={node_name}"),
        ];
        args.extend(driver_args.iter().map(|s| s.to_string()));
        let driver = Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &args, dir.path());
        let sc = ns.scoped("sc");
        let mut class = storage_class(&sc, &driver_name);
        class.allow_volume_expansion = Some(true);
        create(&Api::<StorageClass>::all(client.clone()), &class).await;
        let mut sidecar_args = vec![
            format!("--csi-address={}", csi.display()),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            "-v=5".to_string(),
        ];
        for m in modules {
            sidecar_args.push(m.to_string());
            sidecar_args.extend(["--retry-interval-start=200ms".to_string(), "--retry-interval-max=2s".to_string()]);
        }
        let sidecar = Proc::spawn("csi-sidecar", &sidecar_bin(), &sidecar_args, dir.path());
        Setup { _dir: dir, driver_name, node: node_name, driver, sidecar, ns, sc }
    }

    fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        self.ns.api()
    }

    async fn bound_claim(&self, name: &str, size: &str) -> String {
        create(&self.pvcs(), &pvc(name, Some(&self.sc), size)).await;
        let c = wait_for(&self.pvcs(), name, T, |c| phase(c) == Some("Bound")).await;
        c.spec.and_then(|s| s.volume_name).expect("volumeName")
    }

    async fn request(&self, name: &str, size: &str) -> Result<PersistentVolumeClaim, kube::Error> {
        let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": size}}}});
        self.pvcs().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await
    }

    /// `ControllerExpandVolume` calls the mock driver logged.
    fn expand_calls(&self) -> usize {
        self.driver.logs().lines().filter(|l| l.contains("/csi.v1.Controller/ControllerExpandVolume")).count()
    }

    /// Every event of the test's namespace with `reason`.
    async fn events_with_reason(&self, reason: &str) -> Vec<Event> {
        let api: Api<Event> = self.ns.api();
        let events = api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        events.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect()
    }

    /// Events on the claim `name` with `reason`: (source component, message, count).
    async fn events(&self, name: &str, reason: &str) -> Vec<(String, String, i32)> {
        self.events_with_reason(reason)
            .await
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| {
                let component = e.source.and_then(|s| s.component).unwrap_or_default();
                (component, e.message.unwrap_or_default(), e.count.unwrap_or(1))
            })
            .collect()
    }

    async fn wait_event(&self, name: &str, reason: &str) -> Vec<(String, String, i32)> {
        wait_until(&format!("event {reason} on {name}"), T, async || {
            let e = self.events(name, reason).await;
            (!e.is_empty(), e)
        })
        .await
    }
}

fn phase(c: &PersistentVolumeClaim) -> Option<&str> {
    c.status.as_ref()?.phase.as_deref()
}

fn capacity(c: &PersistentVolumeClaim) -> Option<String> {
    Some(c.status.as_ref()?.capacity.as_ref()?.get("storage")?.0.clone())
}

fn pv_capacity(pv: &PersistentVolume) -> Option<String> {
    Some(pv.spec.as_ref()?.capacity.as_ref()?.get("storage")?.0.clone())
}

/// The claim's condition types that resizing and modifying write. Others
/// are not the resizer's: Kubernetes 1.38 adds `Unused` (set by
/// kube-controller-manager), which the resizer leaves alone.
fn condition_types(c: &PersistentVolumeClaim) -> Vec<String> {
    const NOT_OURS: [&str; 1] = ["Unused"];
    c.status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.type_)
        .filter(|t| !NOT_OURS.contains(&t.as_str()))
        .collect()
}

fn allocation_state(c: &PersistentVolumeClaim) -> Option<String> {
    c.status.as_ref()?.allocated_resource_statuses.as_ref()?.get("storage").cloned()
}

#[tokio::test]
async fn a_bound_claim_is_expanded_end_to_end_with_one_call() {
    let s = Setup::start("rsz-e2e", &[], &["provisioner", "resizer"]).await;
    let pv_name = s.bound_claim("data", "1Mi").await;
    // Below the current size: the apiserver refuses, nothing reaches the driver.
    let err = s.request("data", "512Ki").await.expect_err("a request below the capacity is invalid");
    assert!(err.to_string().contains("less than"), "{err}");
    s.request("data", "2Mi").await.expect("request 2Mi");
    let c = wait_for(&s.pvcs(), "data", T, |c| capacity(c).as_deref() == Some("2Mi")).await;
    let pv = wait_for(&Api::<PersistentVolume>::all(s.ns.client().clone()), &pv_name, T, |p| {
        pv_capacity(p).as_deref() == Some("2Mi")
    })
    .await;
    assert!(condition_types(&c).is_empty(), "resize conditions removed: {:?}", condition_types(&c));
    assert_eq!(allocation_state(&c), None, "allocation state removed");
    let st = c.status.as_ref().unwrap();
    assert_eq!(st.allocated_resources.as_ref().and_then(|a| a.get("storage")).map(|q| q.0.as_str()), Some("2Mi"));
    let ann = c.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(ann.get(ANN_NOT_REQUIRED).map(String::as_str), Some("true"));
    assert!(!pv.metadata.annotations.unwrap_or_default().contains_key(ANN_PRE_RESIZE));
    let component = format!("external-resizer {}", s.driver_name);
    let ok = s.wait_event("data", "VolumeResizeSuccessful").await;
    assert_eq!(ok[0].0, component);
    assert_eq!(ok[0].1, "Resize volume succeeded");
    let resizing = s.wait_event("data", "Resizing").await;
    assert_eq!(resizing[0].1, format!("External resizer is resizing volume {pv_name}"));
    assert_eq!(resizing.iter().map(|e| e.2).sum::<i32>(), 1, "one Resizing event");
    assert_eq!(s.expand_calls(), 1, "exactly one ControllerExpandVolume:\n{}", s.driver.logs());
    // The sidecar's Lease-free run served the resize; its logs name the queue.
    assert!(s.sidecar.logs().contains("Resizer starting"), "{}", s.sidecar.logs());
}

#[tokio::test]
async fn node_expansion_required_leaves_the_claim_to_the_kubelet() {
    let s = Setup::start("rsz-node", &["--node-expand-required"], &["provisioner", "resizer"]).await;
    let pv_name = s.bound_claim("data", "1Mi").await;
    s.request("data", "2Mi").await.expect("request 2Mi");
    let c = wait_for(&s.pvcs(), "data", T, |c| allocation_state(c).as_deref() == Some("NodeResizePending")).await;
    // Upstream keeps the other resize conditions (Resizing) beside it.
    assert_eq!(condition_types(&c), ["Resizing", "FileSystemResizePending"]);
    let conds = c.status.as_ref().unwrap().conditions.as_ref().unwrap();
    let cond = conds.iter().find(|x| x.type_ == "FileSystemResizePending").expect("FileSystemResizePending");
    assert_eq!(
        cond.message.as_deref(),
        Some("Waiting for user to (re-)start a pod to finish file system resize of volume on node.")
    );
    assert_eq!(capacity(&c).as_deref(), Some("1Mi"), "the kubelet sets the capacity");
    assert!(!c.metadata.annotations.unwrap_or_default().contains_key(ANN_NOT_REQUIRED));
    let pv = Api::<PersistentVolume>::all(s.ns.client().clone()).get(&pv_name).await.expect("pv");
    assert_eq!(pv_capacity(&pv).as_deref(), Some("2Mi"));
    assert_eq!(pv.metadata.annotations.unwrap_or_default().get(ANN_PRE_RESIZE).map(String::as_str), Some("1Mi"));
    let e = s.wait_event("data", "FileSystemResizeRequired").await;
    assert_eq!(e[0].1, "Require file system resize of volume on node");
    assert_eq!(s.expand_calls(), 1, "{}", s.driver.logs());

    // What the kubelet does after NodeExpandVolume: the capacity catches up
    // and the pre-resize annotation goes.
    let status = serde_json::json!({"status": {"capacity": {"storage": "2Mi"}, "conditions": [],
        "allocatedResourceStatuses": null}});
    s.pvcs().patch_status("data", &PatchParams::default(), &Patch::Merge(&status)).await.expect("kubelet's status");
    wait_for(&Api::<PersistentVolume>::all(s.ns.client().clone()), &pv_name, T, |p| {
        !p.metadata.annotations.clone().unwrap_or_default().contains_key(ANN_PRE_RESIZE)
    })
    .await;
}

#[tokio::test]
async fn offline_only_driver_waits_until_no_pod_uses_the_claim() {
    let s = Setup::start("rsz-offline", &["--disable-online-expansion"], &["provisioner", "attacher", "resizer"]).await;
    let client = s.ns.client().clone();
    create(&Api::<Node>::all(client.clone()), &node(&s.node, &[])).await;
    create(&Api::<CSINode>::all(client.clone()), &csi_node(&s.node, &s.driver_name, &s.node, &[])).await;
    let pv_name = s.bound_claim("data", "1Mi").await;
    create(&s.ns.api(), &pod("app", &s.node, "data")).await;
    // The attach-detach controller attaches it; the attacher publishes it.
    wait_until("the volume attached", T, async || {
        let vas = Api::<k8s_openapi::api::storage::v1::VolumeAttachment>::all(client.clone());
        let attached = vas.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default().iter().any(|v| {
            v.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str())
                && v.status.as_ref().is_some_and(|s| s.attached)
        });
        (attached, ())
    })
    .await;
    s.request("data", "2Mi").await.expect("request 2Mi");
    // The first call fails (volume published, offline only); from then on
    // the claim is held back while the pod exists.
    let text = format!(
        "Unable to expand {}/data because CSI driver {} only supports offline expansion and volume is currently in-use",
        s.ns.name(),
        s.driver_name
    );
    wait_until("the in-use event seen twice", T, async || {
        let e = s.events("data", "VolumeResizeFailed").await;
        let n: i32 = e.iter().filter(|e| e.1 == text).map(|e| e.2).sum();
        (n >= 2, e)
    })
    .await;
    assert_eq!(s.expand_calls(), 1, "no call while the pod uses the claim:\n{}", s.driver.logs());
    let pods: Api<Pod> = s.ns.api();
    pods.delete("app", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .expect("delete pod");
    let c = wait_for(&s.pvcs(), "data", T, |c| capacity(c).as_deref() == Some("2Mi")).await;
    assert!(condition_types(&c).is_empty(), "{:?}", condition_types(&c));
    assert!(s.expand_calls() >= 2);
    assert!(s.sidecar.logs().contains("watch_pods=true"), "the pod watch is started for this driver");
}

#[tokio::test]
async fn an_online_driver_does_not_watch_pods() {
    let s = Setup::start("rsz-nopods", &[], &["resizer"]).await;
    wait_until("resizer caches synced", T, async || {
        let logs = s.sidecar.logs();
        (logs.contains("Caches synced; resizing"), logs)
    })
    .await;
    let logs = s.sidecar.logs();
    assert!(logs.contains("watch_pods=false"), "{logs}");
    assert!(logs.contains("v1/PersistentVolumeClaim"), "the claim watch is logged: {logs}");
    assert!(!logs.contains("v1/Pod"), "no Pod watch: {logs}");
}

#[tokio::test]
async fn a_node_only_driver_gets_the_trivial_resizer_without_a_call() {
    let s = Setup::start(
        "rsz-trivial",
        &["--disable-controller-expansion", "--node-expand-required"],
        &["provisioner", "resizer"],
    )
    .await;
    let pv_name = s.bound_claim("data", "1Mi").await;
    s.request("data", "2Mi").await.expect("request 2Mi");
    let c = wait_for(&s.pvcs(), "data", T, |c| allocation_state(c).as_deref() == Some("NodeResizePending")).await;
    assert!(condition_types(&c).contains(&"FileSystemResizePending".to_string()));
    let pv = Api::<PersistentVolume>::all(s.ns.client().clone()).get(&pv_name).await.expect("pv");
    assert_eq!(pv_capacity(&pv).as_deref(), Some("2Mi"));
    s.wait_event("data", "FileSystemResizeRequired").await;
    assert_eq!(s.expand_calls(), 0, "the trivial resizer calls nothing:\n{}", s.driver.logs());
    assert!(s.sidecar.logs().contains("using trivial resizer"), "{}", s.sidecar.logs());
}

/// The resizer's status patches against the real apiserver's strategic
/// merge of `status.conditions`: each decision (the copy it read, the list
/// it decided on) applied to a live claim that may have changed meanwhile,
/// and the live list that must result. A decision that changes nothing,
/// read from a copy whose condition is gone meanwhile, is the case the
/// apiserver's merge refused with a 500 ("no elements in any of the given
/// slices") while the patch carried the order of the unchanged list.
#[tokio::test]
async fn condition_patches_merge_by_type_on_the_real_apiserver() {
    use csi_sidecar::modules::resizer::conditions::with_conditions;
    use k8s_openapi::api::core::v1::PersistentVolumeClaimCondition as Cond;
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "rsz-conds").await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    let cond = |t: &str| Cond { type_: t.into(), status: "True".into(), ..Default::default() };
    let types = |v: &[&str]| v.iter().map(|t| cond(t)).collect::<Vec<_>>();
    // (what, live before the write, the decision's old copy, its new list, live after)
    type Types = &'static [&'static str];
    let cases: [(&str, Types, Types, Types, Types); 7] = [
        ("nothing decided, gone meanwhile", &[], &["Resizing"], &["Resizing"], &[]),
        ("the last condition removed", &["Resizing"], &["Resizing"], &[], &[]),
        (
            "every condition removed",
            &["Resizing", "FileSystemResizePending"],
            &["Resizing", "FileSystemResizePending"],
            &[],
            &[],
        ),
        (
            "one the kubelet added meanwhile is kept",
            &["Resizing", "NodeResizeError"],
            &["Resizing"],
            &[],
            &["NodeResizeError"],
        ),
        ("already gone meanwhile", &[], &["Resizing"], &[], &[]),
        (
            "replaced by another",
            &["Resizing"],
            &["Resizing"],
            &["FileSystemResizePending"],
            &["FileSystemResizePending"],
        ),
        (
            "added after the kept one",
            &["Resizing"],
            &["Resizing"],
            &["Resizing", "FileSystemResizePending"],
            &["Resizing", "FileSystemResizePending"],
        ),
    ];
    for (i, (what, live, old, new, want)) in cases.into_iter().enumerate() {
        let name = format!("c{i}");
        create(&pvcs, &pvc(&name, Some("none"), "1Mi")).await;
        let before = serde_json::json!({ "status": { "conditions": types(live) } });
        pvcs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&before)).await.expect("live conditions");
        let patch = serde_json::json!({ "status": with_conditions(serde_json::json!({}), &types(old), &types(new)) });
        let written = pvcs
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .unwrap_or_else(|e| panic!("{what}: the apiserver refused {patch}: {e}"));
        assert_eq!(
            condition_types(&written),
            want.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
            "{what}: {patch}"
        );
    }
}

/// Many expansions at once: the watch brings each claim's in-progress write
/// while its sync still runs, so the claim is queued again and may be synced
/// from a cache that has not yet seen the sync's last write. That copy must
/// not be acted on: before the fix its in-progress patch, built against the
/// superseded version, was refused (a 500 from the apiserver's merge, or a
/// conflict), a request wasted per stale sync (5.17 requests per expansion
/// in bench-combined where upstream makes 5).
#[tokio::test]
async fn concurrent_expansions_never_write_from_a_copy_their_own_write_replaced() {
    const N: usize = 20;
    let s = Setup::start("rsz-many", &[], &["provisioner", "resizer"]).await;
    for i in 0..N {
        create(&s.pvcs(), &pvc(&format!("c{i}"), Some(&s.sc), "1Mi")).await;
    }
    for i in 0..N {
        wait_for(&s.pvcs(), &format!("c{i}"), T, |c| phase(c) == Some("Bound")).await;
    }
    futures::future::join_all((0..N).map(|i| {
        let s = &s;
        async move { s.request(&format!("c{i}"), "2Mi").await.expect("request 2Mi") }
    }))
    .await;
    for i in 0..N {
        let c = wait_for(&s.pvcs(), &format!("c{i}"), T, |c| capacity(c).as_deref() == Some("2Mi")).await;
        assert!(condition_types(&c).is_empty(), "c{i}: {:?}", condition_types(&c));
    }
    // Every claim's success write is in. Its event goes out after it, behind
    // the writes the budget puts first, while the re-queue that a stale sync
    // needs came with the in-progress write before it: once every claim has
    // its event, the re-queued syncs have had their chance.
    wait_until("a VolumeResizeSuccessful event per claim", T, async || {
        let events = s.events_with_reason("VolumeResizeSuccessful").await;
        let claims: std::collections::HashSet<_> =
            events.iter().filter_map(|e| e.involved_object.name.as_deref()).collect();
        (claims.len() == N, claims.len())
    })
    .await;
    let logs = s.sidecar.logs();
    for refused in
        ["Marking the resize in progress failed", "Claim changed meanwhile", "Updating the claim status failed"]
    {
        assert!(!logs.contains(refused), "a claim status write was refused ({refused}):\n{logs}");
    }
    assert_eq!(s.expand_calls(), N, "one ControllerExpandVolume per claim:\n{}", s.driver.logs());
}
