//! The chart's monitoring objects as the tests read them: helm's rendering,
//! the PromQL expressions of the dashboard and the alerts, and promtool
//! (both built from the Go module proxy by build-components.sh).

use std::{path::Path, process::Command};

use serde_json::Value;

use crate::{component_bin, promql, workspace_root, yaml::kind};

/// The release and namespace of the renderings (fullname `csi-sidecar`).
pub const RELEASE: &str = "csi-sidecar";
/// Where the rendered rules file and promtool's unit tests of it live.
pub const TESTDATA: &str = "integration/testdata/monitoring";
/// The rules file's key in the rules ConfigMap.
pub const RULES_KEY: &str = "csi-sidecar-rules.yaml";

/// `--set` arguments that switch every monitoring object on.
pub fn all_on() -> Vec<String> {
    ["dashboard", "prometheusRule", "rulesConfigMap", "serviceMonitor", "podMonitor"]
        .iter()
        .flat_map(|o| ["--set".to_string(), format!("monitoring.{o}.enabled=true")])
        .collect()
}

/// `helm template` of the chart (release and namespace [`RELEASE`]) with
/// `args`: its documents, or helm's error output.
pub fn try_render(args: &[String]) -> Result<Vec<Value>, String> {
    let out = Command::new(component_bin("helm"))
        .args(["template", RELEASE, "manifests/helm/csi-sidecar", "--namespace", RELEASE])
        .args(args)
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("run helm: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| format!("helm's output is not YAML: {e}"))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// [`try_render`], panicking with helm's error.
pub fn render(args: &[String]) -> Vec<Value> {
    try_render(args).unwrap_or_else(|e| panic!("helm template {}: {e}", args.join(" ")))
}

/// The one document of `kind` whose name ends with `suffix`.
pub fn find<'a>(docs: &'a [Value], want: &str, suffix: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| kind(d) == want && d["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(suffix)))
        .collect();
    assert_eq!(found.len(), 1, "one {want} named *{suffix}");
    found[0]
}

/// The rules file of the rules ConfigMap.
pub fn rules_file(docs: &[Value]) -> String {
    find(docs, "ConfigMap", "-rules")["data"][RULES_KEY].as_str().expect("the rules file").to_string()
}

/// The dashboard of the dashboard ConfigMap.
pub fn dashboard(docs: &[Value]) -> Value {
    let cm = find(docs, "ConfigMap", "-dashboard");
    let data = cm["data"].as_object().expect("data");
    assert_eq!(data.len(), 1, "one dashboard");
    let json = data.values().next().and_then(Value::as_str).expect("the dashboard's JSON");
    serde_json::from_str(json).expect("the dashboard is JSON")
}

/// A PromQL expression of the dashboard or the alerts, and where it is.
#[derive(Debug, Clone)]
pub struct Expr {
    /// "panel <title> <refId>", "variable <name>", "alert <name>".
    pub at: String,
    pub expr: String,
}

/// Every expression of a rendering with the dashboard and the
/// PrometheusRule: the panels' queries, the query variables' selectors and
/// the alerts' expressions.
pub fn expressions(docs: &[Value]) -> Vec<Expr> {
    let mut out = Vec::new();
    let board = dashboard(docs);
    for panel in board["panels"].as_array().into_iter().flatten() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            out.push(Expr {
                at: format!("panel {:?} {}", panel["title"].as_str().unwrap_or_default(), t["refId"]),
                expr: t["expr"].as_str().unwrap_or_default().to_string(),
            });
        }
    }
    for v in board["templating"]["list"].as_array().into_iter().flatten().filter(|v| v["type"] == "query") {
        let query = v["query"]["query"].as_str().or(v["query"].as_str()).unwrap_or_default();
        let (selector, _label) = promql::label_values(query)
            .unwrap_or_else(|| panic!("variable {}: not label_values(...): {query}", v["name"]));
        out.push(Expr { at: format!("variable {}", v["name"]), expr: selector.to_string() });
    }
    let rule = find(docs, "PrometheusRule", "");
    for group in rule["spec"]["groups"].as_array().into_iter().flatten() {
        for r in group["rules"].as_array().into_iter().flatten() {
            out.push(Expr {
                at: format!("alert {}", r["alert"].as_str().unwrap_or_default()),
                expr: r["expr"].as_str().unwrap_or_default().to_string(),
            });
        }
    }
    out
}

/// Runs promtool with `args` in `dir`: success and its output.
pub fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(component_bin("promtool")).args(args).current_dir(dir).output().expect("run promtool");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}
