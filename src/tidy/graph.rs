//! The file-level import graph of `src/`.
//!
//! Every path to one of the crate's modules (see [`super::paths`]: absolute,
//! relative, through a `use`, in macro arguments; `csi_sidecar::` in
//! `main.rs`) is an edge from the file that writes it to the deepest file the
//! path reaches (`a/b.rs` or `a/b/mod.rs`, else its parent module). `mod x;`
//! declarations are not edges, and test code (items under `#[cfg(test)]` and
//! the files such a `mod` declares) is left out.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use super::{
    paths::{self, Origin},
    source::{self, File, Source},
};

/// The module path of a file: `lib.rs` → `[]`, `a/mod.rs` → `[a]`, `a/b.rs` → `[a, b]`.
pub fn module_path(file: &str) -> Vec<String> {
    let stem = file.strip_suffix(".rs").unwrap_or(file);
    let mut parts: Vec<String> = stem.split('/').map(String::from).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The deepest file a module path reaches.
fn resolve(files: &BTreeSet<File>, path: &[String]) -> Option<File> {
    (0..=path.len()).rev().find_map(|k| {
        let prefix = path[..k].join("/");
        let candidates =
            if k == 0 { vec!["lib.rs".to_string()] } else { vec![format!("{prefix}.rs"), format!("{prefix}/mod.rs")] };
        candidates.into_iter().find(|c| files.contains(c))
    })
}

pub fn rust_files(dir: &Path, root: &Path, out: &mut BTreeSet<File>) {
    for entry in std::fs::read_dir(dir).expect("read src dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).expect("under src").to_string_lossy().replace('\\', "/");
            out.insert(rel);
        }
    }
}

/// The parsed files of a source tree, test files (declared by a `mod x;`
/// under `#[cfg(test)]`, and all below them) left out.
pub fn production_sources(src: &Path) -> BTreeMap<File, Source> {
    let mut files = BTreeSet::new();
    rust_files(src, src, &mut files);
    let sources: BTreeMap<File, Source> = files
        .iter()
        .map(|f| (f.clone(), source::read(src, f).unwrap_or_else(|e| panic!("tidy cannot read {e}"))))
        .collect();
    let mut test_roots: Vec<Vec<String>> = Vec::new();
    let mut test_files: BTreeSet<File> = BTreeSet::new();
    for (f, s) in &sources {
        for m in &s.test_mods {
            match &m.path {
                Some(path) => {
                    let folder = f.rsplit_once('/').map_or("", |(d, _)| d);
                    test_files.insert(if folder.is_empty() { path.clone() } else { format!("{folder}/{path}") });
                }
                None => test_roots.push([module_path(f), vec![m.name.clone()]].concat()),
            }
        }
    }
    sources
        .into_iter()
        .filter(|(f, _)| {
            let p = module_path(f);
            let test = test_files.contains(f) || test_roots.iter().any(|r| p.starts_with(r));
            !test || f == "lib.rs" || f == "main.rs"
        })
        .collect()
}

/// The file graph of `src/` without test code.
pub fn import_graph(src: &Path) -> BTreeMap<File, BTreeSet<File>> {
    graph_of(&production_sources(src))
}

/// The file graph of parsed files (pure).
pub fn graph_of(sources: &BTreeMap<File, Source>) -> BTreeMap<File, BTreeSet<File>> {
    let files: BTreeSet<File> = sources.keys().cloned().collect();
    sources
        .iter()
        .map(|(f, s)| {
            let module = module_path(f);
            let library = (f == "main.rs").then_some("csi_sidecar");
            let targets: BTreeSet<File> = paths::references(&s.syntax, &Origin { module: &module, library })
                .iter()
                .filter_map(|p| resolve(&files, p))
                .filter(|t| t != f)
                .collect();
            (f.clone(), targets)
        })
        .collect()
}

/// One cycle of the graph, as the files along it (first repeated at the end).
fn find_cycle(graph: &BTreeMap<File, BTreeSet<File>>) -> Option<Vec<File>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        f: &File,
        graph: &BTreeMap<File, BTreeSet<File>>,
        marks: &mut BTreeMap<File, Mark>,
        stack: &mut Vec<File>,
    ) -> Option<Vec<File>> {
        match marks.get(f) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = stack.iter().position(|s| s == f).unwrap_or(0);
                let mut cycle = stack[start..].to_vec();
                cycle.push(f.clone());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(f.clone(), Mark::Open);
        stack.push(f.clone());
        for t in graph.get(f).into_iter().flatten() {
            if let Some(c) = visit(t, graph, marks, stack) {
                return Some(c);
            }
        }
        stack.pop();
        marks.insert(f.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph.keys().find_map(|f| visit(f, graph, &mut marks, &mut Vec::new()))
}

/// The strongly connected components with more than one file (Tarjan).
fn tangles(graph: &BTreeMap<File, BTreeSet<File>>) -> Vec<BTreeSet<File>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<File, BTreeSet<File>>,
        index: BTreeMap<&'g File, usize>,
        low: BTreeMap<&'g File, usize>,
        stack: Vec<&'g File>,
        out: Vec<BTreeSet<File>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, f: &'g File) {
            let n = self.index.len();
            self.index.insert(f, n);
            self.low.insert(f, n);
            self.stack.push(f);
            for t in self.graph.get(f).into_iter().flatten() {
                let Some((t, _)) = self.graph.get_key_value(t) else { continue };
                if !self.index.contains_key(t) {
                    self.visit(t);
                    let low = self.low[f].min(self.low[t]);
                    self.low.insert(f, low);
                } else if self.stack.contains(&t) {
                    let low = self.low[f].min(self.index[t]);
                    self.low.insert(f, low);
                }
            }
            if self.low[f] == self.index[f] {
                let mut component = BTreeSet::new();
                while let Some(top) = self.stack.pop() {
                    component.insert(top.clone());
                    if top == f {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.out.push(component);
                }
            }
        }
    }
    let mut walk = Walk { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), out: Vec::new() };
    for f in graph.keys() {
        if !walk.index.contains_key(f) {
            walk.visit(f);
        }
    }
    walk.out
}

/// Each tangle as its files and one cycle through it.
fn describe(graph: &BTreeMap<File, BTreeSet<File>>, tangles: &[BTreeSet<File>]) -> String {
    tangles
        .iter()
        .map(|t| {
            let inner: BTreeMap<File, BTreeSet<File>> =
                t.iter().map(|f| (f.clone(), graph[f].iter().filter(|g| t.contains(*g)).cloned().collect())).collect();
            let cycle = find_cycle(&inner).unwrap_or_default().join(" → ");
            format!("{} ({}), e.g. {cycle}", t.len(), t.iter().cloned().collect::<Vec<_>>().join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `src/` of this crate.
pub fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_module_level_import_graph_has_no_cycle() {
    let files = import_graph(&src_dir());
    assert!(files.len() > 20, "expected the whole of src/, found {} files", files.len());
    assert!(files.values().map(BTreeSet::len).sum::<usize>() > 40, "expected many edges: {files:?}");
    let units: BTreeMap<File, BTreeSet<File>> = super::layers::unit_graph(&files)
        .into_iter()
        .map(|(unit, targets)| (unit, targets.into_keys().collect()))
        .collect();
    let tangles = tangles(&units);
    assert!(tangles.is_empty(), "import cycles between the modules of src/:\n{}", describe(&units, &tangles));
    assert_eq!(find_cycle(&units), None);
}

#[test]
fn the_graph_resolves_paths_to_the_deepest_file_and_skips_tests() {
    let texts = [
        ("lib.rs", "pub mod a; pub mod d;"),
        ("a/mod.rs", "pub mod b; pub mod c; #[cfg(test)] mod t;"),
        (
            "a/b.rs",
            "use crate::{d::Thing, a::{c as renamed, b::deep::Item}};\nuse super::c::X; // crate::d::Commented\nconst S: &str = \"crate::d::InAString\";\n#[cfg(test)]\nmod tests { use crate::a::c; }\nfn f() -> crate::d::Y { renamed::Z }",
        ),
        ("a/c.rs", "use crate::a::t::Helper;"),
        ("a/t.rs", "use crate::d;"),
        ("d.rs", ""),
    ];
    let sources: BTreeMap<File, Source> =
        texts.iter().map(|(f, t)| (f.to_string(), source::parse(t).expect("parses"))).collect();
    let graph = graph_of(&sources);
    let edges = |f: &str| graph[f].iter().cloned().collect::<Vec<_>>();
    assert_eq!(edges("a/b.rs"), ["a/c.rs", "d.rs"]);
    assert_eq!(edges("a/c.rs"), ["a/t.rs"]);
    assert_eq!(edges("lib.rs"), Vec::<String>::new());
    assert_eq!(sources["a/mod.rs"].test_mods[0].name, "t");
    let cyclic: BTreeMap<File, BTreeSet<File>> = [
        ("x.rs".to_string(), BTreeSet::from(["y.rs".to_string()])),
        ("y.rs".to_string(), BTreeSet::from(["x.rs".to_string()])),
    ]
    .into();
    assert_eq!(find_cycle(&cyclic), Some(vec!["x.rs".to_string(), "y.rs".to_string(), "x.rs".to_string()]));
    assert_eq!(tangles(&cyclic), vec![BTreeSet::from(["x.rs".to_string(), "y.rs".to_string()])]);
}
