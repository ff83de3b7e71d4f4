//! The module paths a parsed file refers to, resolved as rustc would for
//! the crate's own modules: `crate::`, `super::`, `self::`, a child module
//! (`mod x;` or inline), or a name a `use` of the same module brought in
//! (`use crate::k8s; … k8s::queue::names::X`), in `use` trees, types,
//! expressions, patterns and macro arguments alike. Paths of external
//! crates and single names (`Registry`, whose `use` is the reference) are
//! not references to a module.

use std::collections::BTreeMap;

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::{Item, UseTree, visit::Visit};

/// A module path from the crate root: `[]` is the root, `["k8s", "queue"]`
/// is `crate::k8s::queue`.
pub type ModPath = Vec<String>;

/// How a file's paths start: its module, and the name of the library crate
/// when the file belongs to another crate of the package (`main.rs`).
pub struct Origin<'a> {
    pub module: &'a [String],
    pub library: Option<&'a str>,
}

/// Every module path `syntax` (a file of module `origin.module`) refers to.
pub fn references(syntax: &syn::File, origin: &Origin<'_>) -> Vec<ModPath> {
    let mut out = Vec::new();
    scope(&syntax.items, origin.module.to_vec(), origin, &mut out);
    out
}

/// The names a module's items can start a path with, beyond `crate`,
/// `super` and `self`.
struct Names {
    here: ModPath,
    /// Child modules and `use` imports: name → what it stands for.
    local: BTreeMap<String, ModPath>,
    library: Option<String>,
}

impl Names {
    /// Resolves a path written in this module; `None` for another crate's.
    fn resolve(&self, segments: &[String]) -> Option<ModPath> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.here.clone(),
            "super" => {
                let mut base = self.here.clone();
                base.pop();
                let mut rest = rest;
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
                return Some([base, rest.to_vec()].concat());
            }
            name if Some(name) == self.library.as_deref() => Vec::new(),
            name => self.local.get(name)?.clone(),
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }
}

fn scope(items: &[Item], here: ModPath, origin: &Origin<'_>, out: &mut Vec<ModPath>) {
    let mut names = Names { here: here.clone(), local: BTreeMap::new(), library: origin.library.map(String::from) };
    for item in items {
        if let Item::Mod(m) = item {
            let name = m.ident.to_string();
            names.local.insert(name.clone(), [here.clone(), vec![name]].concat());
        }
    }
    // `use` imports, flattened: (path, the name it binds, or None for a glob).
    let mut uses = Vec::new();
    for item in items {
        if let Item::Use(u) = item {
            flatten(&u.tree, Vec::new(), &mut uses);
        }
    }
    // A `use` may start with a name another `use` binds: resolve until
    // nothing new is bound.
    let mut resolved: Vec<Option<ModPath>> = vec![None; uses.len()];
    loop {
        let mut progress = false;
        for (i, (path, binds)) in uses.iter().enumerate() {
            if resolved[i].is_none()
                && let Some(target) = names.resolve(path)
            {
                if let Some(name) = binds {
                    names.local.entry(name.clone()).or_insert_with(|| target.clone());
                }
                resolved[i] = Some(target);
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    out.extend(resolved.into_iter().flatten());
    let mut walk = Walk { names: &names, out };
    for item in items {
        match item {
            Item::Mod(m) => {
                if let Some((_, inner)) = &m.content {
                    scope(inner, [here.clone(), vec![m.ident.to_string()]].concat(), origin, walk.out);
                }
            }
            Item::Use(_) => {}
            item => walk.visit_item(item),
        }
    }
}

/// The leaves of a use tree: `a::{b as c, d::*, self}`.
fn flatten(tree: &UseTree, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    match tree {
        UseTree::Path(p) => flatten(&p.tree, [prefix, vec![p.ident.to_string()]].concat(), out),
        UseTree::Name(n) if n.ident == "self" => {
            let name = prefix.last().cloned();
            out.push((prefix, name));
        }
        UseTree::Name(n) => {
            let name = n.ident.to_string();
            out.push(([prefix, vec![name.clone()]].concat(), Some(name)));
        }
        UseTree::Rename(r) => {
            let path = [prefix.clone(), vec![r.ident.to_string()]].concat();
            let path = if r.ident == "self" { prefix } else { path };
            out.push((path, Some(r.rename.to_string())));
        }
        UseTree::Glob(_) => out.push((prefix, None)),
        UseTree::Group(g) => {
            for t in &g.items {
                flatten(t, prefix.clone(), out);
            }
        }
    }
}

struct Walk<'a> {
    names: &'a Names,
    out: &'a mut Vec<ModPath>,
}

impl Walk<'_> {
    fn push(&mut self, segments: &[String]) {
        if segments.len() > 1
            && let Some(path) = self.names.resolve(segments)
        {
            self.out.push(path);
        }
    }
}

impl Visit<'_> for Walk<'_> {
    fn visit_path(&mut self, path: &syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.push(&segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_item_mod(&mut self, _: &syn::ItemMod) {
        // Inline modules are scopes of their own (see `scope`).
    }

    fn visit_item_use(&mut self, _: &syn::ItemUse) {
        // A `use` inside a function: resolved like any path below.
    }

    fn visit_macro(&mut self, mac: &syn::Macro) {
        syn::visit::visit_macro(self, mac);
        let mut found = Vec::new();
        token_paths(mac.tokens.clone(), &mut found);
        for p in found {
            self.push(&p);
        }
    }
}

/// The `a::b::c` runs of a macro's tokens.
fn token_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let mut run: Vec<String> = Vec::new();
    let mut colons = 0;
    let flush = |run: &mut Vec<String>, out: &mut Vec<Vec<String>>| {
        if run.len() > 1 {
            out.push(std::mem::take(run));
        }
        run.clear();
    };
    for token in tokens {
        match token {
            TokenTree::Ident(i) if colons == 2 || run.is_empty() => {
                if colons != 2 {
                    flush(&mut run, out);
                }
                run.push(i.to_string());
                colons = 0;
            }
            TokenTree::Ident(i) => {
                flush(&mut run, out);
                run.push(i.to_string());
                colons = 0;
            }
            TokenTree::Punct(p) if p.as_char() == ':' && !run.is_empty() => {
                colons += 1;
                if colons == 1 && p.spacing() != Spacing::Joint {
                    flush(&mut run, out);
                    colons = 0;
                }
            }
            TokenTree::Group(g) => {
                flush(&mut run, out);
                colons = 0;
                token_paths(g.stream(), out);
            }
            _ => {
                flush(&mut run, out);
                colons = 0;
            }
        }
    }
    flush(&mut run, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(text: &str, module: &[&str]) -> Vec<String> {
        let syntax = syn::parse_file(text).expect("parses");
        let module: Vec<String> = module.iter().map(|s| s.to_string()).collect();
        let mut found: Vec<String> =
            references(&syntax, &Origin { module: &module, library: None }).into_iter().map(|p| p.join("::")).collect();
        found.sort();
        found.dedup();
        found
    }

    #[test]
    fn relative_paths_resolve_through_children_uses_super_and_self() {
        let text = r#"
            mod queue;
            mod inner { use super::super::d; fn f() { d::G; } }
            use crate::k8s;
            use crate::{debug::{self, Registry}, http::HealthCheck as Check};
            use super::*;
            use k8s::leader as lead;
            fn f() -> Registry {
                k8s::queue::names::DEPTH;
                queue::Item::new();
                lead::Elector::run();
                self::queue::X;
                tracing::info!("{}", crate::metrics::render());
                let v: Vec<u8> = Vec::new();
                std::mem::drop(v);
                todo!()
            }
        "#;
        assert_eq!(
            refs(text, &["a", "b"]),
            [
                "a",
                "a::b::queue::Item::new",
                "a::b::queue::X",
                "a::d",
                "a::d::G",
                "debug",
                "debug::Registry",
                "http::HealthCheck",
                "k8s",
                "k8s::leader",
                "k8s::leader::Elector::run",
                "k8s::queue::names::DEPTH",
                "metrics::render",
            ]
        );
    }

    #[test]
    fn macro_tokens_yield_their_paths() {
        let mut out = Vec::new();
        let tokens: TokenStream = "a::b::c, d :: e, f: g, ::h::i, x.y".parse().expect("tokens");
        token_paths(tokens, &mut out);
        assert_eq!(out, [vec!["a", "b", "c"], vec!["d", "e"], vec!["h", "i"]]);
    }
}
