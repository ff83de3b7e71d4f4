//! The chart's monitoring objects (`monitoring:` in
//! manifests/helm/csi-sidecar): off by default; one source of the alerts
//! (the PrometheusRule's groups are the rules ConfigMap's file, which is
//! the committed integration/testdata/monitoring/rules.yaml); promtool
//! accepts the rules and every dashboard query, and its unit tests of the
//! alerts pass, and fail when a threshold or the selector changes or the
//! long-wait alert no longer leaves the normal waits out; every
//! expression selects the release's series; every csi-sidecar metrics port
//! of both layouts is scraped. That the names they use are exported is
//! `monitoring_scrape.rs`.

use std::collections::BTreeSet;

use csi_sidecar_integration::{
    monitoring::{Expr, RELEASE, TESTDATA, all_on, dashboard, expressions, find, promtool, render, rules_file},
    promql, workspace_root,
    yaml::kind,
};
use serde_json::Value;

const RULES_HEADER: &str = "\
# The chart's alerting rules with the default values (release and namespace
# csi-sidecar), rendered from templates/_rules.tpl; integration/tests/no_cluster/monitoring.rs
# checks that this file is the chart's rendering, then runs promtool on it.
";

const ALERTS: &[&str] = &[
    "CsiSidecarCsiErrors",
    "CsiSidecarObjectWaiting",
    "CsiSidecarQueueNotDraining",
    "CsiSidecarNoLeader",
    "CsiSidecarDriverUnreachable",
];

fn set(args: &[&str]) -> Vec<String> {
    args.iter().flat_map(|a| ["--set".to_string(), a.to_string()]).collect()
}

fn with(extra: &[&str]) -> Vec<String> {
    let mut args = all_on();
    args.extend(set(extra));
    args
}

fn alerts(rules: &str) -> Vec<String> {
    let v: Value = serde_saphyr::from_str(rules).expect("rules YAML");
    v["groups"][0]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["alert"].as_str().map(Into::into))
        .collect()
}

#[test]
fn monitoring_is_off_by_default() {
    let docs = render(&[]);
    let kinds: BTreeSet<&str> = docs.iter().map(kind).collect();
    for k in ["ConfigMap", "PrometheusRule", "ServiceMonitor", "PodMonitor", "Service"] {
        assert!(!kinds.contains(k), "{k} rendered by default: {kinds:?}");
    }
    let all: BTreeSet<String> = render(&all_on()).iter().map(|d| kind(d).to_string()).collect();
    for k in ["ConfigMap", "PrometheusRule", "ServiceMonitor", "PodMonitor", "Service"] {
        assert!(all.contains(k), "{k} not rendered with monitoring on: {all:?}");
    }
}

/// The PrometheusRule and the rules ConfigMap come from one template, and
/// the committed file promtool runs on is that rendering.
#[test]
fn one_source_of_the_rules_and_the_committed_file_is_its_rendering() {
    let docs = render(&all_on());
    let file = rules_file(&docs);
    let parsed: Value = serde_saphyr::from_str(&file).expect("the rules file is YAML");
    assert_eq!(find(&docs, "PrometheusRule", "")["spec"], parsed, "PrometheusRule spec vs the rules file");
    assert_eq!(alerts(&file), ALERTS);
    let committed_path = workspace_root().join(TESTDATA).join("rules.yaml");
    let committed = std::fs::read_to_string(&committed_path).expect("the committed rules file");
    let want = format!("{RULES_HEADER}{file}");
    assert!(
        committed == want,
        "{TESTDATA}/rules.yaml is not the chart's rendering (`helm template {RELEASE} manifests/helm/csi-sidecar \
         --namespace {RELEASE} --set monitoring.rulesConfigMap.enabled=true`, key csi-sidecar-rules.yaml); \
         replace it with:\n{want}END"
    );
    // Without leader election there is no Lease to lose.
    let no_le = rules_file(&render(&with(&["controller.leaderElection.enabled=false"])));
    assert!(!alerts(&no_le).iter().any(|a| a == "CsiSidecarNoLeader"), "{no_le}");
    assert_eq!(alerts(&no_le).len(), ALERTS.len() - 1);
}

/// `promtool test rules` of the committed unit tests against a rendering
/// with `extra` values, in a temp dir: promtool's success and output.
fn unit_tests_against(extra: &[&str]) -> (bool, String) {
    unit_tests_with(with(&[]).into_iter().chain(set(extra)).collect())
}

/// The same, against a rendering with these helm arguments.
fn unit_tests_with(args: Vec<String>) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), rules_file(&render(&args))).expect("write rules");
    std::fs::copy(workspace_root().join(TESTDATA).join("rules-test.yaml"), dir.path().join("rules-test.yaml"))
        .expect("copy the unit tests");
    promtool(dir.path(), &["test", "rules", "rules-test.yaml"])
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let dir = workspace_root().join(TESTDATA);
    let (ok, out) = promtool(&dir, &["check", "rules", "rules.yaml"]);
    assert!(ok, "promtool check rules:\n{out}");
    assert!(out.contains(&format!("SUCCESS: {} rules found", ALERTS.len())), "{out}");
    let (ok, out) = promtool(&dir, &["test", "rules", "rules-test.yaml"]);
    assert!(ok, "promtool test rules:\n{out}");
    println!("{out}");

    // The unit tests see the thresholds: raised ones keep those alerts silent.
    let (ok, out) = unit_tests_against(&[
        "monitoring.alerts.csiErrors.percent=50",
        "monitoring.alerts.objectWaiting.minutes=60",
        "monitoring.alerts.queueNotDraining.minutes=60",
        "monitoring.alerts.driverUnreachable.for=15m",
    ]);
    assert!(!ok, "the unit tests passed with raised thresholds:\n{out}");
    for alert in ["CsiSidecarCsiErrors", "CsiSidecarObjectWaiting", "CsiSidecarQueueNotDraining"] {
        assert!(out.contains(&format!("alertname: {alert}, time:")), "{alert} not reported:\n{out}");
    }
    // ... and the minimum call rate: without it, an idle method's one
    // failed call every four minutes fires.
    let (ok, out) = unit_tests_against(&["monitoring.alerts.csiErrors.minCallsPerMinute=0"]);
    assert!(!ok, "the unit tests passed without a minimum call rate:\n{out}");
    assert!(out.contains("ControllerExpandVolume"), "{out}");
    // ... and the normal waits: without leaving them out, a claim waiting
    // for the scheduler or an external populator fires the long-wait alert.
    let mut args = with(&[]);
    args.extend(["--set-json".to_string(), "monitoring.alerts.objectWaiting.ignoreWaitingFor=[]".to_string()]);
    let (ok, out) = unit_tests_with(args);
    assert!(!ok, "the unit tests passed with no normal waits left out:\n{out}");
    // (The normal waits' case is the one evaluated at 45m.)
    assert!(out.contains("alertname: CsiSidecarObjectWaiting, time: 45m"), "{out}");
    // ... and the selector: another job's series would fire them.
    let (ok, out) = unit_tests_against(&["monitoring.selector=job=\"other\""]);
    assert!(!ok, "the unit tests passed with another job's selector:\n{out}");
    assert!(out.contains("alertname: CsiSidecarCsiErrors, time:"), "{out}");
}

/// The values `monitoring.alerts.objectWaiting.ignoreWaitingFor` accepts are
/// the `waiting_for` values csi-sidecar exports, and the default leaves out
/// the normal waits: the scheduler and an external populator.
#[test]
fn the_normal_waits_the_long_wait_alert_leaves_out_are_waiting_for_values() {
    let chart = workspace_root().join("manifests/helm/csi-sidecar");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json")).expect("schema"))
            .expect("JSON");
    let object_waiting = &schema["properties"]["monitoring"]["properties"]["alerts"]["properties"]["objectWaiting"];
    let allowed: Vec<&str> = object_waiting["properties"]["ignoreWaitingFor"]["items"]["enum"]
        .as_array()
        .expect("an enum of waiting_for values")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let exported: Vec<&str> = csi_sidecar::debug::WaitingFor::ALL.iter().map(|w| w.as_str()).collect();
    assert_eq!(allowed, exported, "values.schema.json vs debug::WaitingFor::ALL");
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart.join("values.yaml")).expect("values")).expect("YAML");
    assert_eq!(
        values["monitoring"]["alerts"]["objectWaiting"]["ignoreWaitingFor"],
        serde_json::json!(["scheduler", "populator"])
    );
}

/// Every dashboard query parses (promtool, as recording rules) and every
/// expression of the dashboard and the alerts selects the release's job.
#[test]
fn promtool_parses_every_dashboard_query_and_every_expression_selects_the_release() {
    let docs = render(&all_on());
    let exprs = expressions(&docs);
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, Expr { at, expr }) in exprs.iter().enumerate().filter(|(_, e)| !e.at.starts_with("alert ")) {
        // Grafana's interval variable; $pod sits inside a string.
        let expr = expr.replace("$__rate_interval", "5m");
        let quoted = serde_json::to_string(&expr).expect("quote");
        rules.push_str(&format!("      - record: dashboard:query_{i}\n        expr: {quoted}\n"));
        rules.push_str(&format!("        labels: {{at: {}}}\n", serde_json::to_string(at).expect("quote")));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("dashboard-queries.yaml"), &rules).expect("write");
    let (ok, out) = promtool(dir.path(), &["check", "rules", "dashboard-queries.yaml"]);
    assert!(ok, "promtool check rules on the dashboard's queries:\n{out}\n{rules}");
    let queries = exprs.iter().filter(|e| !e.at.starts_with("alert ")).count();
    assert!(out.contains(&format!("SUCCESS: {queries} rules found")), "{out}");

    let selector = format!("job=~\".*{RELEASE}.*\"");
    for e in &exprs {
        let names = promql::names(&e.expr).unwrap_or_else(|err| panic!("{}: {err}: {}", e.at, e.expr));
        assert!(!names.metrics.is_empty(), "{}: no metric in {}", e.at, e.expr);
        for (metric, labels) in &names.metrics {
            assert!(labels.contains("job"), "{}: {metric} without the release's selector: {}", e.at, e.expr);
        }
        assert!(e.expr.contains(&selector), "{}: {}", e.at, e.expr);
    }
    let board = dashboard(&docs);
    let rows: Vec<&str> = board["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    assert_eq!(
        rows,
        ["CSI calls", "Work queues", "Objects waiting", "API budget", "Leader election", "CSI driver", "Process"]
    );
    assert_eq!(find(&docs, "ConfigMap", "-dashboard")["metadata"]["labels"]["grafana_dashboard"], "1");
    let uid = board["uid"].as_str().unwrap_or_default();
    assert!(uid.starts_with("csi-sidecar-") && uid.len() <= 40, "{uid}");
}

/// The csi-sidecar containers' ports of the pods of a rendering, by
/// component: (pod labels, port names).
fn sidecar_ports(docs: &[Value]) -> Vec<(String, Value, BTreeSet<String>)> {
    let mut out = Vec::new();
    for d in docs.iter().filter(|d| matches!(kind(d), "Deployment" | "DaemonSet")) {
        let template = &d["spec"]["template"];
        let ports: BTreeSet<String> = template["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] != "driver")
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["name"].as_str().map(Into::into))
            .collect();
        let component = template["metadata"]["labels"]["app.kubernetes.io/component"].as_str().unwrap_or_default();
        out.push((component.to_string(), template["metadata"]["labels"].clone(), ports));
    }
    out
}

fn names_of(list: &Value) -> BTreeSet<String> {
    list.as_array().into_iter().flatten().filter_map(|e| e["port"].as_str().map(Into::into)).collect()
}

fn selects(selector: &Value, labels: &Value) -> bool {
    selector.as_object().is_some_and(|s| s.iter().all(|(k, v)| &labels[k] == v))
}

#[test]
fn every_metrics_port_of_both_layouts_is_scraped() {
    let modules = [
        "controller.modules.attacher.enabled=true",
        "controller.modules.resizer.enabled=true",
        "controller.modules.snapshotter.enabled=true",
        "controller.modules.healthMonitor.enabled=true",
    ];
    for layout in ["combined", "drop-in"] {
        let mut extra = vec![format!("layout={layout}")];
        extra.extend(modules.iter().map(|m| m.to_string()));
        let docs = render(&with(&extra.iter().map(String::as_str).collect::<Vec<_>>()));
        let pods = sidecar_ports(&docs);
        assert_eq!(pods.len(), 2, "{layout}: the controller and node pods");
        let pod_monitor = find(&docs, "PodMonitor", "");
        let service_monitor = find(&docs, "ServiceMonitor", "");
        let scraped = names_of(&pod_monitor["spec"]["podMetricsEndpoints"]);
        let via_services = names_of(&service_monitor["spec"]["endpoints"]);
        let services: Vec<&Value> = docs.iter().filter(|d| kind(d) == "Service").collect();
        for (component, labels, ports) in &pods {
            assert!(!ports.is_empty(), "{layout} {component}: no port");
            assert!(selects(&pod_monitor["spec"]["selector"]["matchLabels"], labels), "{layout} {component}");
            assert!(ports.is_subset(&scraped), "{layout} {component}: {ports:?} vs PodMonitor {scraped:?}");
            assert!(ports.is_subset(&via_services), "{layout} {component}: {ports:?} vs ServiceMonitor");
            let service = services
                .iter()
                .find(|s| selects(&s["spec"]["selector"], labels))
                .unwrap_or_else(|| panic!("{layout} {component}: no Service selects the pods"));
            assert!(selects(&service_monitor["spec"]["selector"]["matchLabels"], &service["metadata"]["labels"]));
            let service_ports: BTreeSet<String> = service["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["name"] == p["targetPort"])
                .filter_map(|p| p["name"].as_str().map(Into::into))
                .collect();
            assert_eq!(&service_ports, ports, "{layout} {component}: the Service's ports");
        }
        let all: BTreeSet<String> = pods.iter().flat_map(|(_, _, p)| p.clone()).collect();
        assert_eq!(scraped, all, "{layout}: the PodMonitor scrapes nothing else");
        let want = if layout == "combined" { 1 } else { 7 };
        assert_eq!(all.len(), want, "{layout}: {all:?}");
    }
    // The Services' names are DNS labels however long the release's name.
    let long = "x".repeat(70);
    let docs = render(&with(&[&format!("fullnameOverride={long}")]));
    let names: BTreeSet<&str> =
        docs.iter().filter(|d| kind(d) == "Service").filter_map(|d| d["metadata"]["name"].as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|n| n.len() <= 63 && !n.ends_with('-')), "{names:?}");
}
