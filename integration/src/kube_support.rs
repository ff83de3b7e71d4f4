//! Kubernetes test support on top of [`crate::cluster`]: clients, a fresh
//! namespace per test, builders for the objects the CSI sidecars deal with, and
//! [`wait_for`], which panics with the object's last observed state.

use std::{
    collections::BTreeMap,
    fmt::Debug,
    path::Path,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use k8s_openapi::{
    NamespaceResourceScope,
    api::{
        core::v1::{
            CSIPersistentVolumeSource, Container, Namespace, Node, PersistentVolume, PersistentVolumeClaim,
            PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod, PodSpec, Volume,
            VolumeResourceRequirements,
        },
        storage::v1::{
            CSINode, CSINodeDriver, CSINodeSpec, StorageClass, VolumeAttachment, VolumeAttachmentSource,
            VolumeAttachmentSpec,
        },
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, PostParams},
};
use serde::{Serialize, de::DeserializeOwned};

/// The Node annotation that makes the attach-detach controller manage a node's volumes.
pub const CONTROLLER_MANAGED_ATTACH_DETACH: &str = "volumes.kubernetes.io/controller-managed-attach-detach";
/// An image that is never pulled (there is no kubelet).
pub const NEVER_PULLED_IMAGE: &str = "registry.invalid/never-pulled:0";

/// A client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Client {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Client::try_from(config).expect("kube client")
}

/// A name unique within this test process (DNS-1123 label: lowercase, digits, `-`).
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let mut name = format!("{prefix}-{:x}-{n}-{:x}", std::process::id(), nanos & 0xfff);
    name.make_ascii_lowercase();
    name.truncate(63);
    name
}

/// A namespace created for one test. Delete it with [`TestNamespace::delete`] at the
/// end of the test; dropping it only queues the deletion on the current runtime
/// (lost if that runtime ends first). The control plane runs no namespace
/// controller, so a deleted namespace stays `Terminating` with its contents; the
/// deletion only marks it.
pub struct TestNamespace {
    client: Client,
    name: String,
    deleted: bool,
}

impl TestNamespace {
    /// Creates a namespace named `<prefix>-<unique suffix>`.
    pub async fn new(client: &Client, prefix: &str) -> TestNamespace {
        let name = unique_name(prefix);
        let ns = Namespace { metadata: meta(&name), ..Default::default() };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        TestNamespace { client: client.clone(), name, deleted: false }
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The admin client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// An API for namespaced objects in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// A name for a cluster-scoped object of this test (`<namespace>-<suffix>`).
    pub fn scoped(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.name)
    }

    /// Deletes the namespace.
    pub async fn delete(mut self) {
        self.deleted = true;
        let _ = Api::<Namespace>::all(self.client.clone()).delete(&self.name, &DeleteParams::default()).await;
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        // Best effort without blocking: the client's connections are driven by the
        // test's runtime, so the request is queued there (it is lost if the runtime
        // ends right after, e.g. at the end of the test: call `delete().await`).
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let api = Api::<Namespace>::all(self.client.clone());
            let name = self.name.clone();
            handle.spawn(async move {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            });
        }
    }
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.to_string()), ..Default::default() }
}

fn quantity(q: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([("storage".to_string(), Quantity(q.to_string()))])
}

/// Creates `obj`, panicking with the object and the error on failure.
pub async fn create<K>(api: &Api<K>, obj: &K) -> K
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    api.create(&PostParams::default(), obj).await.unwrap_or_else(|e| {
        panic!("create {}: {e}\n{}", std::any::type_name::<K>(), serde_json::to_string_pretty(obj).unwrap_or_default())
    })
}

/// A StorageClass with `volumeBindingMode: Immediate` and `reclaimPolicy: Delete`.
pub fn storage_class(name: &str, provisioner: &str) -> StorageClass {
    StorageClass {
        metadata: meta(name),
        provisioner: provisioner.to_string(),
        volume_binding_mode: Some("Immediate".to_string()),
        reclaim_policy: Some("Delete".to_string()),
        ..Default::default()
    }
}

/// A ReadWriteOnce filesystem PVC of `size`; `storage_class` None means `""` (no
/// dynamic provisioning, binds to a pre-created PV only).
pub fn pvc(name: &str, storage_class: Option<&str>, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: meta(name),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            storage_class_name: Some(storage_class.unwrap_or("").to_string()),
            resources: Some(VolumeResourceRequirements { requests: Some(quantity(size)), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A pre-provisioned CSI PV: ReadWriteOnce, `Retain`, storage class `""`, no claimRef.
pub fn csi_pv(name: &str, driver: &str, volume_handle: &str, size: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: meta(name),
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            capacity: Some(quantity(size)),
            persistent_volume_reclaim_policy: Some("Retain".to_string()),
            storage_class_name: Some(String::new()),
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.to_string(),
                volume_handle: volume_handle.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A VolumeAttachment of `pv` to `node` for `driver`, as the attach-detach
/// controller creates one (without status).
pub fn volume_attachment(name: &str, driver: &str, node: &str, pv: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: meta(name),
        spec: VolumeAttachmentSpec {
            attacher: driver.into(),
            node_name: node.into(),
            source: VolumeAttachmentSource { persistent_volume_name: Some(pv.into()), ..Default::default() },
        },
        status: None,
    }
}

/// Whether the apiserver keeps `status.attachError.errorCode` of a
/// VolumeAttachment: written through `/status` on a throwaway object of
/// `attacher` (no attacher handles it: the name is not its own) and read back.
pub async fn server_keeps_error_code(vas: &Api<VolumeAttachment>, attacher: &str) -> bool {
    use kube::api::{Patch, PatchParams};
    let name = unique_name("probe-error-code");
    let va = volume_attachment(&name, &format!("x-{attacher}"), "nowhere", "none");
    vas.create(&PostParams::default(), &va).await.expect("create the probe VolumeAttachment");
    let status =
        serde_json::json!({"status": {"attached": false, "attachError": {"message": "probe", "errorCode": 5}}});
    let patched =
        vas.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("patch its status");
    let _ = vas.delete(&name, &DeleteParams::default()).await;
    patched.status.and_then(|s| s.attach_error).and_then(|e| e.error_code).is_some()
}

/// How many VolumeAttachments whose name starts with `prefix` are attached
/// (0 when listing fails).
pub async fn attached_count(vas: &Api<VolumeAttachment>, prefix: &str) -> usize {
    vas.list(&kube::api::ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|v| v.metadata.name.as_deref().is_some_and(|n| n.starts_with(prefix)))
                .filter(|v| v.status.as_ref().is_some_and(|s| s.attached))
                .count()
        })
        .unwrap_or(0)
}

/// A Node whose volumes the attach-detach controller manages (annotation
/// [`CONTROLLER_MANAGED_ATTACH_DETACH`]`: "true"`), with `labels`. No status: there
/// is no kubelet. Create it before Pods that use it.
pub fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    let mut m = meta(name);
    m.annotations = Some(BTreeMap::from([(CONTROLLER_MANAGED_ATTACH_DETACH.to_string(), "true".to_string())]));
    m.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    Node { metadata: m, ..Default::default() }
}

/// A CSINode (name = the Node's) listing one driver with its node ID and topology keys.
pub fn csi_node(node_name: &str, driver: &str, node_id: &str, topology_keys: &[&str]) -> CSINode {
    CSINode {
        metadata: meta(node_name),
        spec: CSINodeSpec {
            drivers: vec![CSINodeDriver {
                name: driver.to_string(),
                node_id: node_id.to_string(),
                topology_keys: Some(topology_keys.iter().map(|k| k.to_string()).collect()),
                ..Default::default()
            }],
        },
    }
}

/// A Pod scheduled to `node_name` (no scheduler involved) mounting PVC `claim`; its
/// image is never pulled.
pub fn pod(name: &str, node_name: &str, claim: &str) -> Pod {
    Pod {
        metadata: meta(name),
        spec: Some(PodSpec {
            node_name: Some(node_name.to_string()),
            containers: vec![Container {
                name: "c".to_string(),
                image: Some(NEVER_PULLED_IMAGE.to_string()),
                ..Default::default()
            }],
            volumes: Some(vec![Volume {
                name: "v".to_string(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn describe<K: Serialize>(obj: &Option<K>) -> String {
    match obj {
        Some(o) => serde_json::to_string_pretty(o).unwrap_or_else(|e| format!("<unserializable: {e}>")),
        None => "<not found>".to_string(),
    }
}

/// Polls `name` every 100 ms until `cond` holds for it (None = not found) and
/// returns what it saw; on timeout panics with `what` and the last observed state
/// as JSON. API errors are retried (and shown if they are the last thing seen).
pub async fn wait_for_state<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut(Option<&K>) -> bool,
) -> Option<K>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let start = Instant::now();
    loop {
        let last: Result<Option<K>, String> = match api.get_opt(name).await {
            Ok(obj) => {
                if cond(obj.as_ref()) {
                    return obj;
                }
                Ok(obj)
            }
            Err(e) => Err(e.to_string()),
        };
        if start.elapsed() > timeout {
            let state = match &last {
                Ok(obj) => describe(obj),
                Err(e) => format!("<error: {e}>"),
            };
            panic!(
                "timed out after {timeout:?} waiting for {} {name:?}: {what}; last observed state:\n{state}",
                std::any::type_name::<K>().rsplit("::").next().unwrap_or("object")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until object `name` exists and satisfies `cond`; returns it. On timeout
/// panics with the object's last observed state.
pub async fn wait_for<K>(api: &Api<K>, name: &str, timeout: Duration, mut cond: impl FnMut(&K) -> bool) -> K
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let what = "condition";
    wait_for_state(api, name, what, timeout, |o| o.is_some_and(&mut cond)).await.expect("checked by the condition")
}

/// Waits until object `name` is gone (e.g. its finalizers were released).
pub async fn wait_deleted<K>(api: &Api<K>, name: &str, timeout: Duration)
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    wait_for_state(api, name, "deletion", timeout, |o| o.is_none()).await;
}

/// Whether a kube error is an API error with this HTTP status.
pub fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code)
}

/// The namespace's Events (none when the list fails).
async fn events(ns: &TestNamespace) -> Vec<k8s_openapi::api::core::v1::Event> {
    let api: Api<k8s_openapi::api::core::v1::Event> = ns.api();
    api.list(&kube::api::ListParams::default()).await.map(|l| l.items).unwrap_or_default()
}

/// The Events of the namespace's object `name`.
pub async fn events_for(ns: &TestNamespace, name: &str) -> Vec<k8s_openapi::api::core::v1::Event> {
    events(ns).await.into_iter().filter(|e| e.involved_object.name.as_deref() == Some(name)).collect()
}

/// The messages of the namespace's Events with `reason` (none when the list
/// fails).
pub async fn event_messages(ns: &TestNamespace, reason: &str) -> Vec<String> {
    events(ns)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.message.unwrap_or_default())
        .collect()
}

/// Waits up to `timeout` for an Event `reason` on `name` whose message
/// contains `contains`; panics with the events seen.
pub async fn wait_event(
    timeout: Duration,
    ns: &TestNamespace,
    name: &str,
    reason: &str,
    contains: &str,
) -> k8s_openapi::api::core::v1::Event {
    crate::wait_until(&format!("event {reason} on {name} with {contains:?}"), timeout, async || {
        let evs = events_for(ns, name).await;
        let hit = evs
            .iter()
            .find(|e| e.reason.as_deref() == Some(reason) && e.message.as_deref().unwrap_or("").contains(contains))
            .cloned();
        (hit.is_some(), (hit, evs.iter().map(|e| (e.reason.clone(), e.message.clone())).collect::<Vec<_>>()))
    })
    .await
    .0
    .expect("event")
}

/// Waits up to `timeout` for the claim to be Bound and returns its PV.
pub async fn bound_pv(timeout: Duration, ns: &TestNamespace, claim: &str) -> PersistentVolume {
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    let bound =
        wait_for(&pvcs, claim, timeout, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;
    let pv_name = bound.spec.and_then(|s| s.volume_name).expect("volumeName");
    Api::<PersistentVolume>::all(ns.client().clone()).get(&pv_name).await.expect("PV")
}
