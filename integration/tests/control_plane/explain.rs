//! `csi-sidecar explain`, the binary run as a process, against the real
//! control plane (with snapshot-controller), the fault driver and csi-sidecar
//! serving `/debug/objects`: a real object driven into each state, the
//! sentence that names it and the exit status (0 done, 1 waits, 2 bad input).

use std::{process::Stdio, time::Duration};

use csi_sidecar_integration::{
    cluster::ControlPlane,
    deref_fault_env,
    failover::{fast_leader_election, leads, wait_one_leader},
    fault_driver::{FaultDriver, FaultEnv, Script, Transport},
    free_port,
    kube_support::{create, csi_node, csi_pv, event_messages, pvc, storage_class, volume_attachment, wait_for},
    process::Proc,
    sidecar_bin,
    snapshots::SnapApis,
    wait_until,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::PersistentVolumeClaim,
    storage::v1::{CSINode, StorageClass, VolumeAttachment},
};
use kube::{Api, api::ListParams};
use tonic::Code;

const T: Duration = Duration::from_secs(60);

/// What one `csi-sidecar explain` run printed.
#[derive(Debug)]
struct Said {
    code: Option<i32>,
    /// The first line: `<Kind> <name>: done` or `: waiting`.
    head: String,
    /// The reasons (the `  - ` lines), without the dash.
    lines: Vec<String>,
    stderr: String,
}

/// Runs `csi-sidecar explain ARGS` to its end.
async fn explain(args: &[String]) -> Said {
    let run = tokio::process::Command::new(sidecar_bin())
        .arg("explain")
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap_or_else(|_| panic!("explain {args:?} did not finish within 30 s"))
        .expect("run csi-sidecar explain");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut it = stdout.lines();
    Said {
        code: out.status.code(),
        head: it.next().unwrap_or_default().to_string(),
        lines: it.map(|l| l.strip_prefix("  - ").unwrap_or(l).to_string()).collect(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `<call> failed N times (last: E); next attempt in S s` → (N, E, S).
fn failed_times<'a>(line: &'a str, call: &str) -> Option<(u32, &'a str, u64)> {
    let rest = line.strip_prefix(call)?.strip_prefix(" failed ")?;
    let (n, rest) = rest.split_once(" times (last: ")?;
    let (last, next) = rest.rsplit_once("); next attempt in ")?;
    Some((n.parse().ok()?, last, next.strip_suffix(" s")?.parse().ok()?))
}

/// `<sentence> (last: E); next attempt in S s` → (E, S).
fn last_and_next<'a>(line: &'a str, sentence: &str) -> Option<(&'a str, u64)> {
    let rest = line.strip_prefix(sentence)?.strip_prefix(" (last: ")?;
    let (last, next) = rest.rsplit_once("); next attempt in ")?;
    Some((last, next.strip_suffix(" s")?.parse().ok()?))
}

struct Env {
    base: FaultEnv,
}

deref_fault_env!(Env);

impl Env {
    async fn new(prefix: &str) -> Env {
        Env { base: FaultEnv::on(ControlPlane::with_snapshots(), prefix).await }
    }

    fn driver(&self, edit: impl FnOnce(&mut Script)) -> FaultDriver {
        let mut script = self.script();
        edit(&mut script);
        FaultDriver::start(&self.socket(), Transport::Grpc, script)
    }

    /// csi-sidecar with `/debug/objects` on a free port, `shared` flags,
    /// then `modules` (module names and their flags); (process, address).
    fn serving(&self, name: &str, shared: &[String], modules: &[&str]) -> (Proc, String) {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut args = vec![format!("--http-endpoint={addr}"), "--enable-debug-endpoints".into(), "-v=4".into()];
        args.extend(shared.iter().cloned());
        args.extend(modules.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        (self.sidecar(name, &sidecar_bin(), &args), addr)
    }

    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.ns.name())
    }

    fn args(&self, kind: &str, name: &str, endpoints: &[&str]) -> Vec<String> {
        let mut a = vec![kind.to_string(), name.to_string(), format!("--kubeconfig={}", self.kubeconfig.display())];
        a.extend(endpoints.iter().map(|e| format!("--endpoint={e}")));
        a
    }

    async fn explain(&self, kind: &str, name: &str, endpoints: &[&str]) -> Said {
        explain(&self.args(kind, name, endpoints)).await
    }

    /// Runs `explain` until what it says satisfies `ok`; returns that.
    async fn explain_until(
        &self,
        what: &str,
        (kind, name): (&str, &str),
        endpoints: &[&str],
        mut ok: impl FnMut(&Said) -> bool,
    ) -> Said {
        let args = self.args(kind, name, endpoints);
        wait_until(what, T, async || {
            let said = explain(&args).await;
            (ok(&said), said)
        })
        .await
    }

    async fn claim(&self, name: &str, class: &str) {
        create(&self.ns.api::<PersistentVolumeClaim>(), &pvc(name, Some(class), "1Mi")).await;
    }

    /// The newest ProvisioningFailed texts of the namespace.
    async fn provisioning_failures(&self) -> Vec<String> {
        event_messages(&self.ns, "ProvisioningFailed").await
    }
}

const FAST_RETRIES: [&str; 2] = ["--retry-interval-start=1s", "--retry-interval-max=5s"];

fn with_fast_retries<'a>(modules: &[&'a str]) -> Vec<&'a str> {
    modules.iter().copied().chain(FAST_RETRIES).collect()
}

// ---- PersistentVolumeClaim ----

#[tokio::test]
async fn a_bound_claim_is_done() {
    let env = Env::new("xp-bound").await;
    let _driver = env.driver(|_| ());
    let (_p, addr) = env.serving("csi-sidecar", &[], &["provisioner"]);
    let sc = env.storage_class("sc", |_| {}).await;
    let pv = env.bound_claim("data", &sc, T).await;
    assert!(pv.starts_with("pvc-"), "{pv}");
    let said = env.explain("pvc", &env.key("data"), &[&addr]).await;
    assert_eq!(said.code, Some(0), "{said:?}");
    assert_eq!(said.head, format!("PersistentVolumeClaim {}: done", env.key("data")));
    assert_eq!(said.lines, [format!("bound to PersistentVolume {pv}")], "{said:?}");
}

#[tokio::test]
async fn a_wait_for_first_consumer_claim_without_a_pod_waits_for_the_scheduler() {
    let env = Env::new("xp-wffc").await;
    let _driver = env.driver(|_| ());
    let (_p, addr) = env.serving("csi-sidecar", &[], &["provisioner"]);
    let sc = env.storage_class("wffc", |c| c.volume_binding_mode = Some("WaitForFirstConsumer".into())).await;
    env.claim("late", &sc).await;
    let said = env.explain("pvc", &env.key("late"), &[&addr]).await;
    assert_eq!(said.code, Some(1), "{said:?}");
    assert_eq!(said.head, format!("PersistentVolumeClaim {}: waiting", env.key("late")));
    assert_eq!(said.lines, ["WaitForFirstConsumer: no pod has been scheduled with this claim yet"], "{said:?}");
}

#[tokio::test]
async fn a_failing_create_volume_is_counted_with_its_last_error_and_next_attempt() {
    let env = Env::new("xp-failing").await;
    let driver = env.driver(|s| s.create_error = Some((Code::ResourceExhausted, "pool full".into())));
    let (_p, addr) = env.serving("csi-sidecar", &[], &with_fast_retries(&["provisioner"]));
    let sc = env.storage_class("sc", |_| {}).await;
    env.claim("full", &sc).await;
    let said = env
        .explain_until("explain to count two failed CreateVolume calls", ("pvc", &env.key("full")), &[&addr], |s| {
            s.lines.first().and_then(|l| failed_times(l, "CreateVolume")).is_some_and(|(n, _, _)| n >= 2)
        })
        .await;
    assert_eq!(said.code, Some(1), "{said:?}");
    let (n, last, next) = failed_times(&said.lines[0], "CreateVolume").expect("the failure line");
    assert!(u64::from(n) <= driver.creates(), "{n} failures counted, {} CreateVolume calls", driver.creates());
    assert!(last.contains("rpc error: code = ResourceExhausted desc = pool full"), "{last}");
    assert!(next <= 5, "next attempt within --retry-interval-max: {next} s");
    let failures = env.provisioning_failures().await;
    assert!(failures.iter().any(|m| m == last), "the last error is the event's text: {last:?} in {failures:?}");
    assert_eq!(said.lines.len(), 2, "{said:?}");
    assert!(said.lines[1].starts_with("last warning: ProvisioningFailed"), "{said:?}");
    assert!(said.lines[1].ends_with(&format!(": {last}")), "{said:?}");
}

#[tokio::test]
async fn a_missing_class_secret_is_named_and_without_the_endpoint_the_events_speak() {
    let env = Env::new("xp-secret").await;
    let driver = env.driver(|_| ());
    let (_p, addr) = env.serving("csi-sidecar", &[], &with_fast_retries(&["provisioner"]));
    let ns = env.ns.name().to_string();
    let sc = env
        .storage_class("secret", |c| {
            c.parameters = Some(
                [
                    ("csi.storage.k8s.io/provisioner-secret-name".to_string(), "absent".to_string()),
                    ("csi.storage.k8s.io/provisioner-secret-namespace".to_string(), ns),
                ]
                .into(),
            )
        })
        .await;
    env.claim("locked", &sc).await;
    const SECRET: &str = "a secret the class names is missing or cannot be read";
    let key = env.key("locked");
    let said = env
        .explain_until("explain to name the missing secret", ("pvc", &key), &[&addr], |s| {
            s.lines.first().and_then(|l| last_and_next(l, SECRET)).is_some()
        })
        .await;
    assert_eq!(said.code, Some(1), "{said:?}");
    let (last, next) = last_and_next(&said.lines[0], SECRET).expect("the secret line");
    assert!(last.contains("absent"), "the error names the secret: {last}");
    assert!(next <= 5, "{next}");
    assert_eq!(driver.creates(), 0, "the driver is not called without the secret");

    // Without an endpoint, and with one nobody serves: the newest Warning.
    let last = last.to_string();
    let warning = |s: &Said| s.lines.get(1).is_some_and(|l| l.starts_with("last warning: ProvisioningFailed"));
    let said = env.explain("pvc", &key, &[]).await;
    assert_eq!(said.code, Some(1), "{said:?}");
    assert_eq!(said.lines[0], "csi-sidecar was not asked (give --endpoint for its own state)", "{said:?}");
    assert!(warning(&said) && said.lines[1].ends_with(&format!(": {last}")), "{said:?}");
    let nobody = format!("127.0.0.1:{}", free_port());
    let said = env.explain("pvc", &key, &[&nobody]).await;
    assert_eq!(said.code, Some(1), "{said:?}");
    assert!(said.lines[0].starts_with(&format!("csi-sidecar's debug endpoint did not answer: {nobody}: ")), "{said:?}");
    assert!(warning(&said), "{said:?}");
}

#[tokio::test]
async fn a_standby_replica_names_the_leader_and_both_endpoints_give_the_leaders_entry() {
    let env = Env::new("xp-standby").await;
    let _driver = env.driver(|s| s.create_error = Some((Code::Internal, "backend down".into())));
    let le = fast_leader_election(env.ns.name());
    let modules = with_fast_retries(&["provisioner"]);
    let (a, addr_a) = env.serving("csi-sidecar-a", &le, &modules);
    let (b, addr_b) = env.serving("csi-sidecar-b", &le, &modules);
    wait_one_leader(&a, &b).await;
    let (standby, leader) = if leads(&a) { (&addr_b, &addr_a) } else { (&addr_a, &addr_b) };
    let sc = env.storage_class("sc", |_| {}).await;
    env.claim("ha", &sc).await;
    let leases: Api<Lease> = env.ns.api();
    let (lease, holder) = wait_until("a held Lease", T, async || {
        let held = leases.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let held: Vec<(String, String)> = held
            .into_iter()
            .filter_map(|l| Some((l.metadata.name?, l.spec?.holder_identity.filter(|h| !h.is_empty())?)))
            .collect();
        (held.len() == 1, held.first().cloned().unwrap_or_default())
    })
    .await;
    let want = format!(
        "this replica is not the leader (the Lease {}/{lease} is held by {holder}): ask the leader's debug endpoint",
        env.ns.name()
    );
    let key = env.key("ha");
    let said = env
        .explain_until("the standby to name the leader", ("pvc", &key), &[standby], |s| s.lines.first() == Some(&want))
        .await;
    assert_eq!(said.code, Some(1), "{said:?}");
    assert!(
        said.lines[1..].iter().all(|l| l.starts_with("last warning: ProvisioningFailed")),
        "the standby holds nothing of the claim: {said:?}"
    );
    // Both replicas asked: the leader's entry, and no word of a standby.
    let said = env
        .explain_until("the leader's entry through both endpoints", ("pvc", &key), &[standby, leader], |s| {
            s.lines.first().and_then(|l| failed_times(l, "CreateVolume")).is_some()
        })
        .await;
    assert!(!said.lines.iter().any(|l| l.contains("not the leader")), "{said:?}");
    let (_, last, _) = failed_times(&said.lines[0], "CreateVolume").expect("the failure line");
    assert!(last.contains("rpc error: code = Internal desc = backend down"), "{last}");
}

#[tokio::test]
async fn a_claim_of_another_provisioner_is_not_handled_here() {
    let env = Env::new("xp-other").await;
    let _driver = env.driver(|_| ());
    let (_p, addr) = env.serving("csi-sidecar", &[], &["provisioner"]);
    let other = format!("other-{}", env.driver_name);
    let sc = env.ns.scoped("other");
    create(&Api::<StorageClass>::all(env.ns.client().clone()), &storage_class(&sc, &other)).await;
    env.claim("elsewhere", &sc).await;
    let want = format!("not handled here: the claim asks for {other}, this csi-sidecar serves {}", env.driver_name);
    let said = env
        .explain_until("explain to name both drivers", ("pvc", &env.key("elsewhere")), &[&addr], |s| {
            s.lines.first() == Some(&want)
        })
        .await;
    assert_eq!(said.code, Some(1), "{said:?}");
    assert_eq!(said.lines, [want], "{said:?}");
}

#[tokio::test]
async fn bad_input_exits_2_naming_it() {
    let env = Env::new("xp-bad").await;
    let ns = env.ns.name().to_string();
    let (claim, va, x) = (format!("{ns}/nope"), format!("{ns}-absent"), format!("{ns}/x"));
    let cases: [(&str, &str, &[&str], String); 7] = [
        ("pvc", &claim, &[], format!("PersistentVolumeClaim {claim} not found")),
        ("volumesnapshot", &claim, &[], format!("VolumeSnapshot {claim} not found")),
        ("volumeattachment", &va, &[], format!("VolumeAttachment {va} not found")),
        ("pvc", "nope", &[], "want NAMESPACE/NAME for a PersistentVolumeClaim, got \"nope\"".into()),
        ("va", &x, &[], "a VolumeAttachment has no namespace".into()),
        ("pod", &x, &[], "unknown kind \"pod\"".into()),
        ("pvc", &x, &["8080"], "--endpoint \"8080\": want host:port or :port".into()),
    ];
    for (kind, name, endpoints, says) in cases {
        let args = (kind, name, endpoints);
        let said = env.explain(kind, name, endpoints).await;
        assert_eq!(said.code, Some(2), "{args:?}: {said:?}");
        assert!(said.head.is_empty() && said.lines.is_empty(), "{args:?}: nothing on stdout: {said:?}");
        assert!(said.stderr.contains(&says), "{args:?}: {says:?} in {:?}", said.stderr);
    }
    // A --kubeconfig that cannot be read (given last, it wins).
    let absent = env.dir.path().join("absent.kubeconfig");
    let mut args = env.args("pvc", &claim, &[]);
    args.push(format!("--kubeconfig={}", absent.display()));
    let said = explain(&args).await;
    assert_eq!(said.code, Some(2), "{said:?}");
    assert!(said.stderr.contains(&format!("kubeconfig {}: ", absent.display())), "{said:?}");
}

// ---- VolumeSnapshot ----

/// A driver that snapshots (after `edit`), csi-sidecar running the
/// provisioner and the snapshotter, a bound claim `data`, a snapshot class
/// and a VolumeSnapshot `snap` of the claim; (driver, sidecar, address,
/// content name).
async fn snapshot_of_a_claim(env: &Env, edit: impl FnOnce(&mut Script)) -> (FaultDriver, Proc, String, String) {
    let driver = env.driver(|s| {
        s.snapshots = true;
        edit(s);
    });
    let (p, addr) = env.serving("csi-sidecar", &[], &with_fast_retries(&["provisioner", "snapshotter"]));
    let sc = env.storage_class("sc", |_| {}).await;
    env.bound_claim("data", &sc, T).await;
    let snaps = SnapApis::new(env.ns.client(), env.ns.name());
    let class = env.ns.scoped("vsc");
    snaps.class(&class, &env.driver_name, "Delete", serde_json::Value::Null).await;
    let content = snaps.snapshot_of("snap", &class, "data").await;
    (driver, p, addr, content)
}

#[tokio::test]
async fn a_ready_snapshot_is_done() {
    let env = Env::new("xp-vs-ready").await;
    let (_driver, _p, addr, content) = snapshot_of_a_claim(&env, |_| ()).await;
    SnapApis::new(env.ns.client(), env.ns.name()).wait_snapshot_ready("snap", T).await;
    let said = env.explain("volumesnapshot", &env.key("snap"), &[&addr]).await;
    assert_eq!(said.code, Some(0), "{said:?}");
    assert_eq!(said.head, format!("VolumeSnapshot {}: done", env.key("snap")));
    assert_eq!(said.lines, [format!("ready to use (content {content})")], "{said:?}");
}

#[tokio::test]
async fn a_snapshot_of_an_unbound_claim_waits_for_the_claim() {
    let env = Env::new("xp-vs-unbound").await;
    let _driver = env.driver(|s| s.snapshots = true);
    let (_p, addr) = env.serving("csi-sidecar", &[], &["provisioner", "snapshotter"]);
    let sc = env.storage_class("wffc", |c| c.volume_binding_mode = Some("WaitForFirstConsumer".into())).await;
    env.claim("late", &sc).await;
    let snaps = SnapApis::new(env.ns.client(), env.ns.name());
    let class = env.ns.scoped("vsc");
    snaps.class(&class, &env.driver_name, "Delete", serde_json::Value::Null).await;
    snaps.snapshot_of("snap", &class, "late").await;
    let said = env.explain("vs", &env.key("snap"), &[&addr]).await;
    assert_eq!(said.code, Some(1), "{said:?}");
    assert_eq!(
        said.lines.first().map(String::as_str),
        Some("no VolumeSnapshotContent yet: the snapshot-controller makes one once the source claim late is bound"),
        "{said:?}"
    );
}

#[tokio::test]
async fn a_snapshot_the_driver_calls_not_ready_waits_for_it_then_is_done() {
    let env = Env::new("xp-vs-unready").await;
    let (driver, _p, addr, content) = snapshot_of_a_claim(&env, |s| s.snapshot_not_ready = true).await;
    const NOT_READY: &str = "the CSI driver says the snapshot is not ready to use yet";
    let key = env.key("snap");
    let said = env
        .explain_until("explain to say the driver has not finished", ("vs", &key), &[&addr], |s| {
            s.lines.get(1).is_some_and(|l| l.starts_with(NOT_READY))
        })
        .await;
    assert_eq!(said.code, Some(1), "{said:?}");
    assert_eq!(said.lines[0], format!("not ready to use yet (content {content})"), "{said:?}");
    assert!(said.lines[1].starts_with(&format!("{NOT_READY}; next attempt in ")), "{said:?}");
    driver.update(|s| s.snapshot_not_ready = false);
    let said = env.explain_until("the snapshot done", ("vs", &key), &[&addr], |s| s.code == Some(0)).await;
    assert_eq!(said.lines, [format!("ready to use (content {content})")], "{said:?}");
}

#[tokio::test]
async fn a_failing_create_snapshot_is_counted_with_its_last_error() {
    let env = Env::new("xp-vs-failing").await;
    let (driver, _p, addr, content) =
        snapshot_of_a_claim(&env, |s| s.create_snapshot_error = Some((Code::Internal, "no snapshots today".into())))
            .await;
    let said = env
        .explain_until("explain to count two failed CreateSnapshot calls", ("vs", &env.key("snap")), &[&addr], |s| {
            s.lines.get(1).and_then(|l| failed_times(l, "CreateSnapshot")).is_some_and(|(n, _, _)| n >= 2)
        })
        .await;
    assert_eq!(said.code, Some(1), "{said:?}");
    assert_eq!(said.lines[0], format!("not ready to use yet (content {content})"), "{said:?}");
    let (n, last, next) = failed_times(&said.lines[1], "CreateSnapshot").expect("the failure line");
    let calls = driver.snapshot_calls_of(csi_sidecar_integration::fault_driver::SnapshotMethod::Create).len();
    assert!(n as usize <= calls, "{n} failures counted, {calls} CreateSnapshot calls");
    assert!(last.contains("rpc error: code = Internal desc = no snapshots today"), "{last}");
    assert!(next <= 5, "{next}");
}

// ---- VolumeAttachment ----

/// A driver that publishes (after `edit`), a CSINode for it, csi-sidecar
/// running the attacher, and a PV with a VolumeAttachment to the node;
/// (driver, sidecar, address, attachment name, node).
async fn attachment(env: &Env, edit: impl FnOnce(&mut Script)) -> (FaultDriver, Proc, String, String, String) {
    let driver = env.driver(|s| {
        s.publish = true;
        edit(s);
    });
    let node = format!("{}-node", env.ns.name());
    let csinodes: Api<CSINode> = Api::all(env.ns.client().clone());
    create(&csinodes, &csi_node(&node, &env.driver_name, "node-id", &[])).await;
    let (p, addr) = env.serving("csi-sidecar", &[], &with_fast_retries(&["attacher"]));
    let name = format!("{}-va", env.ns.name());
    create(&Api::all(env.ns.client().clone()), &csi_pv(&name, &env.driver_name, "vol-1", "1Mi")).await;
    create(&Api::all(env.ns.client().clone()), &volume_attachment(&name, &env.driver_name, &node, &name)).await;
    (driver, p, addr, name, node)
}

#[tokio::test]
async fn an_attached_volume_attachment_is_done() {
    let env = Env::new("xp-va-done").await;
    let (_driver, _p, addr, name, node) = attachment(&env, |_| ()).await;
    let vas: Api<VolumeAttachment> = Api::all(env.ns.client().clone());
    wait_for(&vas, &name, T, |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
    let said = env.explain("volumeattachment", &name, &[&addr]).await;
    assert_eq!(said.code, Some(0), "{said:?}");
    assert_eq!(said.head, format!("VolumeAttachment {name}: done"));
    assert_eq!(said.lines, [format!("attached to node {node}")], "{said:?}");
}

#[tokio::test]
async fn a_failing_controller_publish_is_counted_then_the_attachment_is_done() {
    let env = Env::new("xp-va-failing").await;
    let (driver, _p, addr, name, node) =
        attachment(&env, |s| s.publish_error = Some((Code::Internal, "the backend refuses".into()))).await;
    let said = env
        .explain_until("explain to count two failed publishes", ("va", &name), &[&addr], |s| {
            s.lines.get(1).and_then(|l| failed_times(l, "ControllerPublishVolume")).is_some_and(|(n, _, _)| n >= 2)
        })
        .await;
    assert_eq!(said.code, Some(1), "{said:?}");
    assert_eq!(said.head, format!("VolumeAttachment {name}: waiting"));
    assert_eq!(said.lines[0], format!("not attached to node {node} yet"), "{said:?}");
    let (n, last, next) = failed_times(&said.lines[1], "ControllerPublishVolume").expect("the failure line");
    assert!(n as usize <= driver.publish_calls().len(), "{n} failures, {} calls", driver.publish_calls().len());
    assert!(last.contains("the backend refuses"), "{last}");
    assert!(next <= 5, "{next}");
    let status = said.lines.iter().find_map(|l| l.strip_prefix("the attachment's status says: "));
    assert!(status.is_some_and(|e| e.contains("the backend refuses")), "the attachError: {said:?}");
    driver.update(|s| s.publish_error = None);
    let said = env.explain_until("the attachment done", ("va", &name), &[&addr], |s| s.code == Some(0)).await;
    assert_eq!(said.lines, [format!("attached to node {node}")], "{said:?}");
}
