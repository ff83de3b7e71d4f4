use std::time::Duration;

use super::*;
use crate::modules::{
    attacher::config::AttacherFlags, prober::config::ProberFlags, provisioner::config::ProvisionerFlags,
    registrar::config::RegistrarFlags, resizer::config::ResizerFlags, snapshotter::config::SnapshotterFlags,
};

fn argv(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn run(s: &str) -> Invocation {
    match parse(&argv(s)) {
        Command::Run(inv) => *inv,
        Command::Exit { code, text } => panic!("{s}: exit {code}: {text}"),
    }
}

fn exit(s: &str) -> (u8, String) {
    match parse(&argv(s)) {
        Command::Exit { code, text } => (code, text),
        Command::Run(inv) => panic!("{s}: expected exit, got {inv:?}"),
    }
}

fn registrar(inv: &Invocation) -> &RegistrarFlags {
    inv.modules.iter().find_map(ModuleConfig::flags::<RegistrarFlags>).expect("registrar configured")
}

fn prober(inv: &Invocation) -> &ProberFlags {
    inv.modules.iter().find_map(ModuleConfig::flags::<ProberFlags>).expect("prober configured")
}

#[test]
fn argv0_selects_the_module_for_every_upstream_name() {
    let table: &[(&str, &str)] = &[
        ("/usr/bin/livenessprobe", "prober"),
        ("livenessprobe", "prober"),
        ("prober", "prober"),
        ("/csi-node-driver-registrar", "registrar"),
        ("registrar", "registrar"),
    ];
    for (a0, module) in table {
        let inv = run(a0);
        assert_eq!(inv.modules.len(), 1, "{a0}");
        assert_eq!(inv.modules[0].name(), *module, "{a0}");
    }
}

#[test]
fn subcommand_and_argv0_take_the_same_path() {
    let a = run("livenessprobe --csi-address=/csi/csi.sock --probe-timeout=5s");
    let b = run("csi-sidecar prober -csi-address /csi/csi.sock -probe-timeout 5s");
    assert_eq!(a.shared, b.shared);
    assert_eq!(a.modules, b.modules);
    assert_eq!(prober(&a).probe_timeout, Duration::from_secs(5));
}

#[test]
fn upstream_defaults() {
    let inv = run("livenessprobe");
    assert_eq!(inv.shared.csi_address(), "/run/csi/socket");
    assert_eq!(prober(&inv).probe_timeout, Duration::from_secs(3));
    let inv = run("csi-node-driver-registrar");
    let r = registrar(&inv);
    assert_eq!(r.timeout, Duration::from_secs(1));
    assert_eq!(r.plugin_registration_path, "/registration");
    assert_eq!(r.kubelet_registration_path, None);
}

#[test]
fn several_modules_with_their_own_flags_and_shared_ones_once() {
    let inv = run(
        "csi-sidecar --csi-address=/csi/csi.sock --http-endpoint=:9809 registrar --kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock --timeout=2s prober --probe-timeout=3s -v=5",
    );
    assert_eq!(inv.modules.len(), 2);
    assert_eq!(inv.shared.csi_address(), "/csi/csi.sock");
    assert_eq!(inv.shared.http_endpoint.as_deref(), Some(":9809"));
    assert_eq!(inv.shared.verbosity(), 5);
    assert_eq!(registrar(&inv).timeout, Duration::from_secs(2));
    assert_eq!(registrar(&inv).kubelet_registration_path.as_deref(), Some("/var/lib/kubelet/plugins/x/csi.sock"));
    assert_eq!(prober(&inv).probe_timeout, Duration::from_secs(3));
}

#[test]
fn shared_flags_repeated_in_segments_must_agree() {
    let inv = run("csi-sidecar registrar --csi-address=/a --kubelet-registration-path=/k prober --csi-address=/a");
    assert_eq!(inv.shared.csi_address(), "/a");
    let (code, text) =
        exit("csi-sidecar registrar --csi-address=/a --kubelet-registration-path=/k prober --csi-address=/b");
    assert_eq!(code, 2);
    assert!(
        text.contains("--csi-address") && text.contains("\"/a\" (registrar)") && text.contains("\"/b\" (prober)"),
        "{text}"
    );
}

#[test]
fn each_module_has_its_own_api_budget_in_its_segment_else_the_top_levels() {
    let inv = run(
        "csi-sidecar --kube-api-qps=8 provisioner --kube-api-qps=20 resizer attacher --kube-api-burst=30 --kube-api-qps=-1",
    );
    let got: Vec<_> = inv.budgets.iter().map(|b| (b.module, b.qps, b.burst)).collect();
    assert_eq!(got, [("provisioner", 20.0, 10), ("resizer", 8.0, 10), ("attacher", -1.0, 30)]);
    // Node modules have no API budget; a bad value still names its module.
    assert!(run("csi-sidecar registrar --kubelet-registration-path=/k prober").budgets.is_empty());
    let (code, text) = exit("csi-sidecar provisioner resizer --kube-api-qps=fast");
    assert_eq!(code, 2);
    assert!(text.contains("resizer") && text.contains("kube-api-qps"), "{text}");
}

#[test]
fn unknown_flag_exits_2_naming_flag_and_module() {
    let (code, text) = exit("csi-sidecar prober --nope=1");
    assert_eq!(code, 2);
    assert!(text.contains("prober") && text.contains("-nope"), "{text}");
    let (code, text) = exit("livenessprobe --kubelet-registration-path=/x");
    assert_eq!(code, 2, "registrar's flag is unknown to the prober");
    assert!(text.contains("kubelet-registration-path"), "{text}");
}

#[test]
fn bad_value_exits_2_naming_flag_value_and_module() {
    let (code, text) = exit("csi-sidecar prober --probe-timeout=soon");
    assert_eq!(code, 2);
    assert!(text.contains("prober") && text.contains("probe-timeout") && text.contains("soon"), "{text}");
    let (code, text) = exit("csi-sidecar registrar -v=loud");
    assert_eq!(code, 2);
    assert!(text.contains("registrar") && text.contains("--v") && text.contains("loud"), "{text}");
}

/// `--reconcile-sync=0` would make the ListVolumes reconciler's ticker
/// panic (upstream spins the reconciler without pause): a usage error.
#[test]
fn a_zero_reconcile_period_exits_2_naming_the_flag() {
    for argv in ["csi-attacher --reconcile-sync=0", "csi-sidecar attacher --reconcile-sync=0s"] {
        let (code, text) = exit(argv);
        assert_eq!(code, 2, "{argv}: {text}");
        assert!(text.contains("attacher") && text.contains("--reconcile-sync"), "{argv}: {text}");
    }
    let inv = run("csi-attacher --reconcile-sync=1ms");
    assert!(matches!(inv.modules[0].flags::<AttacherFlags>(), Some(a) if a.reconcile_sync == Duration::from_millis(1)));
}

#[test]
fn deprecated_flags_are_accepted_with_a_warning() {
    let inv =
        run("csi-node-driver-registrar --kubelet-registration-path=/k --connection-timeout=30s --health-port=9809");
    assert_eq!(inv.shared.health_port.as_deref(), Some("9809"));
    assert!(inv.warnings.iter().any(|w| w.contains("connection-timeout")), "{:?}", inv.warnings);
    assert!(inv.warnings.iter().any(|w| w.contains("health-port")), "{:?}", inv.warnings);
}

#[test]
fn booleans_and_compat_no_ops() {
    let inv = run("csi-node-driver-registrar --enable-pprof=false -automaxprocs --logging-format=json");
    assert!(!inv.shared.enable_pprof);
    assert!(inv.shared.automaxprocs);
    assert_eq!(inv.shared.logging_format.as_deref(), Some("json"));
}

#[test]
fn list_help_version() {
    let (code, text) = exit("csi-sidecar --list");
    assert_eq!(code, 0);
    for m in [
        "provisioner",
        "attacher",
        "registrar",
        "prober",
        "livenessprobe",
        "csi-node-driver-registrar",
        "snapshotter",
        "csi-snapshotter",
    ] {
        assert!(text.contains(m), "{m} missing from --list:\n{text}");
    }
    let (code, text) = exit("csi-sidecar --help");
    assert_eq!(code, 0);
    assert!(text.contains("--csi-address"));
    let (code, text) = exit("csi-sidecar --version");
    assert_eq!((code, text), (0, format!("csi-sidecar {VERSION}\n")));
    let (code, text) = exit("csi-node-driver-registrar --version");
    assert_eq!((code, text), (0, format!("csi-node-driver-registrar {VERSION}\n")));
    let (code, text) = exit("livenessprobe --help");
    assert_eq!(code, 0);
    assert!(text.contains("--probe-timeout") && text.contains("--csi-address"), "{text}");
}

#[test]
fn snapshotter_flags_and_defaults() {
    let inv = run("csi-snapshotter --csi-address=/csi/csi.sock --leader-election --http-endpoint=:8080 -v=5");
    let Some(s) = inv.modules[0].flags::<SnapshotterFlags>() else { panic!("snapshotter expected") };
    assert_eq!(s.worker_threads, 10);
    assert_eq!(s.timeout, Duration::from_secs(60));
    assert_eq!(s.resync_period, Duration::from_secs(900));
    assert_eq!(s.snapshot_name_prefix, "snapshot");
    assert_eq!(s.snapshot_name_uuid_length, -1);
    assert!(!s.extra_create_metadata && !s.node_deployment);
    assert!(inv.shared.leader_election);
    let inv = run(
        "csi-sidecar snapshotter --worker-threads=3 --snapshot-name-prefix=snp --snapshot-name-uuid-length=8 --extra-create-metadata=true --timeout=30s --feature-gates=CSIVolumeGroupSnapshot=false --groupsnapshot-name-prefix=g --groupsnapshot-name-uuid-length=-1",
    );
    let Some(s) = inv.modules[0].flags::<SnapshotterFlags>() else { panic!("snapshotter expected") };
    assert_eq!((s.worker_threads, s.snapshot_name_uuid_length), (3, 8));
    assert_eq!(s.snapshot_name_prefix, "snp");
    assert!(s.extra_create_metadata);
    assert!(!s.validate().unwrap().volume_group_snapshot);
    let inv = run("csi-snapshotter --snapshot-name-prefix=");
    assert!(inv.modules[0].validate().unwrap_err().to_string().contains("Snapshot name prefix cannot be of length 0"));
    let (code, text) = exit("csi-snapshotter --workers=3");
    assert_eq!(code, 2, "upstream's flag is --worker-threads: {text}");
}

#[test]
fn unknown_module_and_duplicates() {
    let (code, text) = exit("csi-sidecar frobnicator");
    assert_eq!(code, 2);
    assert!(text.contains("frobnicator"));
    let (code, text) = exit("csi-sidecar prober prober");
    assert_eq!(code, 2);
    assert!(text.contains("twice"), "{text}");
    let (code, _) = exit("csi-sidecar --csi-address=/x");
    assert_eq!(code, 2);
}

#[test]
fn readme_flag_reference_matches_the_code() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/command-line.md"))
        .expect("docs/command-line.md");
    let reference = flag_reference_markdown();
    assert!(
        readme.contains(&reference),
        "docs/command-line.md's flag reference is out of date; replace it with:\n\n{reference}\nEND"
    );
}

#[test]
fn resizer_flags_and_defaults() {
    let inv = run("csi-resizer --csi-address=/csi/csi.sock --leader-election --http-endpoint=:8080 -v=5");
    let Some(r) = inv.modules[0].flags::<ResizerFlags>() else { panic!("resizer expected") };
    assert_eq!(r.workers, 10);
    assert_eq!(r.timeout, Duration::from_secs(10));
    assert_eq!(r.resync_period, Duration::from_secs(600));
    assert_eq!(r.retry_interval_start, Duration::from_secs(1));
    assert_eq!(r.retry_interval_max, Duration::from_secs(300));
    assert!(r.handle_volume_inuse_error && !r.extra_modify_metadata && r.master.is_none());
    assert!(inv.shared.leader_election);
    let inv = run(
        "csi-sidecar resizer --workers=3 --handle-volume-inuse-error=false --extra-modify-metadata --master=https://a:6443 --feature-gates=AnnotateFsResize=false",
    );
    let Some(r) = inv.modules[0].flags::<ResizerFlags>() else { panic!("resizer expected") };
    assert_eq!(r.workers, 3);
    assert!(!r.handle_volume_inuse_error && r.extra_modify_metadata);
    assert_eq!(inv.modules[0].master(), Some("https://a:6443"));
    assert!(!r.validate().unwrap().annotate_fs_resize);
    let (code, text) = exit("csi-resizer --worker-threads=3");
    assert_eq!(code, 2, "upstream's flag is --workers: {text}");
    let inv = run("csi-resizer --feature-gates=Topology=true");
    assert!(inv.modules[0].validate().unwrap_err().to_string().contains("unrecognized feature gate: Topology"));
}

#[test]
fn provisioner_flags_and_defaults() {
    let inv = run(
        "csi-provisioner --csi-address=/csi/csi.sock --leader-election --kube-api-qps=20 -v=5 --timeout=30s --immediate-topology=false --feature-gates=Topology=true",
    );
    let Some(p) = inv.modules[0].flags::<ProvisionerFlags>() else { panic!("provisioner expected") };
    assert_eq!(p.timeout, Duration::from_secs(30));
    assert!(!p.immediate_topology);
    assert_eq!(p.volume_name_prefix, "pvc");
    assert_eq!(p.volume_name_uuid_length, -1);
    assert_eq!(p.worker_threads, 100);
    assert_eq!(p.retry_interval_max, Duration::from_secs(300));
    assert!(inv.shared.leader_election);
    assert_eq!(
        inv.budgets,
        [crate::k8s::ModuleBudget { module: "provisioner", qps: 20.0, burst: 10 }],
        "the sidecar's own budget"
    );
    let inv = run("csi-provisioner --immediate-topology");
    let Some(p) = inv.modules[0].flags::<ProvisionerFlags>() else { panic!() };
    assert!(p.immediate_topology, "a bare default-true boolean stays true");
}
