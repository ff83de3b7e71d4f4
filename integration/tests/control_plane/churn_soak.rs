//! The runtime contract under churn, on a dedicated real control plane (the
//! tests restart its kube-apiserver): two replicas of `csi-sidecar
//! provisioner attacher` on the fault driver, PVCs created and deleted in
//! waves with pods whose VolumeAttachments the real attach-detach controller
//! makes, the leader SIGKILLed every 40 s and kube-apiserver restarted once
//! (its watch cache is rebuilt, so every watch resumes or relists).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use csi_sidecar_integration::{
    cluster::ControlPlane,
    failover::{fast_leader_election, leads},
    fault_driver::{CallKind, FaultDriver, FaultEnv, Script, Transport},
    kube_support::{TestNamespace, csi_node, is_status, node, pod, pvc, storage_class},
    process::Proc,
    sidecar_bin, wait_until,
};
use futures::{StreamExt, future::join_all};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::{CSINode, StorageClass, VolumeAttachment},
};
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, ListParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde::{Serialize, de::DeserializeOwned};

const T: Duration = Duration::from_secs(60);

/// The launcher restarts kube-apiserver in place: the API answers again, a
/// watch opened before the restart sees objects created after it, and the
/// launcher does not count the restart as a failed run.
#[tokio::test]
async fn a_restarted_apiserver_answers_and_an_existing_watch_sees_new_objects() {
    let cp = ControlPlane::start();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "restart").await;
    let cms: Api<ConfigMap> = ns.api();
    let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let watch = {
        let (cms, seen) = (cms.clone(), seen.clone());
        tokio::spawn(async move {
            let mut stream = watcher(cms, watcher::Config::default()).default_backoff().applied_objects().boxed();
            while let Some(item) = stream.next().await {
                if let Ok(cm) = item {
                    seen.lock().expect("seen").insert(cm.metadata.name.unwrap_or_default());
                }
            }
        })
    };
    let has = |name: &str| seen.lock().expect("seen").contains(name);
    create_retrying(&cms, &config_map("before"), T).await;
    wait_until("the watch to see the first object", T, async || (has("before"), ())).await;

    let old_pid = cp.info().pids.kube_apiserver;
    let restarted = cp.restart_apiserver().await.expect("restart kube-apiserver");
    assert_ne!(restarted.pid, old_pid, "a new kube-apiserver process");
    println!("RESTART: kube-apiserver ready again after {} ms", restarted.ms);

    let fresh = cp.client().await;
    let version = fresh.apiserver_version().await.expect("the restarted apiserver answers");
    assert!(!version.git_version.is_empty());
    create_retrying(&Api::<ConfigMap>::namespaced(fresh, ns.name()), &config_map("after"), T).await;
    wait_until("the watch opened before the restart to see an object created after it", T, async || {
        (has("after"), seen.lock().expect("seen").clone())
    })
    .await;
    watch.abort();
    ns.delete().await;
    let status = cp.stop().expect("the launcher stopped");
    assert!(status.success(), "the launcher counted the restart as a failure: {status}");
}

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        ..Default::default()
    }
}

/// Creates `obj`, retrying API errors (the apiserver may be restarting)
/// until `within`; an object that already exists counts as created.
async fn create_retrying<K>(api: &Api<K>, obj: &K, within: Duration)
where
    K: Resource + Clone + std::fmt::Debug + Serialize + DeserializeOwned,
{
    let start = Instant::now();
    loop {
        match api.create(&PostParams::default(), obj).await {
            Ok(_) => return,
            Err(e) if is_status(&e, 409) => return,
            Err(e) if start.elapsed() > within => panic!("create {:?}: {e}", obj.meta().name),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Deletes `name` (with `dp`), retrying API errors until `within`; a missing
/// object counts as deleted.
async fn delete_retrying<K>(api: &Api<K>, name: &str, dp: &DeleteParams, within: Duration)
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned,
{
    let start = Instant::now();
    loop {
        match api.delete(name, dp).await {
            Ok(_) => return,
            Err(e) if is_status(&e, 404) => return,
            Err(e) if start.elapsed() > within => panic!("delete {name}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Lists, retrying API errors (empty after `within`).
async fn list_retrying<K>(api: &Api<K>, lp: &ListParams) -> Vec<K>
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned,
{
    let start = Instant::now();
    loop {
        match api.list(lp).await {
            Ok(l) => return l.items,
            Err(_) if start.elapsed() > T => return Vec::new(),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

// ---------------------------------------------------------------------------
// The soak
// ---------------------------------------------------------------------------

/// The whole test, control-plane start included, must end within this.
const BUDGET: Duration = Duration::from_secs(300);
const PVCS: usize = 300;
const WAVE: usize = 75;
const NODES: usize = 4;
const KILL_EVERY: Duration = Duration::from_secs(40);
/// When (after the load started) kube-apiserver is restarted.
const RESTART_AT: Duration = Duration::from_secs(60);

struct Soak {
    env: FaultEnv,
    driver: FaultDriver,
    sc: String,
    /// Node name → the driver's node ID on it.
    nodes: Vec<(String, String)>,
    start: Instant,
    /// (volume ID, node ID) → when its VolumeAttachment was seen gone.
    gone: Mutex<BTreeMap<(String, String), Instant>>,
}

/// A replica of `csi-sidecar provisioner attacher`, two of which run at once.
fn replica(env: &FaultEnv, n: usize) -> Proc {
    let mut args = fast_leader_election(env.ns.name());
    args.extend(["--kube-api-qps=50", "--kube-api-burst=100", "-v=2"].map(String::from));
    let retry = ["--retry-interval-start=200ms", "--retry-interval-max=2s"];
    args.push("provisioner".into());
    args.extend(retry.map(String::from));
    args.push("attacher".into());
    args.extend(retry.map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    env.sidecar(&format!("replica-{n}"), &sidecar_bin(), &args)
}

/// What the chaos side did.
#[derive(Default, Debug)]
struct Chaos {
    kills: usize,
    restarts: usize,
    /// Replicas that exited by themselves (e.g. leadership lost while the
    /// apiserver was down) and were started again, as a Deployment would.
    exits: usize,
}

impl Soak {
    fn left(&self) -> Duration {
        BUDGET.saturating_sub(self.start.elapsed())
    }

    fn client(&self) -> Client {
        self.env.ns.client().clone()
    }

    /// Waits for `probe` within the remaining budget.
    async fn wait<S: std::fmt::Debug>(&self, what: &str, mut probe: impl AsyncFnMut() -> (bool, S)) -> S {
        let left = self.left();
        assert!(!left.is_zero(), "the soak exceeded its {BUDGET:?} bound before {what}");
        // Lists are not free on 2 shared cores: probe about 4 times a second.
        let paced = async || {
            let (ok, state) = probe().await;
            if !ok {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (ok, state)
        };
        wait_until(&format!("{what} (within the soak's {BUDGET:?} bound)"), left, paced).await
    }

    fn claim_name(wave: usize, i: usize) -> String {
        format!("w{wave}-{i:02}")
    }

    fn pod_name(wave: usize, i: usize) -> String {
        format!("p-w{wave}-{i:02}")
    }

    /// Every other claim of a wave is used by a pod.
    fn has_pod(i: usize) -> bool {
        i.is_multiple_of(2)
    }

    /// Of those, every other pod is deleted as soon as its VolumeAttachment
    /// exists (while it is being published).
    fn early_delete(i: usize) -> bool {
        i % 4 == 2
    }

    fn node_of(&self, i: usize) -> &(String, String) {
        &self.nodes[(i / 2) % self.nodes.len()]
    }

    async fn create_claims(&self, wave: usize) {
        let api: Api<PersistentVolumeClaim> = self.env.ns.api();
        for chunk in (0..WAVE).collect::<Vec<_>>().chunks(25) {
            join_all(chunk.iter().map(|&i| {
                let mut claim = pvc(&Self::claim_name(wave, i), Some(&self.sc), "1Mi");
                claim.metadata.labels = Some([("wave".to_string(), wave.to_string())].into());
                let api = api.clone();
                async move { create_retrying(&api, &claim, T).await }
            }))
            .await;
        }
    }

    /// Waits until the wave's claims are Bound; returns claim index → PV name.
    async fn bound(&self, wave: usize) -> BTreeMap<usize, String> {
        let api: Api<PersistentVolumeClaim> = self.env.ns.api();
        let lp = ListParams::default().labels(&format!("wave={wave}"));
        self.wait(&format!("the {WAVE} claims of wave {wave} Bound"), async || {
            let claims = api.list(&lp).await.map(|l| l.items).unwrap_or_default();
            let bound: BTreeMap<usize, String> = claims
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .filter_map(|c| {
                    let name = c.metadata.name.as_deref()?;
                    let i = name.rsplit('-').next()?.parse().ok()?;
                    Some((i, c.spec.as_ref()?.volume_name.clone()?))
                })
                .collect();
            (bound.len() == WAVE, bound)
        })
        .await
    }

    /// The VolumeAttachments of this driver by (PV, node name).
    async fn vas(&self) -> BTreeMap<(String, String), VolumeAttachment> {
        let api: Api<VolumeAttachment> = Api::all(self.client());
        list_retrying(&api, &ListParams::default())
            .await
            .into_iter()
            .filter(|v| v.spec.attacher == self.env.driver_name)
            .filter_map(|v| Some(((v.spec.source.persistent_volume_name.clone()?, v.spec.node_name.clone()), v)))
            .collect()
    }

    /// PV name → volume handle, for this driver's PVs.
    async fn handles(&self) -> BTreeMap<String, String> {
        let api: Api<PersistentVolume> = Api::all(self.client());
        list_retrying(&api, &ListParams::default())
            .await
            .into_iter()
            .filter_map(|p| {
                let csi = p.spec.as_ref()?.csi.as_ref()?;
                let name = p.metadata.name.clone()?;
                (csi.driver == self.env.driver_name).then(|| (name, csi.volume_handle.clone()))
            })
            .collect()
    }

    async fn create_pods(&self, wave: usize) {
        let api: Api<Pod> = self.env.ns.api();
        join_all((0..WAVE).filter(|&i| Self::has_pod(i)).map(|i| {
            let p = pod(&Self::pod_name(wave, i), &self.node_of(i).0, &Self::claim_name(wave, i));
            let api = api.clone();
            async move { create_retrying(&api, &p, T).await }
        }))
        .await;
    }

    async fn delete_pods(&self, wave: usize, which: impl Fn(usize) -> bool) {
        let api: Api<Pod> = self.env.ns.api();
        let dp = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        join_all(
            (0..WAVE)
                .filter(|&i| Self::has_pod(i) && which(i))
                .map(|i| {
                    let (api, dp, name) = (&api, &dp, Self::pod_name(wave, i));
                    async move { delete_retrying(api, &name, dp, T).await }
                })
                .collect::<Vec<_>>(),
        )
        .await;
    }

    async fn delete_claims(&self, wave: usize) {
        let api: Api<PersistentVolumeClaim> = self.env.ns.api();
        let dp = DeleteParams::default();
        join_all((0..WAVE).map(|i| {
            let (api, dp, name) = (&api, &dp, Self::claim_name(wave, i));
            async move { delete_retrying(api, &name, dp, T).await }
        }))
        .await;
    }

    /// The (PV, node name) of each pod of the wave selected by `which`.
    fn pairs(&self, pvs: &BTreeMap<usize, String>, which: impl Fn(usize) -> bool) -> Vec<(String, String)> {
        pvs.iter()
            .filter(|(i, _)| Self::has_pod(**i) && which(**i))
            .map(|(i, pv)| (pv.clone(), self.node_of(*i).0.clone()))
            .collect()
    }

    /// Waits until the VolumeAttachments of `pairs` are gone, recording when
    /// each was first seen gone (by volume ID and node ID).
    async fn wait_gone(&self, what: &str, pairs: &[(String, String)]) {
        let handles = self.handles().await;
        let node_ids: BTreeMap<&str, &str> = self.nodes.iter().map(|(n, id)| (n.as_str(), id.as_str())).collect();
        self.wait(what, async || {
            let vas = self.vas().await;
            let now = Instant::now();
            let mut left = Vec::new();
            for (pv, node) in pairs {
                if vas.contains_key(&(pv.clone(), node.clone())) {
                    left.push(pv.clone());
                } else if let (Some(h), Some(id)) = (handles.get(pv), node_ids.get(node.as_str())) {
                    self.gone.lock().expect("gone").entry((h.clone(), id.to_string())).or_insert(now);
                }
            }
            (left.is_empty(), left)
        })
        .await;
    }

    /// One wave: claims, bound, pods, half of those deleted while attaching,
    /// the rest attached; then the previous wave is torn down.
    async fn wave(&self, wave: usize) {
        self.create_claims(wave).await;
        let pvs = self.bound(wave).await;
        self.create_pods(wave).await;
        let early = self.pairs(&pvs, Self::early_delete);
        self.wait(&format!("the VolumeAttachments of wave {wave}"), async || {
            let vas = self.vas().await;
            let missing: Vec<&(String, String)> = early.iter().filter(|p| !vas.contains_key(p)).collect();
            (missing.is_empty(), missing.len())
        })
        .await;
        self.delete_pods(wave, Self::early_delete).await;
        let kept = self.pairs(&pvs, |i| !Self::early_delete(i));
        self.wait(&format!("the kept pods of wave {wave} attached"), async || {
            let vas = self.vas().await;
            let pending: Vec<&String> = kept
                .iter()
                .filter(|p| !vas.get(p).is_some_and(|v| v.status.as_ref().is_some_and(|s| s.attached)))
                .map(|(pv, _)| pv)
                .collect();
            (pending.is_empty(), pending.len())
        })
        .await;
        self.wait_gone(&format!("the early-deleted pods' attachments of wave {wave} gone"), &early).await;
        if wave > 0 {
            let prev = self.bound(wave - 1).await;
            self.delete_pods(wave - 1, |_| true).await;
            let pairs = self.pairs(&prev, |i| !Self::early_delete(i));
            self.wait_gone(&format!("the attachments of wave {} gone", wave - 1), &pairs).await;
            self.delete_claims(wave - 1).await;
        }
    }

    /// Waits (within the budget, without failing: the invariants report
    /// what is wrong) until the deleted claims' PVs are gone and the backend
    /// holds exactly the volumes of this driver's PVs.
    async fn settle(&self, bound_claims: usize) {
        while !self.left().is_zero() {
            let handles: BTreeSet<String> = self.handles().await.into_values().collect();
            let backend: BTreeSet<String> = self.driver.volumes.lock().expect("volumes").values().cloned().collect();
            if handles == backend && handles.len() == bound_claims {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Soak {
    /// Records when each VolumeAttachment of the driver, once seen, is first
    /// seen gone (every 250 ms; a failed list is skipped); runs until dropped.
    async fn track_gone(&self) {
        let api: Api<VolumeAttachment> = Api::all(self.client());
        let node_ids: BTreeMap<String, String> = self.nodes.iter().cloned().collect();
        let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
        let mut handles: BTreeMap<String, String> = BTreeMap::new();
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let Ok(list) = api.list(&ListParams::default()).await else { continue };
            let now = Instant::now();
            let current: BTreeSet<(String, String)> = list
                .items
                .into_iter()
                .filter(|v| v.spec.attacher == self.env.driver_name)
                .filter_map(|v| Some((v.spec.source.persistent_volume_name?, v.spec.node_name)))
                .collect();
            if current.iter().any(|(pv, _)| !handles.contains_key(pv)) {
                handles = self.handles().await;
            }
            for key in seen.difference(&current) {
                if let (Some(h), Some(id)) = (handles.get(&key.0), node_ids.get(&key.1)) {
                    self.gone.lock().expect("gone").entry((h.clone(), id.clone())).or_insert(now);
                }
            }
            seen.extend(current);
        }
    }
}

/// SIGKILLs a replica that leads and starts a fresh one in its place.
async fn kill_a_leader(env: &FaultEnv, replicas: &mut [Proc; 2], next: &mut usize) -> bool {
    let Some(slot) = (0..2).find(|&i| leads(&replicas[i])) else { return false };
    replicas[slot].kill();
    *next += 1;
    replicas[slot] = replica(env, *next);
    true
}

/// Kills the leader every [`KILL_EVERY`], restarts kube-apiserver once at
/// [`RESTART_AT`], and restarts replicas that exited; runs until dropped.
async fn chaos(cp: &ControlPlane, env: &FaultEnv, replicas: &mut [Proc; 2], record: &Mutex<Chaos>) {
    let load_start = Instant::now();
    let mut next_kill = load_start + KILL_EVERY;
    let mut next = 1;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for proc in replicas.iter_mut() {
            if proc.try_exit().is_some() {
                next += 1;
                *proc = replica(env, next);
                record.lock().expect("chaos").exits += 1;
            }
        }
        if Instant::now() >= next_kill && kill_a_leader(env, replicas, &mut next).await {
            record.lock().expect("chaos").kills += 1;
            next_kill = Instant::now() + KILL_EVERY;
        }
        let restarted = record.lock().expect("chaos").restarts > 0;
        if !restarted && load_start.elapsed() >= RESTART_AT {
            cp.restart_apiserver().await.expect("restart kube-apiserver");
            record.lock().expect("chaos").restarts += 1;
        }
    }
}

/// The lines of the replicas' logs in `dir` that mention `needle` (at most
/// 40), prefixed with the log's name.
fn log_lines(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut files: Vec<_> = std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).collect();
    files.sort();
    let mut out = Vec::new();
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "log")) {
        let name = f.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let text = std::fs::read_to_string(f).unwrap_or_default();
        out.extend(text.lines().filter(|l| l.contains(needle)).map(|l| format!("{name}: {l}")));
    }
    out.truncate(40);
    out
}

/// Pairs (volume, node) published after their VolumeAttachment was seen
/// gone, or still published at the end.
fn published_after_gone(
    gone: &BTreeMap<(String, String), Instant>,
    driver: &FaultDriver,
) -> Vec<((String, String), String)> {
    let calls = driver.controller_calls();
    let published = driver.published.lock().expect("published").clone();
    let mut bad = Vec::new();
    for ((vol, node), at) in gone {
        let late = calls
            .iter()
            .filter(|c| c.kind == CallKind::Publish && &c.volume_id == vol && &c.node_id == node && c.start > *at)
            .count();
        if late > 0 {
            bad.push((
                (vol.clone(), node.clone()),
                format!("{late} publish calls after the VolumeAttachment was gone"),
            ));
        }
        if published.get(vol).is_some_and(|nodes| nodes.contains(node)) {
            bad.push(((vol.clone(), node.clone()), "still published at the end".to_string()));
        }
    }
    bad
}

/// 300 PVCs in waves of 75 with pods' VolumeAttachments, two replicas with
/// the leader SIGKILLed every 40 s and kube-apiserver restarted once; at the
/// end every Bound PVC has exactly one backend volume, no backend volume
/// lacks a PV, no (volume, node) was published after its VolumeAttachment
/// was gone, and no two calls on one (volume, node) overlapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_soak_keeps_the_runtime_contract() {
    let start = Instant::now();
    let cp = ControlPlane::start();
    let env = FaultEnv::on(&cp, "soak").await;
    let client = env.ns.client().clone();
    let script = Script {
        publish: true,
        create_delay: Duration::from_millis(20),
        publish_delay: Duration::from_millis(300),
        unpublish_delay: Duration::from_millis(100),
        ..env.script()
    };
    let driver = FaultDriver::start(&env.socket(), Transport::Grpc, script);
    let sc = env.ns.scoped("sc");
    create_retrying(&Api::<StorageClass>::all(client.clone()), &storage_class(&sc, &env.driver_name), T).await;
    let mut nodes = Vec::new();
    for k in 0..NODES {
        let (name, id) = (env.ns.scoped(&format!("node{k}")), format!("soak-node-{k}"));
        create_retrying(&Api::<Node>::all(client.clone()), &node(&name, &[]), T).await;
        create_retrying(&Api::<CSINode>::all(client.clone()), &csi_node(&name, &env.driver_name, &id, &[]), T).await;
        nodes.push((name, id));
    }
    let mut replicas = [replica(&env, 0), replica(&env, 1)];
    let soak = Soak { env, driver, sc, nodes, start, gone: Mutex::default() };
    soak.wait("a leader", async || (replicas.iter().any(leads), ())).await;

    let record = Mutex::new(Chaos::default());
    let waves = async {
        for wave in 0..PVCS / WAVE {
            soak.wave(wave).await;
        }
    };
    tokio::select! {
        () = waves => {}
        () = chaos(&cp, &soak.env, &mut replicas, &record) => unreachable!("chaos runs until dropped"),
        () = soak.track_gone() => unreachable!("the tracker runs until dropped"),
    }
    soak.settle(WAVE).await;

    // The invariants.
    let pvcs: Api<PersistentVolumeClaim> = soak.env.ns.api();
    let claims = list_retrying(&pvcs, &ListParams::default()).await;
    let handles = soak.handles().await;
    let backend = soak.driver.volumes.lock().expect("volumes").clone();
    let mut problems = Vec::new();
    let bound: Vec<&PersistentVolumeClaim> =
        claims.iter().filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).collect();
    for c in &bound {
        let pv = c.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
        let volumes = handles.get(&pv).map_or(0, |h| backend.values().filter(|id| *id == h).count());
        if volumes != 1 {
            problems.push(format!("Bound PVC {:?} (PV {pv}) has {volumes} backend volumes", c.metadata.name));
        }
    }
    let pv_handles: BTreeSet<&String> = handles.values().collect();
    for (name, id) in &backend {
        if !pv_handles.contains(id) {
            problems.push(format!("backend volume {name} ({id}) has no PV"));
        }
    }
    let gone = soak.gone.lock().expect("gone").clone();
    for ((vol, node), why) in published_after_gone(&gone, &soak.driver) {
        problems.push(format!("({vol}, {node}): {why}"));
    }
    let overlaps = soak.driver.overlaps();
    for (a, b) in overlaps.iter().take(10) {
        let timeline: Vec<String> = soak
            .driver
            .calls_for(&a.volume_id, &a.node_id)
            .iter()
            .map(|c| {
                let ms = |t: Instant| t.saturating_duration_since(start).as_millis();
                format!("{:?} {}..{:?} ms {:?}", c.kind, ms(c.start), c.end.map(ms), c.outcome)
            })
            .collect();
        let pv = a.volume_id.trim_start_matches("fault-");
        problems.push(format!(
            "overlap on ({}, {}): {:?} and {:?}; calls: {timeline:?}; replica log lines:\n{}",
            a.volume_id,
            a.node_id,
            a.kind,
            b.kind,
            log_lines(soak.env.dir.path(), pv).join("\n")
        ));
    }
    let calls = soak.driver.controller_calls();
    // Also an invariant: an attached volume carries no stale attachError
    // (upstream writes one after a 409 on its finalizer patch).
    let stale = soak
        .vas()
        .await
        .values()
        .filter(|v| v.status.as_ref().is_some_and(|s| s.attached && s.attach_error.is_some()))
        .count();
    let chaos = record.lock().expect("chaos");
    println!(
        "SOAK: {PVCS} PVCs ({} Bound at the end), {} backend volumes, {} PVs, {} leader kills, {} apiserver \
         restarts, {} replica exits, {} publishes, {} unpublishes, {} detached attachments checked, {} overlaps, \
         {stale} attached with attachError, {:.0} s",
        bound.len(),
        backend.len(),
        handles.len(),
        chaos.kills,
        chaos.restarts,
        chaos.exits,
        calls.iter().filter(|c| c.kind == CallKind::Publish).count(),
        calls.iter().filter(|c| c.kind == CallKind::Unpublish).count(),
        gone.len(),
        overlaps.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(chaos.kills >= 1 && chaos.restarts == 1, "the chaos ran: {chaos:?}");
    assert!(problems.is_empty(), "{} invariant violations:\n{}", problems.len(), problems.join("\n"));
    assert_eq!(stale, 0, "attached VolumeAttachments with a stale attachError");
    assert!(start.elapsed() <= BUDGET, "the soak took {:?} (bound {BUDGET:?})", start.elapsed());
}
