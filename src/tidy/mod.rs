//! tidy: the invariants ARCHITECTURE.md promises about the source tree,
//! checked by reading it (rust-analyzer's `tidy` is the model). Fast: no
//! build of anything else, no cluster; part of `cargo test -p csi-sidecar`.

mod graph;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use graph::{File, import_graph, src_dir, strip_literals};

/// The layer a file of `src/` belongs to (the allowed edges are between layers).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Layer {
    /// `main.rs`, `lib.rs`, `host.rs`, `cli/`: they wire everything.
    Wiring,
    /// `modules/mod.rs` (the module table), `modules/led.rs`, `modules/views.rs`:
    /// shared by the modules.
    ModuleCommon,
    /// `modules/<name>/`.
    Module(String),
    /// The shared runtime: `csi/`, `kube/`, `http.rs`, `flags/`, `compat.rs`,
    /// `metrics.rs`, `migration/`, `logging.rs`.
    Runtime,
}

fn layer(file: &str) -> Layer {
    let parts: Vec<&str> = file.split('/').collect();
    match parts.as_slice() {
        ["main.rs" | "lib.rs" | "host.rs"] | ["cli", ..] => Layer::Wiring,
        ["modules", "mod.rs" | "led.rs" | "views.rs"] => Layer::ModuleCommon,
        ["modules", name, ..] => Layer::Module(name.trim_end_matches(".rs").to_string()),
        _ => Layer::Runtime,
    }
}

/// Why an edge `from → to` is not allowed (pure), `None` if it is.
fn forbidden(from: &str, to: &str) -> Option<&'static str> {
    match (layer(from), layer(to)) {
        (Layer::Module(a), Layer::Module(b)) if a != b => Some("a module never imports another module"),
        (Layer::Runtime, Layer::Wiring | Layer::ModuleCommon | Layer::Module(_)) => {
            Some("the shared runtime never imports the modules or the wiring")
        }
        (Layer::ModuleCommon, Layer::Module(_)) if !from.ends_with("modules/mod.rs") => {
            Some("the modules' common code never imports one module")
        }
        _ => None,
    }
}

/// Every edge of `graph` that breaks a layer rule, as `from → to: why`.
fn layer_violations(graph: &BTreeMap<File, BTreeSet<File>>) -> Vec<String> {
    graph
        .iter()
        .flat_map(|(from, targets)| {
            targets.iter().filter_map(move |to| forbidden(from, to).map(|why| format!("{from} → {to}: {why}")))
        })
        .collect()
}

/// The non-test text of a file: up to its first `#[cfg(test)]` (test
/// modules come last, by the house style), test files not at all.
fn production_text(src: &Path, file: &str, graph: &BTreeMap<File, BTreeSet<File>>) -> String {
    if !graph.contains_key(file) {
        return String::new();
    }
    let text = std::fs::read_to_string(src.join(file)).unwrap_or_default();
    match text.find("#[cfg(test)]") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// The plain string literals of `text` (`"..."`, escapes kept as written;
/// comments, char literals and raw strings skipped): enough for names.
fn string_literals(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '/' if chars.get(i + 1) == Some(&'/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '\'' if chars.get(i + 2) == Some(&'\'') => i += 3,
            '\'' if chars.get(i + 1) == Some(&'\\') && chars.get(i + 3) == Some(&'\'') => i += 4,
            '"' => {
                let mut lit = String::new();
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        lit.push(chars[i]);
                        i += 1;
                    }
                    if let Some(&c) = chars.get(i) {
                        lit.push(c);
                    }
                    i += 1;
                }
                out.push(lit);
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// A gRPC client of the driver built outside `csi/` (pure, on a file's text).
fn builds_grpc_client(text: &str) -> bool {
    let code = strip_literals(text);
    ["ControllerClient::new", "NodeClient::new", "IdentityClient::new", "GroupControllerClient::new"]
        .iter()
        .any(|c| code.contains(c))
}

/// Whether a literal is an upstream name only the vocabulary may spell
/// twice: a Kubernetes-domain key or a CSI method.
fn is_upstream_name(literal: &str) -> bool {
    !literal.contains(' ')
        && (literal.contains("kubernetes.io/") || literal.contains("k8s.io/") || literal.starts_with("/csi.v1."))
}

#[test]
fn modules_import_only_the_runtime_and_the_runtime_never_imports_modules() {
    let graph = import_graph(&src_dir());
    let bad = layer_violations(&graph);
    assert!(bad.is_empty(), "edges ARCHITECTURE.md does not allow:\n{}", bad.join("\n"));
}

#[test]
fn the_layer_rules_are_what_architecture_says() {
    let cases = [
        ("modules/provisioner/mod.rs", "modules/resizer/mod.rs", true),
        ("modules/snapshotter/decide.rs", "modules/provisioner/params.rs", true),
        ("modules/provisioner/mod.rs", "modules/provisioner/capacity/mod.rs", false),
        ("modules/provisioner/mod.rs", "kube/informers.rs", false),
        ("modules/provisioner/mod.rs", "modules/views.rs", false),
        ("kube/informers.rs", "modules/views.rs", true),
        ("csi/connection.rs", "host.rs", true),
        ("flags/shared.rs", "cli/mod.rs", true),
        ("modules/views.rs", "modules/attacher/decide.rs", true),
        ("modules/mod.rs", "modules/attacher/mod.rs", false),
        ("cli/mod.rs", "modules/mod.rs", false),
        ("host.rs", "kube/mod.rs", false),
    ];
    for (from, to, bad) in cases {
        assert_eq!(forbidden(from, to).is_some(), bad, "{from} → {to}");
    }
}

#[test]
fn only_csi_builds_grpc_clients_of_the_driver() {
    let src = src_dir();
    let graph = import_graph(&src);
    let offenders: Vec<&File> = graph
        .keys()
        .filter(|f| !f.starts_with("csi/") && builds_grpc_client(&production_text(&src, f, &graph)))
        .collect();
    assert!(offenders.is_empty(), "CSI calls go through csi::Connection's typed methods: {offenders:?}");
    assert!(builds_grpc_client("ControllerClient::new(ch).create_volume(r)"));
    assert!(!builds_grpc_client("let s = \"ControllerClient::new\";"));
}

#[test]
fn every_upstream_name_is_spelled_in_one_file() {
    let src = src_dir();
    let graph = import_graph(&src);
    let mut spelled: BTreeMap<String, BTreeSet<File>> = BTreeMap::new();
    for f in graph.keys() {
        for lit in string_literals(&production_text(&src, f, &graph)) {
            if is_upstream_name(&lit) {
                spelled.entry(lit).or_default().insert(f.clone());
            }
        }
    }
    assert!(spelled.len() > 20, "expected the upstream names, found {spelled:?}");
    let twice: Vec<String> = spelled
        .iter()
        .filter(|(_, files)| files.len() > 1)
        .map(|(name, files)| format!("{name:?}: {files:?}"))
        .collect();
    assert!(twice.is_empty(), "upstream names spelled in more than one file:\n{}", twice.join("\n"));
    let methods: Vec<&String> = spelled
        .iter()
        .filter(|(name, files)| name.starts_with("/csi.v1.") && !files.contains("csi/calls.rs"))
        .map(|(name, _)| name)
        .collect();
    assert!(methods.is_empty(), "CSI methods are named in csi/calls.rs: {methods:?}");
    assert_eq!(string_literals("let a = \"x/y\"; // \"z\"\nlet b = '\"'; f(\"a\\\"b\")"), ["x/y", "a\\\"b"]);
}

/// The backticked paths of a Markdown text that name a file or folder of
/// the repository (`src/...`, `integration/...`, ...).
fn named_paths(markdown: &str) -> BTreeSet<String> {
    const ROOTS: [&str; 6] = ["src/", "integration/", "manifests/", "proto/", "docs/", ".ci/"];
    markdown
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|code| code.split([' ', ',']))
        .map(|t| t.trim_end_matches([':', '.', ')']))
        .filter(|t| ROOTS.iter().any(|r| t.starts_with(r)) && !t.contains(['*', '<', '{', '$']))
        .map(String::from)
        .collect()
}

#[test]
fn every_path_architecture_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec!["ARCHITECTURE.md".to_string(), "README.md".to_string()];
    for entry in std::fs::read_dir(root.join("docs")).into_iter().flatten().flatten() {
        docs.push(format!("docs/{}", entry.file_name().to_string_lossy()));
    }
    assert!(docs.len() > 4, "the docs folder: {docs:?}");
    for doc in &docs {
        let text = std::fs::read_to_string(root.join(doc)).unwrap_or_default();
        let paths = named_paths(&text);
        assert!(doc != "ARCHITECTURE.md" || paths.len() > 10, "{doc} names {paths:?}");
        let missing: Vec<&String> = paths.iter().filter(|p| !root.join(p).exists()).collect();
        assert!(missing.is_empty(), "{doc} names paths that do not exist: {missing:?}");
    }
    assert_eq!(
        named_paths("see `src/kube/budget/` and `integration/tests/{a,b}.rs`, `x/y`"),
        BTreeSet::from(["src/kube/budget/".to_string()])
    );
}

/// `Type::function` names in backticks whose function is defined nowhere
/// in `src/` (`fn function`).
fn unknown_functions(markdown: &str, sources: &str) -> Vec<String> {
    markdown
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|code| {
            let (ty, f) = code.split_once("::")?;
            let f = f.trim_end_matches("()");
            let plain = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_');
            let is_type = ty.chars().next().is_some_and(char::is_uppercase);
            (is_type && plain(ty) && plain(f) && f.chars().next().is_some_and(char::is_lowercase)).then_some((ty, f))
        })
        .filter(|(_, f)| !sources.contains(&format!("fn {f}")) && !sources.contains(&format!("fn {f}<")))
        .map(|(ty, f)| format!("{ty}::{f}"))
        .collect()
}

#[test]
fn every_function_architecture_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = src_dir();
    let mut files = BTreeSet::new();
    graph::rust_files(&src, &src, &mut files);
    let sources: String = files.iter().map(|f| std::fs::read_to_string(src.join(f)).unwrap_or_default()).collect();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap_or_default();
    let unknown = unknown_functions(&text, &sources);
    assert!(unknown.is_empty(), "ARCHITECTURE.md names functions that do not exist: {unknown:?}");
    assert_eq!(
        unknown_functions("`Informers::get_filtered` and `Informers::view`", "fn view("),
        ["Informers::get_filtered"]
    );
}

/// The most lines of code (not blank, not a comment) a file of `src/` has
/// outside its tests: a file over it holds more than one concern.
const MAX_LINES_OF_CODE: usize = 600;

/// Lines of `text` that are neither blank nor only a comment.
fn lines_of_code(text: &str) -> usize {
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("//")).count()
}

#[test]
fn no_file_in_src_holds_more_than_600_lines_of_code_outside_its_tests() {
    let src = src_dir();
    let graph = import_graph(&src);
    let big: Vec<String> = graph
        .keys()
        .map(|f| (f, lines_of_code(&production_text(&src, f, &graph))))
        .filter(|(_, n)| *n > MAX_LINES_OF_CODE)
        .map(|(f, n)| format!("src/{f}: {n} lines of code"))
        .collect();
    assert!(big.is_empty(), "split these along their concerns:\n{}", big.join("\n"));
    assert_eq!(lines_of_code("fn a() {}\n\n  // note\n/// doc\nlet b = 1; // c\n"), 2);
}
