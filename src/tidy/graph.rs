//! The file-level import graph of `src/`.
//!
//! Every `crate::` and `super::` path (and `csi_sidecar::` in `main.rs`),
//! `use` groups included, is an edge from the file that writes it to the
//! deepest file the path reaches (`a/b.rs` or `a/b/mod.rs`, else its parent
//! module). `mod x;` declarations are not edges, and test code (items under
//! `#[cfg(test)]` and the files such a `mod` declares) is left out.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// A source file of `src/`, as its path relative to `src/`.
pub type File = String;

/// The module path of a file: `lib.rs` → `[]`, `a/mod.rs` → `[a]`, `a/b.rs` → `[a, b]`.
pub fn module_path(file: &str) -> Vec<String> {
    let stem = file.strip_suffix(".rs").unwrap_or(file);
    let mut parts: Vec<String> = stem.split('/').map(String::from).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// Replaces comments and the contents of string and char literals with
/// spaces, so braces and paths can be found by plain scanning.
pub fn strip_literals(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == 'r' && matches!(next, Some('"' | '#')) && !b.get(i.wrapping_sub(1)).is_some_and(|p| is_ident(*p))
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let rest: String = b[j + 1..].iter().collect();
            let len = rest.find(&close).map_or(b.len() - j - 1, |p| rest[..p].chars().count());
            for &ch in &b[i..(j + 1 + len + close.len()).min(b.len())] {
                blank(&mut out, ch);
            }
            i = j + 1 + len + close.len();
        } else if c == '"' {
            blank(&mut out, c);
            i += 1;
            while i < b.len() && b[i] != '"' {
                let skip = if b[i] == '\\' { 2 } else { 1 };
                for &ch in &b[i..(i + skip).min(b.len())] {
                    blank(&mut out, ch);
                }
                i += skip;
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && next == Some('\\') {
            // An escaped char literal: '\n', '\'', '\u{..}'.
            let mut j = i + 2;
            while j < b.len() && b[j] != '\'' {
                j += 1;
            }
            for _ in i..=j.min(b.len() - 1) {
                out.push(' ');
            }
            i = j + 1;
        } else if c == '\'' && b.get(i + 2) == Some(&'\'') {
            out.push_str("   ");
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The index just past the block that opens at or after `from` (the first
/// `{` at depth 0) or past the first `;` before any `{`.
fn item_end(text: &[char], from: usize) -> usize {
    let mut i = from;
    while i < text.len() && text[i] != '{' && text[i] != ';' {
        i += 1;
    }
    if i >= text.len() || text[i] == ';' {
        return (i + 1).min(text.len());
    }
    let mut depth = 0;
    while i < text.len() {
        match text[i] {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    text.len()
}

/// What one file says: paths it references (absolute module paths) and the
/// `mod x;` files it declares under `#[cfg(test)]`.
#[derive(Default)]
struct Scan {
    paths: Vec<Vec<String>>,
    test_mods: Vec<String>,
}

/// Reads identifiers and `::` from `text[i..]`.
struct Cursor<'a> {
    text: &'a [char],
    i: usize,
}

impl Cursor<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.text.len() && self.text[self.i].is_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        let chars: Vec<char> = s.chars().collect();
        if self.text[self.i..].starts_with(&chars) {
            self.i += chars.len();
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<String> {
        self.skip_ws();
        let start = self.i;
        while self.i < self.text.len() && is_ident(self.text[self.i]) {
            self.i += 1;
        }
        (self.i > start).then(|| self.text[start..self.i].iter().collect())
    }

    /// A use tree after `prefix::`: `a::b`, `a::{b as x, c::d}`, `*`; every leaf
    /// path is pushed to `out`.
    fn tree(&mut self, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.eat("{") {
            loop {
                if self.eat("}") {
                    return;
                }
                self.tree(prefix.clone(), out);
                if !self.eat(",") {
                    self.eat("}");
                    return;
                }
            }
        }
        let mut path = prefix;
        if self.eat("*") {
            out.push(path);
            return;
        }
        while let Some(seg) = self.ident() {
            path.push(seg);
            let save = self.i;
            if !self.eat("::") {
                break;
            }
            if self.text.get(self.i..).is_some_and(|t| t.first() == Some(&'<')) {
                self.i = save;
                break;
            }
            self.skip_ws();
            if self.text.get(self.i) == Some(&'{') || self.text.get(self.i) == Some(&'*') {
                return self.tree(path, out);
            }
        }
        // `a::b as c`: the rename is not a path.
        if self.eat("as ") {
            self.ident();
        }
        out.push(path);
    }
}

/// The module a relative path starts from: `crate` → root, each `super` one
/// level up from `here`.
fn scan(text: &str, here: &[String], is_main: bool) -> Scan {
    let t: Vec<char> = strip_literals(text).chars().collect();
    let mut out = Scan::default();
    let mut i = 0;
    // Inline modules: (end index, module path inside).
    let mut scopes: Vec<(usize, Vec<String>)> = vec![(t.len(), here.to_vec())];
    while i < t.len() {
        while scopes.last().is_some_and(|(end, _)| i >= *end) {
            scopes.pop();
        }
        let current = scopes.last().map(|(_, p)| p.clone()).unwrap_or_default();
        let at_word = i == 0 || !(is_ident(t[i - 1]) || (t[i - 1] == ':' && i >= 2 && t[i - 2] == ':'));
        let rest = &t[i..];
        let starts = |s: &str| rest.starts_with(&s.chars().collect::<Vec<_>>());
        if starts("#[cfg(test)]") {
            let mut c = Cursor { text: &t, i: i + "#[cfg(test)]".len() };
            // Further attributes and visibility before the item.
            loop {
                c.skip_ws();
                if c.text.get(c.i) == Some(&'#') {
                    c.i = item_end_attr(&t, c.i);
                } else {
                    break;
                }
            }
            let save = c.i;
            let _ = c.eat("pub");
            if c.eat("(") {
                while c.i < t.len() && t[c.i] != ')' {
                    c.i += 1;
                }
                c.i += 1;
            }
            if c.ident().as_deref() == Some("mod")
                && let Some(name) = c.ident()
                && c.eat(";")
            {
                out.test_mods.push(name);
            }
            i = item_end(&t, save);
            continue;
        }
        if at_word && (starts("mod ") || starts("mod\n")) {
            let mut c = Cursor { text: &t, i: i + 3 };
            if let Some(name) = c.ident()
                && c.eat("{")
            {
                let end = item_end(&t, i);
                let mut inner = current.clone();
                inner.push(name);
                scopes.push((end, inner));
                i = c.i;
                continue;
            }
        }
        let root = if is_main { "csi_sidecar" } else { "crate" };
        if at_word && (starts(&format!("{root}::")) || starts("super::")) {
            let mut c = Cursor { text: &t, i };
            let mut base = current.clone();
            if c.eat(root) {
                base.clear();
                c.eat("::");
            } else {
                while c.eat("super") {
                    base.pop();
                    if !c.eat("::") {
                        break;
                    }
                }
            }
            let mut paths = Vec::new();
            c.tree(base, &mut paths);
            out.paths.extend(paths);
            i = c.i.max(i + 1);
            continue;
        }
        i += 1;
    }
    out
}

/// Past an attribute `#[...]` that starts at `from`.
fn item_end_attr(t: &[char], from: usize) -> usize {
    let mut depth = 0;
    let mut i = from;
    while i < t.len() {
        match t[i] {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    t.len()
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

/// The file graph of `src/` without test code.
pub fn import_graph(src: &Path) -> BTreeMap<File, BTreeSet<File>> {
    let mut files = BTreeSet::new();
    rust_files(src, src, &mut files);
    let scans: BTreeMap<File, Scan> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(src.join(f)).expect("read source");
            let scanned = scan(&text, &module_path(f), f == "main.rs");
            (f.clone(), scanned)
        })
        .collect();
    // Test-only module paths: declared under #[cfg(test)], and all below them.
    let test_roots: Vec<Vec<String>> = scans
        .iter()
        .flat_map(|(f, s)| {
            let base = module_path(f);
            s.test_mods.iter().map(move |m| [base.clone(), vec![m.clone()]].concat())
        })
        .collect();
    let is_test = |f: &str| {
        let p = module_path(f);
        test_roots.iter().any(|r| p.starts_with(r)) && f != "lib.rs" && f != "main.rs"
    };
    let mut graph = BTreeMap::new();
    for (f, s) in &scans {
        if is_test(f) {
            continue;
        }
        let targets: BTreeSet<File> =
            s.paths.iter().filter_map(|p| resolve(&files, p)).filter(|t| t != f && !is_test(t)).collect();
        graph.insert(f.clone(), targets);
    }
    graph
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
            format!("{} files ({}), e.g. {cycle}", t.len(), t.iter().cloned().collect::<Vec<_>>().join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `src/` of this crate.
pub fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_import_graph_of_src_has_no_cycle() {
    let graph = import_graph(&src_dir());
    assert!(graph.len() > 20, "expected the whole of src/, found {} files", graph.len());
    assert!(graph.values().map(BTreeSet::len).sum::<usize>() > 40, "expected many edges: {graph:?}");
    let tangles = tangles(&graph);
    assert!(tangles.is_empty(), "import cycles in src/:\n{}", describe(&graph, &tangles));
    assert_eq!(find_cycle(&graph), None);
}

#[test]
fn the_scanner_resolves_groups_super_and_skips_tests() {
    let files: BTreeSet<File> =
        ["lib.rs", "a/mod.rs", "a/b.rs", "a/c.rs", "d.rs", "a/b/t.rs"].into_iter().map(String::from).collect();
    let text = r#"
        use crate::{d::Thing, a::{c as renamed, b::deep::Item}};
        use super::c::X; // crate::d::Commented
        const S: &str = "crate::d::InAString";
        mod inner { use super::super::d; }
        #[cfg(test)]
        mod t;
        #[cfg(test)]
        mod tests { use crate::a::c; }
        fn f() -> crate::d::Y { todo!() }
    "#;
    let s = scan(text, &module_path("a/b.rs"), false);
    let resolved: Vec<File> = s.paths.iter().filter_map(|p| resolve(&files, p)).collect();
    assert_eq!(resolved, ["d.rs", "a/c.rs", "a/b.rs", "a/c.rs", "a/mod.rs", "d.rs"]);
    assert_eq!(s.test_mods, ["t"]);
    let cyclic: BTreeMap<File, BTreeSet<File>> = [
        ("x.rs".to_string(), BTreeSet::from(["y.rs".to_string()])),
        ("y.rs".to_string(), BTreeSet::from(["x.rs".to_string()])),
    ]
    .into();
    assert_eq!(find_cycle(&cyclic), Some(vec!["x.rs".to_string(), "y.rs".to_string(), "x.rs".to_string()]));
    assert_eq!(tangles(&cyclic), vec![BTreeSet::from(["x.rs".to_string(), "y.rs".to_string()])]);
}
