//! tidy: the invariants ARCHITECTURE.md promises about the source tree,
//! checked by reading it (rust-analyzer's `tidy` is the model). Fast: no
//! build of anything else, no cluster; part of `cargo test -p csi-sidecar`.

mod graph;
mod layers;
mod paths;
mod source;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use graph::{import_graph, production_sources, src_dir};
use layers::{Layers, unit_graph};
use source::{File, string_literals};

/// A gRPC client of the driver built outside `csi/` (pure, on a parsed file).
fn builds_grpc_client(syntax: &syn::File) -> bool {
    struct Finder(bool);
    impl syn::visit::Visit<'_> for Finder {
        fn visit_path(&mut self, path: &syn::Path) {
            let names: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.0 |= names.windows(2).any(|w| {
                w[1] == "new"
                    && ["ControllerClient", "NodeClient", "IdentityClient", "GroupControllerClient"]
                        .contains(&w[0].as_str())
            });
            syn::visit::visit_path(self, path);
        }
    }
    let mut finder = Finder(false);
    syn::visit::Visit::visit_file(&mut finder, syntax);
    finder.0
}

/// Whether a literal is an upstream name only the vocabulary may spell
/// twice: a Kubernetes-domain key or a CSI method.
fn is_upstream_name(literal: &str) -> bool {
    !literal.contains(' ')
        && (literal.contains("kubernetes.io/") || literal.contains("k8s.io/") || literal.starts_with("/csi.v1."))
}

/// The layer order ARCHITECTURE.md declares.
fn declared_layers() -> Layers {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md")).unwrap_or_default();
    Layers::from_markdown(&text).expect("ARCHITECTURE.md declares the layer order in a ```layers block")
}

#[test]
fn every_import_goes_down_the_layer_order_of_architecture() {
    let units = unit_graph(&import_graph(&src_dir()));
    assert!(units.len() > 15, "expected every unit of src/, found {:?}", units.keys());
    let bad = layers::violations(&declared_layers(), &units);
    assert!(bad.is_empty(), "imports against the layer order of ARCHITECTURE.md:\n{}", bad.join("\n"));
}

#[test]
fn only_csi_builds_grpc_clients_of_the_driver() {
    let sources = production_sources(&src_dir());
    let offenders: Vec<&File> = sources
        .iter()
        .filter(|(f, s)| !f.starts_with("csi/") && builds_grpc_client(&s.syntax))
        .map(|(f, _)| f)
        .collect();
    assert!(offenders.is_empty(), "CSI calls go through csi::Connection's typed methods: {offenders:?}");
    let parse = |t: &str| source::parse(t).expect("parses").syntax;
    assert!(builds_grpc_client(&parse("fn f() { ControllerClient::new(ch).create_volume(r); }")));
    assert!(!builds_grpc_client(&parse("const S: &str = \"ControllerClient::new\";")));
}

/// The upstream names spelled where they must not be (pure): a CSI
/// method outside `csi/calls.rs`, any other name outside `compat/`, or in
/// more than one file.
fn misplaced_upstream_names(spelled: &BTreeMap<String, BTreeSet<File>>) -> Vec<String> {
    spelled
        .iter()
        .filter_map(|(name, files)| {
            let home =
                |f: &File| if name.starts_with("/csi.v1.") { f == "csi/calls.rs" } else { f.starts_with("compat/") };
            let elsewhere: Vec<&File> = files.iter().filter(|f| !home(f)).collect();
            if !elsewhere.is_empty() {
                Some(format!(
                    "{name:?} spelled outside {}: {elsewhere:?}",
                    if name.starts_with("/csi.v1.") { "csi/calls.rs" } else { "compat/" }
                ))
            } else if files.len() > 1 {
                Some(format!("{name:?} spelled in more than one file: {files:?}"))
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn every_upstream_name_is_spelled_once_in_compat() {
    let mut spelled: BTreeMap<String, BTreeSet<File>> = BTreeMap::new();
    for (f, source) in &production_sources(&src_dir()) {
        for lit in string_literals(&source.syntax) {
            if is_upstream_name(&lit) {
                spelled.entry(lit).or_default().insert(f.clone());
            }
        }
    }
    assert!(spelled.len() > 20, "expected the upstream names, found {spelled:?}");
    let bad = misplaced_upstream_names(&spelled);
    assert!(bad.is_empty(), "upstream names belong in compat/ (CSI methods in csi/calls.rs):\n{}", bad.join("\n"));
}

#[test]
fn an_upstream_name_is_misplaced_outside_compat_or_twice_within() {
    type Spelled<'a> = &'a [(&'a str, &'a [&'a str])];
    let spelled = |pairs: Spelled<'_>| -> BTreeMap<String, BTreeSet<File>> {
        pairs.iter().map(|(n, fs)| (n.to_string(), fs.iter().map(|f| f.to_string()).collect())).collect()
    };
    let cases: [(Spelled<'_>, usize); 6] = [
        (&[("csi.storage.k8s.io/pvc/name", &["compat/storage_class.rs"])], 0),
        (&[("csi.storage.k8s.io/pvc/name", &["compat/mod.rs", "modules/provisioner/params.rs"])], 1),
        (&[("csi.storage.k8s.io/pvc/name", &["compat/mod.rs", "compat/storage_class.rs"])], 1),
        (&[("/csi.v1.Controller/CreateVolume", &["csi/calls.rs"])], 0),
        (&[("/csi.v1.Controller/CreateVolume", &["compat/mod.rs"])], 1),
        (&[("kubernetes.io/aws-ebs", &["migration/plugins/aws_ebs.rs"]), ("a.k8s.io/b", &["compat/api.rs"])], 1),
    ];
    for (pairs, want) in cases {
        assert_eq!(misplaced_upstream_names(&spelled(pairs)).len(), want, "{pairs:?}");
    }
    assert!(is_upstream_name("csi.storage.k8s.io/fstype") && !is_upstream_name("see csi.storage.k8s.io/ keys"));
}

/// The files of `src/` outside `prefixes` whose string literals name a
/// module (by its table name or a KEP-4958 name), with the names.
fn module_names_spelled(prefixes: &[&str]) -> Vec<String> {
    let names: BTreeSet<&str> = crate::modules::kep_controllers().map(|(c, _)| c).collect();
    let mut found = Vec::new();
    for (f, source) in &production_sources(&src_dir()) {
        if !prefixes.iter().any(|p| f.starts_with(p)) {
            continue;
        }
        let hits: BTreeSet<String> =
            string_literals(&source.syntax).into_iter().filter(|l| names.contains(l.as_str())).collect();
        if !hits.is_empty() {
            found.push(format!("{f}: {hits:?}"));
        }
    }
    found
}

#[test]
fn the_host_and_the_command_line_ask_the_rows_never_a_module_name() {
    let found = module_names_spelled(&["host.rs", "cli/", "main.rs"]);
    assert!(found.is_empty(), "a module's facts belong in its row of modules/mod.rs:\n{}", found.join("\n"));
    // The check sees a name where one is spelled.
    let table = module_names_spelled(&["modules/mod.rs"]);
    assert!(table.iter().any(|f| f.contains("\"attacher\"")), "{table:?}");
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
        named_paths("see `src/k8s/budget/` and `integration/tests/{a,b}.rs`, `x/y`"),
        BTreeSet::from(["src/k8s/budget/".to_string()])
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

/// The most lines of code (not blank, not a comment) a file of `src/` or
/// `integration/` has outside its tests: a file over it holds more than one
/// concern.
const MAX_LINES_OF_CODE: usize = 600;

/// The files of `sources` (paths under `prefix`) over the limit (pure).
fn oversized<'a>(prefix: &str, sources: impl IntoIterator<Item = (&'a File, usize)>) -> Vec<String> {
    sources
        .into_iter()
        .filter(|(_, n)| *n > MAX_LINES_OF_CODE)
        .map(|(f, n)| format!("{prefix}{f}: {n} lines of code"))
        .collect()
}

#[test]
fn no_file_holds_more_than_600_lines_of_code_outside_its_tests() {
    let src = production_sources(&src_dir());
    let mut big = oversized("src/", src.iter().map(|(f, s)| (f, s.lines_of_code)));
    // The test world: every file is test code, so every line counts but
    // those of its own unit-test modules.
    let integration = Path::new(env!("CARGO_MANIFEST_DIR")).join("integration");
    let mut files = BTreeSet::new();
    graph::rust_files(&integration, &integration, &mut files);
    assert!(files.len() > 50, "expected the test world's files, found {files:?}");
    let counted: Vec<(File, usize)> = files
        .into_iter()
        .map(|f| {
            let n = source::read(&integration, &f)
                .unwrap_or_else(|e| panic!("tidy cannot read integration/{e}"))
                .lines_of_code;
            (f, n)
        })
        .collect();
    big.extend(oversized("integration/", counted.iter().map(|(f, n)| (f, *n))));
    assert!(big.is_empty(), "split these along their concerns:\n{}", big.join("\n"));
    let over = MAX_LINES_OF_CODE + 1;
    assert_eq!(
        oversized("integration/", [(&"tests/big.rs".to_string(), over)]),
        [format!("integration/tests/big.rs: {over} lines of code")]
    );
}

/// The release profile's panic strategy, from the workspace's Cargo.toml
/// (`unwind` when not set).
fn release_panic_strategy(manifest: &str) -> String {
    let mut in_release = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_release = line == "[profile.release]";
        } else if in_release && let Some(value) = line.strip_prefix("panic") {
            return value.trim_start().trim_start_matches('=').trim().trim_matches('"').to_string();
        }
    }
    "unwind".to_string()
}

#[test]
fn the_release_build_unwinds_so_a_panic_stays_in_its_module() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .unwrap_or_else(|e| panic!("tidy cannot read Cargo.toml: {e}"));
    // Under `abort` a panic in one sync would stop every module (invariant 16).
    assert_eq!(release_panic_strategy(&manifest), "unwind");
    assert_eq!(release_panic_strategy("[profile.release]\nlto = true\npanic = \"abort\"\n"), "abort");
    assert_eq!(release_panic_strategy("[profile.dev]\npanic = \"abort\"\n[profile.release]\n"), "unwind");
}
