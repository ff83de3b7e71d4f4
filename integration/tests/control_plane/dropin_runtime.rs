//! What a drop-in replacement shows the cluster besides its work, against
//! the real apiserver and driver: each module's writes under its upstream
//! program name in `managedFields`, Events with each upstream sidecar's
//! source, API errors as the apiserver's message (never kube's `Debug`
//! form), and controller modules that wait for a ready driver before they
//! ask its name (fault driver: a driver that says "not ready").

use std::{path::PathBuf, time::Duration};

use csi_sidecar_integration::{
    cluster::ControlPlane,
    component_bin,
    fault_driver::{FaultDriver, FaultEnv, ProbeAnswer, Script, Transport},
    kube_support::{
        TestNamespace, create, csi_node, events_for, node, pvc, storage_class, unique_name, volume_attachment,
        wait_event, wait_for,
    },
    process::Proc,
    sidecar_bin, symlinked_bin, wait_until,
};
use k8s_openapi::{
    api::{
        core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim},
        storage::v1::{CSINode, StorageClass, VolumeAttachment},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api,
    api::{Patch, PatchParams},
};

const T: Duration = Duration::from_secs(30);

/// The field managers of an object's `managedFields`.
fn managers(meta: &ObjectMeta) -> Vec<String> {
    meta.managed_fields.iter().flatten().filter_map(|m| m.manager.clone()).collect()
}

/// `<driver>_<host>_<uuid>`: the provisioning library's event source.
fn is_library_component(component: &str, driver: &str) -> bool {
    let Some(rest) = component.strip_prefix(&format!("{driver}_")) else { return false };
    let Some((host, uuid)) = rest.rsplit_once('_') else { return false };
    let groups: Vec<usize> = uuid.split('-').map(str::len).collect();
    !host.is_empty() && groups == [8, 4, 4, 4, 12] && uuid.chars().all(|c| c == '-' || c.is_ascii_hexdigit())
}

fn source_of(e: &Event) -> (Option<String>, Option<String>) {
    let s = e.source.clone().unwrap_or_default();
    (s.component, s.host.filter(|h| !h.is_empty()))
}

#[tokio::test]
async fn each_module_writes_under_its_upstream_name_with_upstream_event_sources() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "dropin").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let driver_name = format!("{}.csi.example.com", unique_name("dropin"));
    let node_name = ns.scoped("node");
    let csi: PathBuf = dir.path().join("csi.sock");
    let _driver = Proc::spawn(
        "csi-mock-driver",
        &component_bin("csi-mock-driver"),
        &[
            format!("--endpoint=unix://{}", csi.display()),
            format!("--name={driver_name}"),
            format!("--node-id={node_name}"),
        ],
        dir.path(),
    );
    create(&Api::<Node>::all(client.clone()), &node(&node_name, &[])).await;
    create(&Api::<CSINode>::all(client.clone()), &csi_node(&node_name, &driver_name, &node_name, &[])).await;
    let sc = ns.scoped("sc");
    let mut class = storage_class(&sc, &driver_name);
    class.allow_volume_expansion = Some(true);
    create(&Api::<StorageClass>::all(client.clone()), &class).await;
    // A class whose provisioner secret does not exist: the apiserver's 404
    // ends up in a ProvisioningFailed event.
    let nosecret = ns.scoped("nosecret");
    let mut class = storage_class(&nosecret, &driver_name);
    class.parameters = Some(
        [
            ("csi.storage.k8s.io/provisioner-secret-name", "absent"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "${pvc.namespace}"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
    );
    create(&Api::<StorageClass>::all(client.clone()), &class).await;
    let mut args = vec![
        format!("--csi-address={}", csi.display()),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        "-v=2".to_string(),
    ];
    for m in ["provisioner", "attacher", "resizer"] {
        args.push(m.to_string());
        args.extend(["--retry-interval-start=200ms".to_string(), "--retry-interval-max=2s".to_string()]);
    }
    let sidecar = Proc::spawn("csi-sidecar", &sidecar_bin(), &args, dir.path());

    // provisioner: the PV is csi-provisioner's, its events the library's.
    create(&ns.api(), &pvc("data", Some(&sc), "1Mi")).await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    let bound =
        wait_for(&pvcs, "data", T, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;
    let pv_name = bound.spec.and_then(|s| s.volume_name).expect("volumeName");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs.get(&pv_name).await.expect("PV");
    assert!(managers(&pv.metadata).contains(&"csi-provisioner".to_string()), "{:?}", managers(&pv.metadata));
    let ok = wait_event(T, &ns, "data", "ProvisioningSucceeded", "Successfully provisioned volume").await;
    let (component, host) = source_of(&ok);
    let component = component.unwrap_or_default();
    assert!(is_library_component(&component, &driver_name), "source.component {component:?}");
    assert_eq!(host, None, "upstream sets no source.host");
    assert_eq!(ok.reporting_component.as_deref(), Some(component.as_str()), "client-go repeats the component");

    // An API error in an event: the apiserver's message, as Go's err.Error().
    create(&ns.api(), &pvc("no-secret", Some(&nosecret), "1Mi")).await;
    let failed = wait_event(T, &ns, "no-secret", "ProvisioningFailed", "error getting secret absent").await;
    let text = failed.message.unwrap_or_default();
    assert!(
        text.ends_with(&format!(
            "error getting secret absent in namespace {}: secrets \"absent\" not found",
            ns.name()
        )),
        "{text}"
    );
    assert!(!text.contains("ApiError") && !text.contains("Status {"), "no Debug form: {text}");

    // attacher: the VolumeAttachment's finalizer and status are csi-attacher's.
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va_name = ns.scoped("va");
    create(&vas, &volume_attachment(&va_name, &driver_name, &node_name, &pv_name)).await;
    let va = wait_for(&vas, &va_name, T, |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
    assert!(managers(&va.metadata).contains(&"csi-attacher".to_string()), "{:?}", managers(&va.metadata));
    let pv = pvs.get(&pv_name).await.expect("PV");
    assert!(managers(&pv.metadata).contains(&"csi-attacher".to_string()), "PV finalizer: {:?}", managers(&pv.metadata));

    // resizer: the claim's status is csi-resizer's, its events `external-resizer <driver>`.
    let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": "2Mi"}}}});
    pvcs.patch("data", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("request 2Mi");
    let grown = wait_for(&pvcs, "data", T, |c| {
        c.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")).map(|q| q.0.as_str())
            == Some("2Mi")
    })
    .await;
    assert!(managers(&grown.metadata).contains(&"csi-resizer".to_string()), "{:?}", managers(&grown.metadata));
    let resized = wait_event(T, &ns, "data", "VolumeResizeSuccessful", "Resize volume succeeded").await;
    assert_eq!(source_of(&resized), (Some(format!("external-resizer {driver_name}")), None));

    // Nothing the test did not write itself shows up as `unknown` (the
    // test's own client sends no User-Agent: the VolumeAttachment's create).
    let pv = pvs.get(&pv_name).await.expect("PV");
    assert!(!managers(&pv.metadata).iter().any(|m| m == "unknown"), "{:?}", managers(&pv.metadata));
    let evs = events_for(&ns, "data").await;
    assert!(evs.iter().all(|e| source_of(e).1.is_none()), "no event has a source.host");
    drop(sidecar);
    let _ = vas
        .patch(&va_name, &PatchParams::default(), &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})))
        .await;
    let _ = vas.delete(&va_name, &Default::default()).await;
    ns.delete().await;
}

#[tokio::test]
async fn a_controller_module_asks_the_driver_nothing_else_until_it_is_ready() {
    let env = FaultEnv::new("probe-wait").await;
    let driver =
        FaultDriver::start(&env.socket(), Transport::Grpc, Script { probe: ProbeAnswer::NotReady, ..env.script() });
    let mut sidecar =
        env.sidecar("attacher", &symlinked_bin(env.dir.path(), "csi-attacher"), &["-v=4", "--timeout=1s"]);

    // A driver that never gets ready: asked again and again (upstream's
    // ProbeForever), reported every 10 s, nothing else called, the
    // attacher not started, the process still up.
    wait_until("a few Probes", T, async || (driver.probes() >= 3, driver.probes())).await;
    wait_until("the still-connecting report", T, async || {
        let logs = sidecar.logs();
        (logs.contains("Still connecting to the CSI driver") && logs.contains("CSI driver is not ready"), logs)
    })
    .await;
    assert_eq!(
        driver.counters.plugin_infos.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no GetPluginInfo before ready"
    );
    assert!(!sidecar.logs().contains("CSI driver discovered"), "{}", sidecar.logs());
    assert_eq!(sidecar.try_exit(), None, "waits, does not exit:\n{}", sidecar.logs());

    // Ready: discovery goes on and the attacher starts.
    driver.update(|s| s.probe = ProbeAnswer::Ready);
    wait_until("discovery after ready", T, async || {
        let logs = sidecar.logs();
        (logs.contains("CSI driver discovered"), logs)
    })
    .await;
    assert!(driver.counters.plugin_infos.load(std::sync::atomic::Ordering::SeqCst) >= 1);
}
