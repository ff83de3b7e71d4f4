//! How the shared informer cache lists, counted by the apiserver: every kind
//! in one LIST request (served from the watch cache, `resourceVersion=0`),
//! even where a paginated list would take several pages.

use std::time::Duration;

use csi_sidecar_integration::{
    bench::{FLOW_SCHEMA, SIDECAR_USER, check_accounting, get_text, parse_metrics, setup_identity},
    cluster::{ControlPlane, Identity},
    component_bin,
    kube_support::{csi_pv, unique_name},
    process::Proc,
    sidecar_bin, wait_until,
};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{core::v1::PersistentVolume, flowcontrol::v1::FlowSchema, storage::v1::StorageClass};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};

const RESOURCES: &[&str] =
    &["persistentvolumes", "persistentvolumeclaims", "storageclasses", "volumeattachments", "csinodes"];

/// More PVs than one page of a paginated list (500).
const PVS: usize = 1_200;

/// A FlowSchema counting the LIST requests of the sidecar's user (on the
/// bench's priority level): the apiserver's `dispatched_requests_total` under
/// it is exactly the sidecar's lists, whatever kube-controller-manager lists
/// meanwhile.
const LISTS: &str = "csi-sidecar-lists";

async fn count_lists(admin: &Client) -> f64 {
    let text = get_text(admin, "/metrics").await.expect("apiserver /metrics");
    parse_metrics(&text, &["apiserver_flowcontrol_dispatched_requests_total"])
        .iter()
        .filter(|s| s.label("flow_schema") == LISTS)
        .map(|s| s.value)
        .sum::<f64>()
}

async fn count_the_sidecars_lists(admin: &Client, as_sidecar: &Client) {
    let fs: FlowSchema = serde_json::from_value(serde_json::json!({
        "metadata": {"name": LISTS},
        "spec": {
            "priorityLevelConfiguration": {"name": FLOW_SCHEMA},
            "matchingPrecedence": 40,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "User", "user": {"name": SIDECAR_USER}}],
                "resourceRules": [{"verbs": ["list"], "apiGroups": ["*"], "resources": RESOURCES,
                                   "clusterScope": true, "namespaces": ["*"]}],
            }],
        },
    }))
    .expect("FlowSchema");
    Api::<FlowSchema>::all(admin.clone()).create(&PostParams::default(), &fs).await.expect("create FlowSchema");
    // APF picks the schema up asynchronously: until one list of ours counts.
    let classes: Api<StorageClass> = Api::all(as_sidecar.clone());
    wait_until("the list FlowSchema counts", Duration::from_secs(30), async || {
        let before = count_lists(admin).await;
        classes.list(&ListParams::default()).await.expect("list storage classes");
        let after = count_lists(admin).await;
        (after - before == 1.0, after - before)
    })
    .await;
}

#[tokio::test]
async fn each_kind_is_listed_in_one_request_from_the_watch_cache() {
    let cp = ControlPlane::start();
    let client = cp.client().await;
    setup_identity(&client).await.expect("the sidecar's user and FlowSchema");
    let identity = Identity::user(SIDECAR_USER, &[]);
    let as_sidecar = cp.client_as(&identity).await;
    check_accounting(&client, &as_sidecar).await.expect("APF accounting");
    count_the_sidecars_lists(&client, &as_sidecar).await;

    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let prefix = unique_name("listed");
    futures::stream::iter(0..PVS)
        .map(|i| {
            let pvs = pvs.clone();
            let pv = csi_pv(&format!("{prefix}-{i}"), "other.csi.example.com", &format!("h-{i}"), "1Gi");
            async move { pvs.create(&PostParams::default(), &pv).await }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .expect("create the PVs");

    let dir = tempfile::tempdir().expect("tempdir");
    let csi = dir.path().join("csi.sock");
    let _driver = Proc::spawn(
        "csi-mock-driver",
        &component_bin("csi-mock-driver"),
        &[format!("--endpoint=unix://{}", csi.display()), "--name=listed.csi.example.com".into()],
        dir.path(),
    );
    let before = count_lists(&client).await;
    let sidecar = Proc::spawn(
        "sidecar",
        &sidecar_bin(),
        &[
            format!("--csi-address={}", csi.display()),
            format!("--kubeconfig={}", cp.mint(&identity).display()),
            "provisioner".into(),
            "attacher".into(),
        ],
        dir.path(),
    );
    wait_until("both modules' caches synced", Duration::from_secs(60), async || {
        let n = sidecar.logs().matches("Caches synced").count();
        (n >= 2, n)
    })
    .await;
    let lists = count_lists(&client).await - before;
    assert_eq!(
        lists,
        RESOURCES.len() as f64,
        "one LIST per watched kind ({RESOURCES:?}) with {PVS} PVs in the cluster, not one per page; sidecar log:\n{}",
        sidecar.logs().lines().filter(|l| l.contains("Watch") || l.contains("elisting")).collect::<Vec<_>>().join("\n")
    );
}
