//! The Helm chart's view of the module table (above it in the layers, like
//! `explain`). The chart's templates loop
//! over `manifests/helm/csi-sidecar/files/modules.yaml` (the containers of
//! both layouts, each module's ClusterRole, the leader-election Role); that
//! file is [`render`] of the rows, and a test keeps the two equal, so a
//! module's chart facts live in its row and nowhere else.

use std::fmt::Write as _;

use crate::modules::{ModuleDesc, Rule};

/// The chart's file of modules for `rows`, in table order: one list per
/// pod.
pub fn render(rows: &[&ModuleDesc]) -> String {
    let mut out = String::from(
        "# The module table (src/modules/mod.rs) as the chart's templates read it.\n\
         # Rendered from the rows by src/chart.rs, whose test fails when this\n\
         # file differs (`UPDATE_EXPECT=1 cargo test --lib chart::` rewrites\n\
         # it). Do not edit.\n",
    );
    for pod in ["controller", "node"] {
        let _ = writeln!(out, "{pod}:");
        for row in rows.iter().filter(|r| r.chart.pods.runs_in(pod)) {
            entry(&mut out, row);
        }
    }
    out
}

fn entry(out: &mut String, row: &ModuleDesc) {
    let c = &row.chart;
    let command = row.binary_names.first().map(|b| format!("/{b}")).unwrap_or_default();
    let _ = writeln!(out, "  - name: {}", quoted(row.name));
    let _ = writeln!(out, "    values: {}", quoted(c.values_key));
    let _ = writeln!(out, "    container: {}", quoted(c.container));
    let _ = writeln!(out, "    command: {}", quoted(&command));
    let _ = writeln!(out, "    portName: {}", quoted(c.port_name));
    let _ = writeln!(out, "    leader: {}", row.leads());
    let _ = writeln!(out, "    registration: {}", row.needs.registration_dir);
    let _ = writeln!(out, "    kinds: {}", list(row.kinds));
    rules(out, "rules", row.cluster_rules.iter().map(|r| (None, r)));
    rules(out, "valueRules", c.value_rules.iter().map(|(v, r)| (Some(*v), r)));
}

/// A list of rules; a rule on Secrets alone carries `secrets: true` (the
/// chart grants it cluster-wide or per namespace, as `rbac.secrets` says),
/// a value rule its `value`.
fn rules<'a>(out: &mut String, key: &str, rules: impl Iterator<Item = (Option<&'a str>, &'a Rule)>) {
    let rules: Vec<_> = rules.collect();
    if rules.is_empty() {
        let _ = writeln!(out, "    {key}: []");
        return;
    }
    let _ = writeln!(out, "    {key}:");
    for (value, rule) in rules {
        let mut line = format!(
            "      - {{apiGroups: {}, resources: {}, verbs: {}",
            list(rule.groups),
            list(rule.resources),
            list(rule.verbs)
        );
        if rule.resources == ["secrets"] {
            line.push_str(", secrets: true");
        }
        if let Some(v) = value {
            let _ = write!(line, ", value: {}", quoted(v));
        }
        let _ = writeln!(out, "{line}}}");
    }
}

fn list(items: &[&str]) -> String {
    let items: Vec<String> = items.iter().map(|s| quoted(s)).collect();
    format!("[{}]", items.join(", "))
}

/// A YAML double-quoted scalar (JSON's escaping is YAML's).
fn quoted(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

#[cfg(test)]
mod tests;
