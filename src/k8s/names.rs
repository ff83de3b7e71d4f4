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
/// 64 random bits: the standard library's per-process random hasher keys
/// over the process ID, the time and `salt` (no dependency for what needs
/// only to differ between processes and calls, not to be secret).
fn random_word(salt: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(salt);
    h.write_u32(std::process::id());
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish()
}

/// Eight random hex digits (the identity suffix of a leader-election candidate).
pub fn random_word_hex() -> String {
    format!("{:08x}", random_word(0) as u32)
}

/// A random RFC 4122 version-4 UUID (upstream's `uuid.NewUUID()` in the
/// provisioning library's event component).
pub fn random_uuid() -> String {
    let hi = (random_word(1) & !0xf000) | 0x4000; // version 4
    let lo = (random_word(2) & !(0xc << 60)) | (0x8 << 60); // variant 10
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod random_tests {
    use super::*;

    #[test]
    fn uuids_are_version_4_and_differ() {
        let (a, b) = (random_uuid(), random_uuid());
        assert_ne!(a, b);
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [8, 4, 4, 4, 12]);
        assert!(parts[2].starts_with('4'), "version 4: {a}");
        assert!(matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'), "variant 10: {a}");
        assert_eq!(random_word_hex().len(), 8);
    }
}
