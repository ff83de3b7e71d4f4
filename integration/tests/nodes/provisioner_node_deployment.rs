//! `provisioner --node-deployment` on three real nodes: the real
//! kube-scheduler and three hollow kubelets (`cluster serve --nodes 3`), the
//! real PV binder, and on each node a CSI mock driver reporting that node as
//! its topology (`--topology-value`) with a csi-sidecar provisioner next to
//! it (`NODE_NAME` = the node). Every driver logs the requests it served
//! (`--verbose`), so the test knows which instance created and deleted what.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::OnceLock,
    time::Duration,
};

use csi_sidecar_integration::{
    cluster::{ControlPlane, launcher_bin},
    component_bin,
    kube_support::{NEVER_PULLED_IMAGE, TestNamespace, create, pvc, storage_class, unique_name, wait_deleted},
    process::Proc,
    sidecar_bin, wait_until,
};
use k8s_openapi::api::{
    core::v1::{
        Container, Node, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodSpec,
        Volume,
    },
    storage::v1::StorageClass,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams},
};

const T: Duration = Duration::from_secs(120);
/// The mock driver's topology key.
const KEY: &str = "io.kubernetes.storage.mock/node";

fn three_nodes() -> &'static ControlPlane {
    static CP: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
    let cp = CP
        .get_or_init(|| ControlPlane::spawn_launcher(&launcher_bin(), &["--nodes", "3"]).map_err(|e| format!("{e:#}")));
    match cp {
        Ok(cp) => cp,
        Err(e) => panic!("starting the control plane with three nodes failed: {e}"),
    }
}

/// A driver and a node-deployment provisioner on one node.
struct Instance {
    node: String,
    driver: Proc,
    provisioner: Proc,
}

impl Instance {
    /// The `(method, request)` pairs the driver logged for successful calls.
    fn requests(&self, method: &str) -> Vec<serde_json::Value> {
        let needle = format!("/csi.v1.Controller/{method} -> OK");
        let mut out = Vec::new();
        let mut hit = false;
        for line in self.driver.logs().lines() {
            if line.contains("/csi.v1.") && line.contains(" -> ") {
                hit = line.contains(&needle);
                continue;
            }
            if hit && let Some((_, json)) = line.split_once("request: ") {
                out.push(serde_json::from_str(json).unwrap_or_default());
            }
        }
        out
    }

    fn created(&self) -> BTreeSet<String> {
        self.requests("CreateVolume").iter().filter_map(|r| r["name"].as_str().map(str::to_string)).collect()
    }

    fn deleted_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> =
            self.requests("DeleteVolume").iter().filter_map(|r| r["volumeId"].as_str().map(str::to_string)).collect();
        ids.sort();
        ids
    }
}

struct World {
    driver_name: String,
    instances: Vec<Instance>,
    _dir: tempfile::TempDir,
}

impl World {
    async fn start(cp: &ControlPlane) -> World {
        let client = cp.client().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let driver_name = format!("{}.csi.example.com", unique_name("nd"));
        let nodes: Vec<String> = cp.info().nodes.iter().map(|n| n.name.clone()).collect();
        assert_eq!(nodes.len(), 3, "{:?}", cp.info().nodes);
        let mut instances = Vec::new();
        for node in nodes {
            // The node carries the driver's topology label (the kubelet would
            // write it on registration; no registrar runs here).
            let patch = serde_json::json!({"metadata": {"labels": {KEY: node}}});
            Api::<Node>::all(client.clone())
                .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap_or_else(|e| panic!("label node {node}: {e}"));
            let sock: PathBuf = dir.path().join(format!("{node}.sock"));
            let driver = Proc::spawn(
                &format!("csi-mock-driver-{node}"),
                &component_bin("csi-mock-driver"),
                &[
                    format!("--endpoint=unix://{}", sock.display()),
                    format!("--name={driver_name}"),
                    format!("--node-id={node}"),
                    "--enable-topology".into(),
                    format!("--topology-value={node}"),
                    "--disable-attach".into(),
                    "--verbose".into(),
                ],
                dir.path(),
            );
            let args = vec![
                format!("--csi-address={}", sock.display()),
                format!("--kubeconfig={}", cp.kubeconfig().display()),
                "-v=5".to_string(),
                "provisioner".to_string(),
                "--node-deployment".to_string(),
                "--node-deployment-base-delay=500ms".to_string(),
                "--node-deployment-max-delay=2s".to_string(),
                "--retry-interval-start=200ms".to_string(),
                "--retry-interval-max=2s".to_string(),
            ];
            let provisioner = Proc::spawn_env(
                &format!("csi-sidecar-{node}"),
                &sidecar_bin(),
                &args,
                &[("NODE_NAME", Some(&node))],
                dir.path(),
            );
            instances.push(Instance { node, driver, provisioner });
        }
        for i in &instances {
            wait_until(&format!("{}'s provisioner", i.node), T, async || {
                let logs = i.provisioner.logs();
                (logs.contains("Caches synced; provisioning"), logs)
            })
            .await;
            assert!(i.provisioner.logs().contains("Node deployment"), "{}", i.provisioner.logs());
        }
        World { driver_name, instances, _dir: dir }
    }

    fn by_node(&self, node: &str) -> &Instance {
        self.instances.iter().find(|i| i.node == node).expect("instance")
    }
}

/// A pod using `claim`, to be scheduled by the scheduler onto `node` (by its topology label).
fn pod_on(name: &str, node: &str, claim: &str) -> Pod {
    Pod {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(PodSpec {
            node_selector: Some(BTreeMap::from([(KEY.to_string(), node.to_string())])),
            containers: vec![Container {
                name: "c".into(),
                image: Some(NEVER_PULLED_IMAGE.into()),
                ..Default::default()
            }],
            volumes: Some(vec![Volume {
                name: "v".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.into(),
                    read_only: None,
                }),
                ..Default::default()
            }]),
            termination_grace_period_seconds: Some(0),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The node a PV's affinity names (`KEY In [node]`).
fn affinity_node(pv: &PersistentVolume) -> Option<String> {
    let terms = &pv.spec.as_ref()?.node_affinity.as_ref()?.required.as_ref()?.node_selector_terms;
    let e = terms.first()?.match_expressions.as_ref()?.first()?;
    (e.key == KEY).then(|| e.values.as_ref()?.first().cloned()).flatten()
}

async fn bound_pvs(ns: &TestNamespace, claims: &[String]) -> BTreeMap<String, PersistentVolume> {
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    let bound = wait_until(&format!("{} claims bound", claims.len()), T, async || {
        let list = pvcs.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let bound: BTreeMap<String, String> = list
            .iter()
            .filter(|c| claims.contains(c.metadata.name.as_ref().unwrap_or(&String::new())))
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .filter_map(|c| Some((c.metadata.name.clone()?, c.spec.as_ref()?.volume_name.clone()?)))
            .collect();
        (bound.len() == claims.len(), bound)
    })
    .await;
    let pvs: Api<PersistentVolume> = Api::all(ns.client().clone());
    let mut out = BTreeMap::new();
    for (claim, pv) in bound {
        out.insert(claim, pvs.get(&pv).await.expect("PV"));
    }
    out
}

#[tokio::test]
async fn three_node_instances_provision_their_own_claims_once_and_delete_only_their_own_volumes() {
    let cp = three_nodes();
    let ns = TestNamespace::new(&cp.client().await, "nd").await;
    let w = World::start(cp).await;
    let scs: Api<StorageClass> = Api::all(ns.client().clone());
    let (wffc, imm) = (ns.scoped("wffc"), ns.scoped("imm"));
    let mut sc = storage_class(&wffc, &w.driver_name);
    sc.volume_binding_mode = Some("WaitForFirstConsumer".into());
    create(&scs, &sc).await;
    create(&scs, &storage_class(&imm, &w.driver_name)).await;

    // WaitForFirstConsumer: the scheduler picks each pod's node; only that
    // node's instance provisions its claim.
    let mut late = Vec::new();
    for i in &w.instances {
        let claim = format!("late-{}", i.node);
        create(&ns.api(), &pvc(&claim, Some(&wffc), "1Mi")).await;
        create(&ns.api(), &pod_on(&format!("pod-{}", i.node), &i.node, &claim)).await;
        late.push(claim);
    }
    let late_pvs = bound_pvs(&ns, &late).await;
    for i in &w.instances {
        let pv = &late_pvs[&format!("late-{}", i.node)];
        let name = pv.metadata.name.clone().unwrap_or_default();
        assert_eq!(affinity_node(pv).as_deref(), Some(i.node.as_str()), "{pv:?}");
        for other in &w.instances {
            assert_eq!(other.created().contains(&name), other.node == i.node, "{name} created by {}?", other.node);
        }
        let identity = &pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .and_then(|c| c.volume_attributes.clone())
            .expect("attributes")["storage.kubernetes.io/csiProvisionerIdentity"];
        assert!(identity.ends_with(&format!("-{}-{}", w.driver_name, i.node)), "identity suffix: {identity}");
    }

    // Immediate: the three instances race for each claim; every claim is
    // provisioned by exactly one of them, on the node it wrote as selected.
    let early: Vec<String> = (0..30).map(|n| format!("early-{n}")).collect();
    for claim in &early {
        create(&ns.api(), &pvc(claim, Some(&imm), "1Mi")).await;
    }
    let early_pvs = bound_pvs(&ns, &early).await;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for claim in &early {
        let pv = &early_pvs[claim];
        let name = pv.metadata.name.clone().unwrap_or_default();
        let creators: Vec<&str> =
            w.instances.iter().filter(|i| i.created().contains(&name)).map(|i| i.node.as_str()).collect();
        assert_eq!(creators.len(), 1, "{claim} ({name}) created by {creators:?}");
        let selected = claims.get(claim).await.expect("claim").metadata.annotations.unwrap_or_default()
            ["volume.kubernetes.io/selected-node"]
            .clone();
        assert_eq!(selected, creators[0], "{claim}: selected node and creator");
        assert_eq!(affinity_node(pv).as_deref(), Some(creators[0]), "{claim}: the PV is on its creator's node");
        *per_node.entry(creators[0].to_string()).or_default() += 1;
    }
    eprintln!("Immediate claims per node: {per_node:?}");

    // Deletion: each instance deletes exactly the volumes of its node.
    let pods: Api<Pod> = ns.api();
    for i in &w.instances {
        let _ = pods
            .delete(&format!("pod-{}", i.node), &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
            .await;
    }
    let all: Vec<(String, PersistentVolume)> = late_pvs.into_iter().chain(early_pvs).collect();
    for (claim, _) in &all {
        claims.delete(claim, &DeleteParams::default()).await.expect("delete claim");
    }
    let pvs: Api<PersistentVolume> = Api::all(ns.client().clone());
    for (_, pv) in &all {
        wait_deleted(&pvs, pv.metadata.name.as_deref().unwrap_or_default(), T).await;
    }
    for i in &w.instances {
        let mut want: Vec<String> = all
            .iter()
            .filter(|(_, pv)| affinity_node(pv).as_deref() == Some(i.node.as_str()))
            .filter_map(|(_, pv)| pv.spec.as_ref()?.csi.as_ref().map(|c| c.volume_handle.clone()))
            .collect();
        want.sort();
        assert_eq!(w.by_node(&i.node).deleted_ids(), want, "DeleteVolume calls on {}", i.node);
        assert!(!i.provisioner.logs().contains("panicked"), "{}", i.provisioner.logs());
    }
    ns.delete().await;
}

#[tokio::test]
async fn node_deployment_without_node_name_is_a_clear_start_up_error() {
    let cp = three_nodes();
    let dir = tempfile::tempdir().expect("tempdir");
    let args = vec![
        format!("--csi-address={}", dir.path().join("none.sock").display()),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        "provisioner".to_string(),
        "--node-deployment".to_string(),
    ];
    let mut p = Proc::spawn_env("csi-sidecar-no-node", &sidecar_bin(), &args, &[("NODE_NAME", None)], dir.path());
    let status = p.wait_exit(Duration::from_secs(30)).await.expect("exits");
    let logs = p.logs();
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(
        logs.contains("The NODE_NAME environment variable must be set when using --enable-node-deployment."),
        "{logs}"
    );
    assert!(!logs.contains("panicked"), "{logs}");
}
