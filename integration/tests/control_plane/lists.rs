//! How the shared informer cache lists, counted by the apiserver: every kind
//! in one request even where a paginated list would take several pages: a
//! streaming list (a WATCH with `sendInitialEvents`) where the apiserver
//! offers it, else one LIST from the watch cache (`resourceVersion=0`).

use std::time::Duration;

use csi_sidecar_integration::{
    bench::{FLOW_SCHEMA, SIDECAR_USER, check_accounting, get_text, parse_metrics, setup_identity},
    cluster::{ControlPlane, Identity, launcher_bin},
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

/// FlowSchemas counting the LIST and the WATCH requests of the sidecar's user
/// (on the bench's priority level): the apiserver's
/// `dispatched_requests_total` under each is exactly the sidecar's, whatever
/// kube-controller-manager does meanwhile.
const LISTS: &str = "csi-sidecar-lists";
const WATCHES: &str = "csi-sidecar-watches";

async fn dispatched(admin: &Client, schema: &str) -> f64 {
    let text = get_text(admin, "/metrics").await.expect("apiserver /metrics");
    parse_metrics(&text, &["apiserver_flowcontrol_dispatched_requests_total"])
        .iter()
        .filter(|s| s.label("flow_schema") == schema)
        .map(|s| s.value)
        .sum::<f64>()
}

async fn count_the_sidecars(admin: &Client, as_sidecar: &Client) {
    for (schema, verb, precedence) in [(LISTS, "list", 40), (WATCHES, "watch", 41)] {
        let fs: FlowSchema = serde_json::from_value(serde_json::json!({
            "metadata": {"name": schema},
            "spec": {
                "priorityLevelConfiguration": {"name": FLOW_SCHEMA},
                "matchingPrecedence": precedence,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [{
                    "subjects": [{"kind": "User", "user": {"name": SIDECAR_USER}}],
                    "resourceRules": [{"verbs": [verb], "apiGroups": ["*"], "resources": RESOURCES,
                                       "clusterScope": true, "namespaces": ["*"]}],
                }],
            },
        }))
        .expect("FlowSchema");
        Api::<FlowSchema>::all(admin.clone()).create(&PostParams::default(), &fs).await.expect("create FlowSchema");
    }
    // APF picks the schemas up asynchronously: until one list of ours counts
    // (a watch schema created before it is in place too).
    let classes: Api<StorageClass> = Api::all(as_sidecar.clone());
    wait_until("the FlowSchemas count", Duration::from_secs(30), async || {
        let before = dispatched(admin, LISTS).await;
        classes.list(&ListParams::default()).await.expect("list storage classes");
        let after = dispatched(admin, LISTS).await;
        (after - before == 1.0, after - before)
    })
    .await;
}

/// Starts provisioner + attacher as the sidecar's user on a control plane
/// holding more PVs than one list page; returns the LIST and WATCH requests
/// they made until both modules' caches synced, and the sidecar's log.
async fn start_and_count(cp: &ControlPlane) -> (f64, f64, String) {
    let client = cp.client().await;
    setup_identity(&client).await.expect("the sidecar's user and FlowSchema");
    let identity = Identity::user(SIDECAR_USER, &[]);
    let as_sidecar = cp.client_as(&identity).await;
    check_accounting(&client, &as_sidecar).await.expect("APF accounting");
    count_the_sidecars(&client, &as_sidecar).await;

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
    let (lists0, watches0) = (dispatched(&client, LISTS).await, dispatched(&client, WATCHES).await);
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
    let lists = dispatched(&client, LISTS).await - lists0;
    let watches = dispatched(&client, WATCHES).await - watches0;
    (lists, watches, sidecar.logs())
}

fn watch_lines(log: &str) -> String {
    log.lines().filter(|l| l.contains("atch") || l.contains("listing")).collect::<Vec<_>>().join("\n")
}

#[tokio::test]
async fn each_kind_is_one_streaming_list_where_the_apiserver_offers_it() {
    let cp = ControlPlane::start();
    let (lists, watches, log) = start_and_count(&cp).await;
    let kinds = RESOURCES.len() as f64;
    assert_eq!(lists, 0.0, "no LIST: the initial objects come on the watch; log:\n{}", watch_lines(&log));
    assert_eq!(watches, kinds, "one WATCH per kind ({RESOURCES:?}); log:\n{}", watch_lines(&log));
    assert!(!log.contains("refuses streaming lists"), "{}", watch_lines(&log));
}

#[tokio::test]
async fn without_streaming_lists_each_kind_is_listed_in_one_request_from_the_watch_cache() {
    let cp = ControlPlane::spawn_launcher(&launcher_bin(), &["--apiserver-arg", "--feature-gates=WatchList=false"])
        .expect("a control plane without the WatchList feature");
    let (lists, watches, log) = start_and_count(&cp).await;
    let kinds = RESOURCES.len() as f64;
    assert_eq!(
        lists,
        kinds,
        "one LIST per kind ({RESOURCES:?}) with {PVS} PVs in the cluster, not one per page; log:\n{}",
        watch_lines(&log)
    );
    // (The watches: each kind's refused one, and the one after its list,
    // which may start just after the caches synced: not counted here.)
    assert!(watches >= kinds, "at least the refused streaming watches: {watches}");
    assert_eq!(log.matches("refuses streaming lists").count(), RESOURCES.len(), "{}", watch_lines(&log));
}
