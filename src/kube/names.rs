//! Kubernetes object names and the `${...}` templates that build them, as
//! the sidecars check and expand them (shared by the provisioner's and the
//! snapshotter's secret references).

use std::collections::BTreeSet;

/// Go's `os.Expand`: `${name}` and `$name`; `lookup` answers `None` for an
/// unknown token, which is collected.
pub fn expand(template: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, Vec<String>> {
    let mut out = String::with_capacity(template.len());
    let mut missing = BTreeSet::new();
    let mut rest = template;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, consumed) = if let Some(body) = after.strip_prefix('{') {
            match body.find('}') {
                Some(end) => (Some(&body[..end]), end + 2),
                None => (None, after.len()), // unterminated: Go drops the rest
            }
        } else {
            let len = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
            if len == 0 {
                out.push('$');
                (None, 0)
            } else {
                (Some(&after[..len]), len)
            }
        };
        if let Some(name) = name {
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => {
                    missing.insert(name.to_string());
                }
            }
        }
        rest = &after[consumed..];
    }
    out.push_str(rest);
    if missing.is_empty() { Ok(out) } else { Err(missing.into_iter().collect()) }
}

/// A DNS-1123 label (namespace names).
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain (Secret names).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}
