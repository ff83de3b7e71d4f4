//! One source file as the tidy rules see it: parsed with `syn`, its test
//! items (`#[cfg(test)]`, at any depth) dropped, then what the rules read:
//! its string literals (macro arguments included, doc comments not), its
//! lines of code outside tests, and the `mod x;` files it declares for
//! tests only.

use std::path::Path;

use proc_macro2::{TokenStream, TokenTree};
use syn::{Attribute, ImplItem, Item, Lit, Meta, TraitItem, spanned::Spanned, visit::Visit};

/// A file of a source tree, as its path relative to the tree's root.
pub type File = String;

/// A parsed file without its test code.
pub struct Source {
    /// Items outside `#[cfg(test)]`.
    pub syntax: syn::File,
    /// `mod x;` declared under `#[cfg(test)]` (their files are test code).
    pub test_mods: Vec<TestMod>,
    /// Lines neither blank nor only a comment, outside test items.
    pub lines_of_code: usize,
}

/// A `mod x;` under `#[cfg(test)]`: its name, and its file when a
/// `#[path = "…"]` names it (relative to the declaring file's folder).
#[derive(Debug, PartialEq, Eq)]
pub struct TestMod {
    pub name: String,
    pub path: Option<String>,
}

/// Why a file could not be read as Rust.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{file}: {cause}")]
    Io { file: String, cause: std::io::Error },
    #[error("{file}: not Rust syn can parse: {cause}")]
    Parse { file: String, cause: syn::Error },
}

/// Reads and parses `root/file`.
pub fn read(root: &Path, file: &str) -> Result<Source, ReadError> {
    let text =
        std::fs::read_to_string(root.join(file)).map_err(|cause| ReadError::Io { file: file.to_string(), cause })?;
    parse(&text).map_err(|cause| ReadError::Parse { file: file.to_string(), cause })
}

/// Parses `text` and drops its test items (pure).
pub fn parse(text: &str) -> syn::Result<Source> {
    let mut syntax = syn::parse_file(text)?;
    let mut dropped = Vec::new();
    let mut test_mods = Vec::new();
    drop_test_items(&mut syntax.items, &mut dropped, &mut test_mods);
    // Inner attributes (`#![cfg(test)]`) make the whole file test code.
    if syntax.attrs.iter().any(is_cfg_test) {
        syntax.items.clear();
        dropped.push((1, text.lines().count()));
    }
    let lines_of_code = text
        .lines()
        .enumerate()
        .filter(|(i, _)| !dropped.iter().any(|(first, last)| (*first..=*last).contains(&(i + 1))))
        .map(|(_, l)| l.trim())
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .count();
    Ok(Source { syntax, test_mods, lines_of_code })
}

/// `#[cfg(test)]`, or a `cfg` that needs `test` (`all(test, …)`).
fn is_cfg_test(attr: &Attribute) -> bool {
    if !attr.path().is_ident("cfg") {
        return false;
    }
    let Meta::List(list) = &attr.meta else { return false };
    let mut tokens = list.tokens.clone().into_iter();
    match tokens.next() {
        Some(TokenTree::Ident(i)) if i == "test" => tokens.next().is_none(),
        Some(TokenTree::Ident(i)) if i == "all" => match tokens.next() {
            Some(TokenTree::Group(g)) => {
                g.stream().into_iter().any(|t| matches!(&t, TokenTree::Ident(i) if i == "test"))
            }
            _ => false,
        },
        _ => false,
    }
}

/// Removes the test items of `items` and of everything nested in them,
/// recording the lines they spanned and the test `mod x;` declarations.
fn drop_test_items(items: &mut Vec<Item>, dropped: &mut Vec<(usize, usize)>, test_mods: &mut Vec<TestMod>) {
    items.retain(|item| {
        let attrs = item_attrs(item);
        if !attrs.iter().any(is_cfg_test) {
            return true;
        }
        if let Item::Mod(m) = item
            && m.content.is_none()
        {
            test_mods.push(TestMod { name: m.ident.to_string(), path: path_attr(&m.attrs) });
        }
        dropped.push(lines(item.span()));
        false
    });
    for item in items.iter_mut() {
        match item {
            Item::Mod(m) => {
                if let Some((_, inner)) = &mut m.content {
                    drop_test_items(inner, dropped, test_mods);
                }
            }
            Item::Impl(i) => i.items.retain(|it| {
                let test = matches!(it, ImplItem::Fn(f) if f.attrs.iter().any(is_cfg_test))
                    || matches!(it, ImplItem::Const(c) if c.attrs.iter().any(is_cfg_test))
                    || matches!(it, ImplItem::Type(t) if t.attrs.iter().any(is_cfg_test));
                if test {
                    dropped.push(lines(it.span()));
                }
                !test
            }),
            Item::Trait(t) => t.items.retain(|it| {
                let test = matches!(it, TraitItem::Fn(f) if f.attrs.iter().any(is_cfg_test));
                if test {
                    dropped.push(lines(it.span()));
                }
                !test
            }),
            _ => {}
        }
    }
}

/// The file a `#[path = "…"]` names.
fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find(|a| a.path().is_ident("path")).and_then(|a| match &a.meta {
        Meta::NameValue(nv) => match &nv.value {
            syn::Expr::Lit(syn::ExprLit { lit: Lit::Str(s), .. }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

fn lines(span: proc_macro2::Span) -> (usize, usize) {
    (span.start().line, span.end().line)
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// Every string literal of the code (`"…"`, `r"…"`; in macro arguments and
/// attributes too), unescaped; doc comments are not code.
pub fn string_literals(syntax: &syn::File) -> Vec<String> {
    let mut found = Literals(Vec::new());
    found.visit_file(syntax);
    found.0
}

struct Literals(Vec<String>);

impl Visit<'_> for Literals {
    fn visit_lit_str(&mut self, lit: &syn::LitStr) {
        self.0.push(lit.value());
    }

    fn visit_attribute(&mut self, attr: &Attribute) {
        if attr.path().is_ident("doc") {
            return;
        }
        if let Meta::List(list) = &attr.meta {
            token_literals(list.tokens.clone(), &mut self.0);
        }
        syn::visit::visit_attribute(self, attr);
    }

    fn visit_macro(&mut self, mac: &syn::Macro) {
        token_literals(mac.tokens.clone(), &mut self.0);
    }
}

fn token_literals(tokens: TokenStream, out: &mut Vec<String>) {
    for token in tokens {
        match token {
            TokenTree::Group(g) => token_literals(g.stream(), out),
            TokenTree::Literal(l) => {
                if let Lit::Str(s) = Lit::new(l) {
                    out.push(s.value());
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_items_are_dropped_at_any_depth_and_not_counted() {
        let text = r#"
            //! A file.
            const A: &str = "kept";
            #[cfg(test)]
            mod tests;
            #[cfg(test)]
            #[path = "other_tests.rs"]
            mod more;
            #[cfg(test)]
            mod inline { const B: &str = "dropped"; }
            mod real {
                const C: &str = "kept too";
                #[cfg(all(test, unix))]
                fn helper() { let d = "dropped"; }
            }
            impl X {
                #[cfg(test)]
                fn only_in_tests() -> &'static str { "dropped" }
                fn f() { println!("{}", "in a macro"); }
            }
            /// "a doc comment"
            #[error("an attribute")]
            struct Y;
            const E: &str = "after the tests";
        "#;
        let source = parse(text).expect("parses");
        assert_eq!(
            source.test_mods,
            [
                TestMod { name: "tests".into(), path: None },
                TestMod { name: "more".into(), path: Some("other_tests.rs".into()) }
            ]
        );
        assert_eq!(
            string_literals(&source.syntax),
            ["kept", "kept too", "{}", "in a macro", "an attribute", "after the tests"]
        );
        // 23 lines: 2 comments, 11 in test items.
        assert_eq!(source.lines_of_code, 10);
    }

    #[test]
    fn a_file_under_inner_cfg_test_is_all_test_code() {
        let source = parse("#![cfg(test)]\nconst A: &str = \"x\";\n").expect("parses");
        assert!(string_literals(&source.syntax).is_empty());
        assert_eq!(source.lines_of_code, 0);
    }
}
