//! manifests/: the example pods' shape and security, their csi-sidecar
//! command lines against the real binary, and the whole check script
//! (integration/scripts/check-manifests.sh: hadolint, the image's symlink
//! tree, helm lint/template of every value set, and a server-side dry-run
//! apply of every document against a real kube-apiserver), plus the chart's
//! RBAC against manifests/rbac.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use csi_sidecar_integration::yaml::{documents as load, kind};
use csi_sidecar_integration::{cluster::launcher_bin, free_port, sidecar_bin, symlinked_bin, workspace_root};
use serde_json::Value;

const SIDECAR_IMAGE: &str = "csi-sidecar:dev";
const DRIVER_IMAGE: &str = "registry.k8s.io/sig-storage/hostpathplugin:v1.18.0";

fn manifests() -> PathBuf {
    workspace_root().join("manifests")
}

/// (file, workload) for every Deployment/DaemonSet of manifests/examples.
fn example_workloads() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for f in ["controller.yaml", "node.yaml", "controller-drop-in.yaml", "node-drop-in.yaml"] {
        for d in load(&manifests().join("examples").join(f)) {
            if matches!(kind(&d), "Deployment" | "DaemonSet") {
                out.push((f.to_string(), d));
            }
        }
    }
    assert_eq!(out.len(), 4);
    out
}

fn containers(workload: &Value) -> Vec<Value> {
    workload["spec"]["template"]["spec"]["containers"].as_array().cloned().unwrap_or_default()
}

fn sidecars(workload: &Value) -> Vec<Value> {
    containers(workload).into_iter().filter(|c| c["image"] == SIDECAR_IMAGE).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

/// The SYMLINKS of manifests/Dockerfile (the image's binary names).
fn image_symlinks() -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifests().join("Dockerfile")).expect("Dockerfile");
    let line = text.lines().find_map(|l| l.strip_prefix("ARG SYMLINKS=\"")).expect("ARG SYMLINKS line");
    line.trim_end_matches('"').split_whitespace().map(str::to_string).collect()
}

#[test]
fn combined_examples_run_one_csi_sidecar_container_per_pod() {
    for (file, w) in example_workloads().into_iter().filter(|(f, _)| !f.contains("drop-in")) {
        let s = sidecars(&w);
        assert_eq!(s.len(), 1, "{file}: one csi-sidecar container");
        assert!(s[0].get("command").is_none(), "{file}: the image's entrypoint /csi-sidecar runs");
        let args = strings(&s[0]["args"]);
        let modules: Vec<&str> = args.iter().map(String::as_str).filter(|a| !a.starts_with('-')).collect();
        let want: &[&str] = if kind(&w) == "Deployment" {
            &["provisioner", "resizer", "snapshotter", "prober"]
        } else {
            &["registrar", "prober"]
        };
        assert_eq!(modules, want, "{file}: {args:?}");
        assert_eq!(containers(&w).len(), 2, "{file}: the driver and csi-sidecar");
    }
}

#[test]
fn drop_in_examples_swap_only_the_image_and_keep_upstream_binary_names() {
    let links = image_symlinks();
    for (file, w) in example_workloads().into_iter().filter(|(f, _)| f.contains("drop-in")) {
        let s = sidecars(&w);
        let want = if kind(&w) == "Deployment" { 4 } else { 2 };
        assert_eq!(s.len(), want, "{file}: one container per upstream sidecar");
        for c in s {
            let command = strings(&c["command"]);
            assert_eq!(command.len(), 1, "{file}: {c}");
            let name = command[0].strip_prefix('/').expect("absolute command");
            assert!(links.contains(name), "{file}: /{name} is not a symlink of the image ({links:?})");
            assert!(
                [
                    "csi-provisioner",
                    "csi-attacher",
                    "csi-resizer",
                    "csi-snapshotter",
                    "csi-node-driver-registrar",
                    "livenessprobe"
                ]
                .contains(&name),
                "{file}: {name} is not an upstream binary name"
            );
        }
    }
}

#[test]
fn csi_sidecar_containers_are_locked_down() {
    for (file, w) in example_workloads() {
        let pod = &w["spec"]["template"]["spec"];
        for c in sidecars(&w) {
            let sc = &c["securityContext"];
            let at = format!("{file} {}", c["name"]);
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{at}");
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{at}");
            assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{at}");
            assert!(sc["capabilities"].get("add").is_none(), "{at}");
            assert!(sc.get("privileged").is_none_or(|p| p == false), "{at}");
            assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{at}");
            if kind(&w) == "Deployment" {
                assert_eq!(sc["runAsNonRoot"], true, "{at}");
                assert_eq!(sc["runAsUser"], 65532, "{at}");
                assert_eq!(
                    pod["securityContext"]["fsGroup"], 65532,
                    "{at}: the socket emptyDir in csi-sidecar's group"
                );
            } else {
                // The documented exception: root-owned kubelet directories.
                assert_eq!(sc["runAsUser"], 0, "{at}");
                assert_eq!(pod["automountServiceAccountToken"], false, "{at}");
            }
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                assert!(m.get("mountPropagation").is_none(), "{at}: no mount propagation for csi-sidecar");
            }
        }
    }
}

#[test]
fn driver_liveness_probe_points_at_the_prober() {
    for (file, w) in example_workloads() {
        let all = containers(&w);
        let driver = all.iter().find(|c| c["image"] == DRIVER_IMAGE).expect("driver container");
        let probe = &driver["livenessProbe"]["httpGet"];
        let port = probe["port"].as_str().expect("named port");
        let owner = all
            .iter()
            .find(|c| c["ports"].as_array().into_iter().flatten().any(|p| p["name"] == port))
            .unwrap_or_else(|| panic!("{file}: no container has port {port}"));
        assert_eq!(owner["image"], SIDECAR_IMAGE, "{file}");
        let prober_runs_alone = strings(&owner["command"]) == ["/livenessprobe"];
        let path = probe["path"].as_str().unwrap_or_default();
        if prober_runs_alone {
            assert_eq!(path, "/healthz", "{file}: the livenessprobe container's only check");
        } else {
            assert_eq!(path, "/healthz/prober", "{file}: the prober's check alone, not the whole /healthz");
            assert!(strings(&owner["args"]).iter().any(|a| a == "prober"), "{file}");
        }
    }
}

/// Starts a csi-sidecar container's command line with the real binary (the
/// driver address moved to a missing socket in `dir`, HTTP to 127.0.0.1, no
/// kubeconfig) and checks it is not a usage error (status 2): every flag
/// and module is known and every value parses.
fn assert_command_line_accepted(at: &str, c: &Value, dir: &Path) {
    let socket = dir.join("no-driver.sock");
    let command = strings(&c["command"]);
    let program = match command.first() {
        None => sidecar_bin(),
        Some(cmd) => symlinked_bin(dir, cmd.trim_start_matches('/')),
    };
    let env: Vec<(String, String)> = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
        .collect();
    let mut args: Vec<String> = strings(&c["args"])
        .into_iter()
        .map(|a| env.iter().fold(a, |a, (k, v)| a.replace(&format!("$({k})"), v)))
        .map(|a| {
            if a.starts_with("--csi-address=") {
                format!("--csi-address={}", socket.display())
            } else if a.starts_with("--http-endpoint=") || a.starts_with("--health-port=") {
                format!("--http-endpoint=127.0.0.1:{}", free_port())
            } else {
                a
            }
        })
        .collect();
    if let Some(i) = args.iter().position(|a| a == "registrar") {
        args.insert(i + 1, format!("--plugin-registration-path={}", dir.display()));
    } else if command.first().is_some_and(|c| c.contains("registrar")) {
        args.push(format!("--plugin-registration-path={}", dir.display()));
    }
    let at = format!("{at} {}: {} {}", c["name"], program.display(), args.join(" "));
    let mut child = Command::new(&program)
        .args(&args)
        .env("KUBECONFIG", dir.join("no-kubeconfig"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{at}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > Duration::from_millis(1500) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(status.and_then(|s| s.code()), Some(2), "{at}: usage error:\n{stderr}");
    assert!(!stderr.contains("unknown flag") && !stderr.contains("unknown module"), "{at}:\n{stderr}");
}

/// Every csi-sidecar command line of the examples is accepted by the real
/// binary.
#[test]
fn example_command_lines_are_accepted_by_csi_sidecar() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (file, w) in example_workloads() {
        for c in sidecars(&w) {
            assert_command_line_accepted(&file, &c, dir.path());
        }
    }
}

/// controller.yaml binds the controller ServiceAccount to every ClusterRole
/// and Role of the modules' files in manifests/rbac, and to nothing else.
#[test]
fn controller_service_account_is_bound_to_every_module_role() {
    let mut roles = BTreeSet::new();
    for entry in std::fs::read_dir(manifests().join("rbac")).expect("manifests/rbac") {
        let path = entry.expect("entry").path();
        if matches!(path.file_name().and_then(|f| f.to_str()), Some("controller.yaml" | "node.yaml")) {
            continue;
        }
        for d in load(&path) {
            if matches!(kind(&d), "ClusterRole" | "Role") {
                roles.insert((kind(&d).to_string(), d["metadata"]["name"].as_str().unwrap_or_default().to_string()));
            }
        }
    }
    assert!(roles.contains(&("ClusterRole".into(), "csi-sidecar-health-monitor".into())), "{roles:?}");
    let mut bound = BTreeSet::new();
    for d in load(&manifests().join("rbac/controller.yaml")) {
        if matches!(kind(&d), "ClusterRoleBinding" | "RoleBinding") {
            let subjects = d["subjects"].as_array().cloned().unwrap_or_default();
            assert!(
                subjects.iter().all(|s| s["kind"] == "ServiceAccount" && s["name"] == "csi-sidecar-controller"),
                "{d}"
            );
            let role = &d["roleRef"];
            bound.insert((
                role["kind"].as_str().unwrap_or_default().to_string(),
                role["name"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    assert_eq!(bound, roles, "bindings of rbac/controller.yaml vs the modules' roles");
}

/// ClusterRole/Role rules as (apiGroup, resource, verb) triples.
fn rules(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in role["rules"].as_array().into_iter().flatten() {
        for g in strings(&r["apiGroups"]) {
            for res in strings(&r["resources"]) {
                for v in strings(&r["verbs"]) {
                    out.insert((g.clone(), res.clone(), v));
                }
            }
        }
    }
    out
}

/// A module row's ClusterRole rules as (apiGroup, resource, verb) triples.
fn row_rules(row: &csi_sidecar::modules::ModuleDesc) -> BTreeSet<(String, String, String)> {
    let triples = row.cluster_rules.iter().flat_map(|rule| rule.triples());
    triples.map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string())).collect()
}

/// Each controller module's ClusterRole in `manifests/rbac/<name>.yaml`
/// grants exactly what its row says (the chart is checked against the
/// manifests below); a node module has neither.
#[test]
fn every_rows_cluster_rules_are_its_manifests_cluster_role() {
    for row in csi_sidecar::modules::MODULES {
        let path = manifests().join("rbac").join(format!("{}.yaml", row.name));
        if row.cluster_rules.is_empty() {
            assert!(!path.exists(), "{}: a manifest without rules in the row", row.name);
            continue;
        }
        let docs = load(&path);
        let role = find(&docs, "ClusterRole", &format!("csi-sidecar-{}", row.name));
        assert_eq!(rules(role), row_rules(row), "{}: manifests/rbac vs the module row", row.name);
    }
}

fn find<'a>(docs: &'a [Value], want_kind: &str, name_suffix: &str) -> &'a Value {
    docs.iter()
        .find(|d| kind(d) == want_kind && d["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(name_suffix)))
        .unwrap_or_else(|| panic!("no {want_kind} *{name_suffix}"))
}

#[test]
fn check_manifests_script_passes_and_the_chart_rbac_equals_manifests_rbac() {
    let out = tempfile::tempdir().expect("tempdir");
    let script = workspace_root().join("integration/scripts/check-manifests.sh");
    let started = Instant::now();
    let result = Command::new("bash")
        .arg(&script)
        .env("CSI_SIDECAR_BIN", sidecar_bin())
        .env("CSI_SIDECAR_CLUSTER_BIN", launcher_bin())
        .env("CHECK_MANIFESTS_OUT", out.path())
        .stdin(Stdio::null())
        .output()
        .expect("run check-manifests.sh");
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    eprintln!("{stderr}");
    assert!(result.status.success(), "check-manifests.sh failed ({}):\n{stdout}", result.status);
    eprintln!("{}(check-manifests.sh: {:.1?})", stdout, started.elapsed());
    assert!(stdout.contains("check-manifests: ok:"), "{stdout}");

    // The chart's RBAC is the static files' RBAC.
    let static_prov = load(&manifests().join("rbac/provisioner.yaml"));
    let static_att = load(&manifests().join("rbac/attacher.yaml"));
    let default = load(&out.path().join("chart-default.yaml"));
    assert_eq!(
        rules(find(&default, "ClusterRole", "-provisioner")),
        rules(find(&static_prov, "ClusterRole", "-provisioner")),
        "chart vs manifests/rbac/provisioner.yaml"
    );
    assert_eq!(
        rules(find(&default, "Role", "-leader-election")),
        rules(find(&static_prov, "Role", "-leader-election")),
        "leader election"
    );
    let with_attacher = load(&out.path().join("chart-drop-in-attacher.yaml"));
    assert_eq!(
        rules(find(&with_attacher, "ClusterRole", "-attacher")),
        rules(find(&static_att, "ClusterRole", "-attacher")),
        "chart vs manifests/rbac/attacher.yaml"
    );
    let static_rsz = load(&manifests().join("rbac/resizer.yaml"));
    assert_eq!(
        rules(find(&with_attacher, "ClusterRole", "-resizer")),
        rules(find(&static_rsz, "ClusterRole", "-resizer")),
        "chart vs manifests/rbac/resizer.yaml"
    );
    let static_snap = load(&manifests().join("rbac/snapshotter.yaml"));
    assert_eq!(
        rules(find(&with_attacher, "ClusterRole", "-snapshotter")),
        rules(find(&static_snap, "ClusterRole", "-snapshotter")),
        "chart vs manifests/rbac/snapshotter.yaml"
    );
    // The health monitor: by default (the drop-in rendering leaves
    // patchClaimStatus unset) the manifest's rules, without the claim
    // status rule it leaves commented out, which upstream does not grant;
    // with patchClaimStatus: true (the combined rendering) plus that rule.
    // Its Lease rules those of the chart's Role.
    let static_hm = load(&manifests().join("rbac/health-monitor.yaml"));
    let combined = load(&out.path().join("chart-combined.yaml"));
    let claim_status: (String, String, String) = ("".into(), "persistentvolumeclaims/status".into(), "patch".into());
    let default_hm = rules(find(&with_attacher, "ClusterRole", "-health-monitor"));
    assert!(!default_hm.contains(&claim_status), "the default health monitor patches claim status: {default_hm:?}");
    assert_eq!(
        default_hm,
        rules(find(&static_hm, "ClusterRole", "-health-monitor")),
        "chart (patchClaimStatus unset) vs manifests/rbac/health-monitor.yaml"
    );
    let mut opt_in = rules(find(&combined, "ClusterRole", "-health-monitor"));
    assert!(opt_in.remove(&claim_status), "patchClaimStatus: true grants no claim status patch: {opt_in:?}");
    assert_eq!(
        opt_in,
        rules(find(&static_hm, "ClusterRole", "-health-monitor")),
        "chart (patchClaimStatus: true) vs manifests/rbac/health-monitor.yaml plus the status rule"
    );
    assert_eq!(
        rules(find(&combined, "Role", "-leader-election")),
        rules(find(&static_hm, "Role", "-leader-election")),
        "health monitor leader election"
    );
    assert!(
        !default.iter().any(|d| d["metadata"]["name"].as_str().is_some_and(|n| n.contains("health-monitor"))),
        "no health monitor RBAC unless enabled"
    );
    // Capacity tracking's namespaced Role: the manifest's, plus the
    // ReplicaSet read the manifest leaves commented out (level 2 here).
    let capacity = load(&out.path().join("chart-capacity.yaml"));
    let mut chart_cap = rules(find(&capacity, "Role", "-provisioner-capacity"));
    assert!(chart_cap.remove(&("apps".into(), "replicasets".into(), "get".into())), "level 2 reads the ReplicaSet");
    assert_eq!(
        chart_cap,
        rules(find(&static_prov, "Role", "-provisioner-capacity")),
        "chart vs manifests/rbac/provisioner.yaml (capacity)"
    );
    assert!(
        !default.iter().any(|d| d["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-provisioner-capacity"))),
        "no capacity Role unless enabled"
    );
    // The narrower Secrets alternative: no cluster-wide secrets rule, a Role per namespace.
    let narrow = load(&out.path().join("chart-attacher.yaml"));
    for role in ["-provisioner", "-attacher"] {
        assert!(
            !rules(find(&narrow, "ClusterRole", role)).iter().any(|(_, r, _)| r == "secrets"),
            "{role}: secrets granted cluster-wide"
        );
    }
    let secret_roles: Vec<&Value> =
        narrow.iter().filter(|d| kind(d) == "Role" && rules(d).iter().any(|(_, r, _)| r == "secrets")).collect();
    assert_eq!(secret_roles.len(), 2, "one Role per listed namespace");
    // Every csi-sidecar command line the chart renders is accepted by the binary.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut checked = 0;
    for entry in std::fs::read_dir(out.path()).expect("out dir") {
        let path = entry.expect("entry").path();
        let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        for d in load(&path).iter().filter(|d| matches!(kind(d), "Deployment" | "DaemonSet")) {
            for c in sidecars(d) {
                assert_command_line_accepted(&file, &c, dir.path());
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 31, "rendered csi-sidecar containers");
    // Changed block tracking: the server's TLS Secret mounted where its
    // flags point, the Service onto its gRPC port, the SnapshotMetadataService.
    let cbt = load(&out.path().join("chart-snapshot-metadata.yaml"));
    let deployment = cbt.iter().find(|d| kind(d) == "Deployment").expect("the controller Deployment");
    let container = sidecars(deployment).into_iter().next().expect("the csi-sidecar container");
    let args = strings(&container["args"]);
    for want in ["--tls-cert=/tls/tls.crt", "--tls-key=/tls/tls.key", "--port=50051", "--audience=hostpath-backup"] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    assert!(container["volumeMounts"].as_array().is_some_and(|m| m.iter().any(|v| v["mountPath"] == "/tls")));
    let service = find(&cbt, "Service", "-snapshot-metadata");
    assert_eq!(service["spec"]["ports"][0]["port"], 6443);
    let cr = cbt.iter().find(|d| kind(d) == "SnapshotMetadataService").expect("the SnapshotMetadataService");
    assert_eq!(cr["metadata"]["name"], "hostpath.csi.k8s.io");
    assert_eq!(cr["spec"]["address"], "csi-sidecar-snapshot-metadata.csi-sidecar-check:6443");
    // controller.debugEndpoints: the flag for the controller modules only
    // (not the drop-in livenessprobe, which refuses it), off by default.
    let debug_flag = |set: &str| -> Vec<(String, bool)> {
        let docs = load(&out.path().join(format!("chart-{set}.yaml")));
        let controller = docs.iter().find(|d| kind(d) == "Deployment").expect("the controller Deployment");
        sidecars(controller)
            .iter()
            .map(|c| {
                let name = c["name"].as_str().unwrap_or_default().to_string();
                (name, strings(&c["args"]).iter().any(|a| a == "--enable-debug-endpoints"))
            })
            .collect()
    };
    assert_eq!(debug_flag("default"), [("csi-sidecar".to_string(), false)]);
    assert_eq!(debug_flag("combined"), [("csi-sidecar".to_string(), true)]);
    assert_eq!(debug_flag("drop-in"), [("csi-provisioner".to_string(), true), ("liveness-probe".to_string(), false)]);
    // The node ServiceAccount never gets a token, in every rendering.
    for entry in std::fs::read_dir(out.path()).expect("out dir") {
        let path = entry.expect("entry").path();
        for d in load(&path) {
            if kind(&d) == "ServiceAccount" && d["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-node")) {
                assert_eq!(d["automountServiceAccountToken"], false, "{}", path.display());
            }
            if kind(&d) == "DaemonSet" {
                assert_eq!(d["spec"]["template"]["spec"]["automountServiceAccountToken"], false, "{}", path.display());
            }
        }
    }
}

/// Each row's values block is in values.yaml and the schema for every pod
/// the row names (`enabled`, `args`, its own `port`, and a boolean per value
/// rule), and each pod's `modules` has no block without a row: the chart's
/// templates loop over the rows (files/modules.yaml), so a row without a
/// block would fail every render, a block without a row would do nothing.
#[test]
fn every_rows_chart_values_block_is_in_values_yaml_and_the_schema() {
    let chart = manifests().join("helm/csi-sidecar");
    let values = load(&chart.join("values.yaml")).into_iter().next().expect("values.yaml");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json")).expect("schema"))
            .expect("schema JSON");
    for pod in ["controller", "node"] {
        let rows: Vec<_> = csi_sidecar::modules::MODULES.iter().filter(|r| r.chart.pods.runs_in(pod)).collect();
        let blocks = values[pod]["modules"].as_object().unwrap_or_else(|| panic!("{pod}.modules"));
        let keys: BTreeSet<&str> = blocks.keys().map(String::as_str).collect();
        let want: BTreeSet<&str> = rows.iter().map(|r| r.chart.values_key).collect();
        assert_eq!(keys, want, "{pod}.modules of values.yaml vs the rows");
        let props = &schema["properties"][pod]["properties"]["modules"]["properties"];
        for row in rows {
            let at = format!("{pod}.modules.{}", row.chart.values_key);
            let block = &blocks[row.chart.values_key];
            assert!(block["enabled"].is_boolean(), "{at}.enabled");
            assert_eq!(block["args"], Value::Array(vec![]), "{at}.args");
            assert_eq!(block["port"].as_u64(), Some(u64::from(row.chart.port)), "{at}.port vs the row");
            for (value, _) in row.chart.value_rules {
                assert!(block[value].is_boolean(), "{at}.{value}: a value rule's switch");
            }
            let required = strings(&props[row.chart.values_key]["required"]);
            for key in ["enabled", "args", "port"] {
                assert!(required.iter().any(|r| r == key), "the schema of {at} requires {key}");
            }
        }
    }
}
