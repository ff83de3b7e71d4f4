//! The module-level import graph and the layer order ARCHITECTURE.md
//! declares (its fenced `layers` block, highest first): a unit may import
//! only units on lines below its own, so units of one line (the modules)
//! never import each other, and the graph has no cycle.

use std::collections::{BTreeMap, BTreeSet};

use super::source::File;

/// The unit a file of `src/` belongs to: its top-level module
/// (`k8s/queue/mod.rs` → `k8s`), the module table `modules/mod.rs` →
/// `modules`, and each `modules/<x>` (a module's folder, or a file the
/// modules share) on its own.
pub fn unit(file: &str) -> String {
    let stem = |s: &str| s.trim_end_matches(".rs").to_string();
    match file.split('/').collect::<Vec<_>>().as_slice() {
        [one] => stem(one),
        ["modules", "mod.rs"] => "modules".to_string(),
        ["modules", x, ..] => format!("modules/{}", stem(x)),
        [top, ..] => top.to_string(),
        [] => String::new(),
    }
}

/// Edges between units (pure), each with one file edge that makes it.
pub fn unit_graph(files: &BTreeMap<File, BTreeSet<File>>) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut units: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (from, targets) in files {
        let entry = units.entry(unit(from)).or_default();
        for to in targets.iter().filter(|to| unit(to) != unit(from)) {
            entry.entry(unit(to)).or_insert_with(|| format!("{from} → {to}"));
        }
    }
    units
}

/// The layer order: one line per layer, highest first; `modules/*` stands
/// for every `modules/<x>` no other line names.
#[derive(Debug)]
pub struct Layers(Vec<Vec<String>>);

impl Layers {
    /// The first fenced block with the info string `layers` of a Markdown
    /// text; `None` if there is none.
    pub fn from_markdown(markdown: &str) -> Option<Layers> {
        let start = markdown.find("```layers\n")? + "```layers\n".len();
        let end = start + markdown[start..].find("```")?;
        let lines = markdown[start..end]
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").split_whitespace().map(String::from).collect::<Vec<_>>())
            .filter(|l| !l.is_empty())
            .collect();
        Some(Layers(lines))
    }

    /// The line of `unit` (0 is the highest), `None` when no line names it.
    fn line(&self, unit: &str) -> Option<usize> {
        let named = |pattern: &str| pattern == unit;
        self.0.iter().position(|l| l.iter().any(|p| named(p))).or_else(|| {
            unit.strip_prefix("modules/").and_then(|_| self.0.iter().position(|l| l.iter().any(|p| p == "modules/*")))
        })
    }

    /// Why the edge `from → to` breaks the order (pure), `None` if it keeps it.
    pub fn violation(&self, from: &str, to: &str) -> Option<String> {
        match (self.line(from), self.line(to)) {
            (None, _) => Some(format!("{from} is on no line of the layer order")),
            (_, None) => Some(format!("{to} is on no line of the layer order")),
            (Some(a), Some(b)) if a == b => Some(format!("{from} and {to} are on one layer")),
            (Some(a), Some(b)) if b < a => Some(format!("{from} is below {to}")),
            _ => None,
        }
    }
}

/// Every edge of the unit graph that breaks the order, with the file edge
/// that makes it.
pub fn violations(layers: &Layers, graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<String> {
    let mut out: Vec<String> = graph
        .keys()
        .filter(|u| layers.line(u).is_none())
        .map(|u| format!("{u} is on no line of the layer order"))
        .collect();
    for (from, targets) in graph {
        for (to, because) in targets {
            if let Some(why) = layers.violation(from, to) {
                out.push(format!("{from} → {to} ({because}): {why}"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = "text\n```layers\nhost\nmodules\nmodules/*   # each module\nmodules/leading modules/views\nk8s csi\ncompat\n```\n";

    #[test]
    fn an_edge_keeps_the_order_only_downwards_and_never_within_a_line() {
        let layers = Layers::from_markdown(ORDER).expect("a layers block");
        let cases = [
            ("host", "k8s", true),
            ("modules", "modules/attacher", true),
            ("modules/attacher", "modules/leading", true),
            ("modules/attacher", "compat", true),
            ("modules/attacher", "modules/resizer", false),
            ("modules/attacher", "modules", false),
            ("k8s", "csi", false),
            ("k8s", "modules/views", false),
            ("compat", "k8s", false),
            ("k8s", "tidy", false),
            ("debug", "compat", false),
        ];
        for (from, to, keeps) in cases {
            assert_eq!(layers.violation(from, to).is_none(), keeps, "{from} → {to}: {:?}", layers.violation(from, to));
        }
        assert!(Layers::from_markdown("no block").is_none());
    }

    #[test]
    fn units_are_top_level_modules_and_each_module_folder() {
        let cases = [
            ("k8s/queue/mod.rs", "k8s"),
            ("metrics.rs", "metrics"),
            ("modules/mod.rs", "modules"),
            ("modules/leading.rs", "modules/leading"),
            ("modules/attacher/decide.rs", "modules/attacher"),
            ("main.rs", "main"),
        ];
        for (file, want) in cases {
            assert_eq!(unit(file), want, "{file}");
        }
        let files: BTreeMap<File, BTreeSet<File>> = [
            ("k8s/a.rs".to_string(), BTreeSet::from(["k8s/b.rs".to_string(), "compat.rs".to_string()])),
            ("k8s/b.rs".to_string(), BTreeSet::from(["compat.rs".to_string()])),
        ]
        .into();
        let graph = unit_graph(&files);
        assert_eq!(graph["k8s"].keys().collect::<Vec<_>>(), ["compat"]);
        assert_eq!(graph["k8s"]["compat"], "k8s/a.rs → compat.rs");
    }
}
