//! snapshot-metadata's live runs under the manifests' RBAC. The module runs
//! in a process of its own bound to exactly `manifests/rbac/snapshot-metadata.yaml`
//! (plus its binding in controller.yaml), without `--audience` (the
//! SnapshotMetadataService gives it); the fault driver and a provisioner
//! and snapshotter under admin credentials make the snapshots. A backup
//! application then reads a snapshot's allocated blocks (its class names a
//! snapshotter secret), a delta with its base by name, and another
//! driver's snapshot (refused as upstream refuses it).
//!
//! * Sufficiency: every answer is right and nothing is refused.
//! * Necessity: with any one triple of the ClusterRole removed, the run
//!   fails with the apiserver's refusal of exactly that triple (`list` on
//!   an apiserver without streaming lists, where the informers list).

use std::time::{Duration, Instant};

use csi_sidecar::modules::snapshot_metadata::{api, client};
use csi_sidecar_integration::{
    cluster::{ControlPlane, Identity},
    fault_driver::{FaultDriver, FaultEnv, Script},
    kube_support::{create, pvc, wait_for},
    process::Proc,
    sidecar_bin,
    snapshot_metadata::{TlsFiles, allocated, backup_account, blocks, create_service, delta, serving},
    snapshots::{SnapApis, obj},
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use tonic::Code;

use super::{
    Triple,
    cycle::{CONTROLLER_SA, Failure, Rules, apply_rbac, snapshots_without_streaming_lists, tolerated_refusal},
    row_calls, without_triple_verdict,
};

const MODULE: &str = "snapshot-metadata";
const AUDIENCE: &str = "rbac-backup";
const BLOCK: u64 = 4096;
/// How long one step of a run may take.
const STEP: Duration = Duration::from_secs(45);

/// One run: the world it reads and the module's process.
struct Run {
    base: FaultEnv,
    driver: FaultDriver,
    _controllers: Proc,
    sidecar: Proc,
    address: String,
    tls: TlsFiles,
}

impl Run {
    async fn start(cp: &ControlPlane, rules: Rules<'_>) -> Run {
        let base = FaultEnv::on(cp, "rbac-smd").await;
        let admin = base.ns.client().clone();
        apply_rbac(&admin, base.ns.name(), MODULE, rules).await;
        let kubeconfig = cp.mint(&Identity::service_account(base.ns.name(), CONTROLLER_SA));
        let tls = TlsFiles::write(base.dir.path()).expect("TLS files");
        let [port] = csi_sidecar_integration::ports::free_ports::<1>().expect("a free port");
        let script = Script { snapshots: true, snapshot_metadata: true, ..base.script() };
        let (driver, _controllers) = base.start_with_provisioner("snapshotter", script, &[]);
        let args = [
            "snapshot-metadata".to_string(),
            format!("--tls-cert={}", tls.cert.display()),
            format!("--tls-key={}", tls.key.display()),
            "--bind-address=127.0.0.1".into(),
            format!("--port={port}"),
            "-v=5".into(),
            format!("--csi-address={}", base.socket().display()),
            format!("--kubeconfig={}", kubeconfig.display()),
        ];
        let sidecar = Proc::spawn_env(MODULE, &sidecar_bin(), &args, &[], base.dir.path());
        let address = format!("127.0.0.1:{port}");
        Run { base, driver, _controllers, sidecar, address, tls }
    }

    fn fail(&self, reason: impl Into<String>) -> Failure {
        Failure { reason: reason.into(), log: self.sidecar.logs() }
    }

    /// Refusals in the module's log, but those the code expects and works
    /// around (a streaming list refused: the informer lists instead).
    fn forbidden(&self) -> Option<String> {
        let log = self.sidecar.logs();
        let lines: Vec<&str> =
            log.lines().filter(|l| l.to_lowercase().contains("forbidden") && !tolerated_refusal(l)).collect();
        (!lines.is_empty()).then(|| lines.join("\n"))
    }

    /// The snapshots a backup reads: a block claim with blocks 1, 2 and 3
    /// written, snapshot `first`; block 3 rewritten and 20 written,
    /// snapshot `second` (their class names a snapshotter secret); and
    /// `foreign`, another driver's ready snapshot. Made as admin.
    async fn stage(&self) {
        let (client, ns) = (self.base.ns.client().clone(), self.base.ns.name().to_string());
        create_service(&client, &self.base.driver_name, &self.address, &self.tls.ca, AUDIENCE).await.expect("CR");
        backup_account(&client, &ns, "backup", true).await.expect("backup account");
        let secret = Secret {
            metadata: ObjectMeta { name: Some("smd-creds".into()), ..Default::default() },
            string_data: Some([("token".to_string(), "hunter2".to_string())].into()),
            ..Default::default()
        };
        create(&self.base.ns.api::<Secret>(), &secret).await;
        let sc = self.base.storage_class("sc", |_| {}).await;
        let snaps = SnapApis::new(&client, &ns);
        let class = self.base.ns.scoped("vsc");
        let params = serde_json::json!({"csi.storage.k8s.io/snapshotter-secret-name": "smd-creds",
            "csi.storage.k8s.io/snapshotter-secret-namespace": ns});
        snaps.class(&class, &self.base.driver_name, "Delete", params).await;
        let mut claim = pvc("data", Some(&sc), "1Mi");
        if let Some(spec) = claim.spec.as_mut() {
            spec.volume_mode = Some("Block".into());
        }
        let pvcs: Api<PersistentVolumeClaim> = self.base.ns.api();
        create(&pvcs, &claim).await;
        let bound =
            wait_for(&pvcs, "data", STEP, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .await;
        let volume = format!("fault-{}", bound.spec.and_then(|s| s.volume_name).expect("volumeName"));
        self.driver.set_volume_size(&volume, 32 * BLOCK);
        for (block, snapshot) in [(1, None), (2, None), (3, Some("first")), (3, None), (20, Some("second"))] {
            self.driver.write_volume(&volume, block * BLOCK, snapshot.unwrap_or("data").as_bytes());
            if let Some(name) = snapshot {
                let content = snaps.snapshot_of(name, &class, "data").await;
                snaps.wait_content_ready(&content, STEP).await;
                snaps.wait_snapshot_ready(name, STEP).await;
            }
        }
        let foreign = self.base.ns.scoped("foreign");
        let content = serde_json::json!({"metadata": {"name": foreign},
            "spec": {"deletionPolicy": "Retain", "driver": "other.example.com", "source": {"snapshotHandle": "h"},
                     "volumeSnapshotRef": {"name": "foreign", "namespace": ns}}});
        snaps.contents.create(&PostParams::default(), &obj("VolumeSnapshotContent", content)).await.expect("content");
        let status = serde_json::json!({"status": {"readyToUse": true, "snapshotHandle": "h"}});
        snaps.contents.patch_status(&foreign, &PatchParams::default(), &Patch::Merge(&status)).await.expect("status");
        let snap = serde_json::json!({"metadata": {"name": "foreign"},
            "spec": {"source": {"volumeSnapshotContentName": foreign}}});
        snaps.snapshots.create(&PostParams::default(), &obj("VolumeSnapshot", snap)).await.expect("snapshot");
        snaps.wait_snapshot_ready("foreign", STEP).await;
    }

    /// Waits until the server says SERVING; fails early on a refusal in the
    /// log or the process's exit.
    async fn until_serving(&mut self) -> Result<(), Failure> {
        let start = Instant::now();
        loop {
            if let Some(lines) = self.forbidden() {
                return Err(self.fail(format!("refused while waiting for SERVING: {lines}")));
            }
            if serving(&self.address, &self.tls.ca).await == Ok(true) {
                return Ok(());
            }
            if let Some(status) = self.sidecar.try_exit() {
                return Err(self.fail(format!("csi-sidecar exited ({status}) before serving")));
            }
            if start.elapsed() > STEP {
                return Err(self.fail(format!("not SERVING after {STEP:?}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The backup's calls, each answered as with upstream's sidecar.
    async fn run(&mut self) -> Result<(), Failure> {
        self.stage().await;
        self.until_serving().await?;
        let ns = self.base.ns.name().to_string();
        let token = client::token_for(self.base.ns.client(), &ns, "backup", AUDIENCE).await.expect("token");
        let mut c = client::connect(&self.address, &self.tls.ca).await.map_err(|e| self.fail(e.to_string()))?;
        let ask = |snapshot: &str| api::GetMetadataAllocatedRequest {
            security_token: token.clone(),
            namespace: ns.clone(),
            snapshot_name: snapshot.into(),
            starting_offset: 0,
            max_results: 0,
        };
        let changed = api::GetMetadataDeltaRequest {
            security_token: token.clone(),
            namespace: ns.clone(),
            base_snapshot_id: "first".into(),
            target_snapshot_name: "second".into(),
            starting_offset: 0,
            max_results: 0,
        };
        let theirs = format!("VolumeSnapshot 'foreign' does not belong to the CSI driver '{}'", self.base.driver_name);
        let answers = [
            ("allocated first", allocated(&mut c, ask("first")).await, Ok(blocks(&[1, 2, 3]))),
            ("delta first..second", delta(&mut c, changed).await, Ok(blocks(&[3, 20]))),
            ("allocated foreign", allocated(&mut c, ask("foreign")).await, Err((Code::InvalidArgument, theirs))),
        ];
        for (what, got, want) in answers {
            if got != want {
                return Err(self.fail(format!("{what}: {got:?}, not {want:?}")));
            }
        }
        match self.forbidden() {
            Some(lines) => Err(self.fail(format!("refused: {lines}"))),
            None => Ok(()),
        }
    }

    async fn finish(mut self) {
        self.sidecar.terminate().await;
        self.base.ns.delete().await;
    }
}

#[tokio::test]
async fn snapshot_metadata_runs_under_exactly_the_manifests_rbac() {
    let mut run = Run::start(ControlPlane::with_snapshots(), Rules::Manifest).await;
    if let Err(f) = run.run().await {
        panic!("snapshot-metadata under manifests/rbac failed: {}\n----- log -----\n{}", f.reason, f.log);
    }
    let log = run.sidecar.logs();
    assert!(!log.to_lowercase().contains("forbidden"), "{log}");
    assert!(!log.contains("hunter2"), "the secret's value is never logged");
    run.finish().await;
}

/// 11 triples: all of the module's.
#[tokio::test]
async fn snapshot_metadata_fails_without_any_one_triple() {
    let triples: Vec<Triple> = row_calls(MODULE).into_iter().collect();
    assert_eq!(triples.len(), 11);
    let mut failures = Vec::new();
    // A few at a time: each run starts a driver and two csi-sidecars.
    for batch in triples.chunks(4) {
        let runs = batch.iter().map(|t| async move {
            let cp = if t.2 == "list" { snapshots_without_streaming_lists() } else { ControlPlane::with_snapshots() };
            let mut run = Run::start(cp, Rules::Without(t)).await;
            let outcome = run.run().await;
            run.finish().await;
            (t.clone(), outcome)
        });
        for (t, outcome) in futures::future::join_all(runs).await {
            failures.extend(without_triple_verdict(MODULE, &t, outcome));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
