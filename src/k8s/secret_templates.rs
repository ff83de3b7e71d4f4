//! Secrets named by a class's parameters: name and namespace templates
//! (`${volumesnapshotcontent.name}`, ...) resolved and checked with
//! upstream's error texts. The snapshotter's and the snapshot-metadata
//! module's secrets are both named this way.

use std::collections::BTreeMap;

use super::names::{expand, is_dns1123_label, is_dns1123_subdomain};

/// Go's `%q` of a string (`strconv.Quote`), as upstream wraps errors.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The class parameters naming one secret (upstream's `secretParamsMap`).
pub struct SecretKeys {
    /// Upstream's name of the secret in its error texts.
    pub label: &'static str,
    /// The name template's key.
    pub name: &'static str,
    /// The namespace template's key.
    pub namespace: &'static str,
}

/// The template tokens a secret's name or namespace may use, each with its
/// value (`volumesnapshotcontent.name`, ...).
pub type Tokens<'a> = [(&'a str, &'a str)];

/// A secret named by class parameters `keys` (both or neither): its
/// namespace template may use `namespace_tokens`, its name template
/// `name_tokens`. Err: upstream's text.
pub fn class_secret_ref(
    params: Option<&BTreeMap<String, String>>,
    keys: &SecretKeys,
    namespace_tokens: &Tokens<'_>,
    name_tokens: &Tokens<'_>,
) -> Result<Option<(String, String)>, String> {
    let get = |k: &str| params.and_then(|p| p.get(k));
    let label = keys.label;
    let (name_t, ns_t) = match (get(keys.name), get(keys.namespace)) {
        (None, None) => return Ok(None),
        (Some(n), Some(ns)) if !n.is_empty() && !ns.is_empty() => (n, ns),
        (Some(_), Some(_)) => {
            return Err(format!(
                "failed to get name and namespace template from params: {label} secrets specified in parameters but value of either namespace or name is empty"
            ));
        }
        _ => {
            return Err(format!(
                "failed to get name and namespace template from params: either name and namespace for {label} secrets specified, Both must be specified"
            ));
        }
    };
    let resolve = |t: &str, tokens: &Tokens<'_>| {
        let lookup = |k: &str| tokens.iter().find(|(token, _)| *token == k).map(|(_, v)| v.to_string());
        expand(t, lookup).map_err(|missing| {
            let list = missing.iter().map(|m| go_quote(m)).collect::<Vec<_>>().join(" ");
            format!("error resolving value {}: invalid tokens: [{list}]", go_quote(t))
        })
    };
    let ns = resolve(ns_t, namespace_tokens)?;
    if !is_dns1123_label(&ns) {
        return Err(if *ns_t != ns {
            format!("{} resolved to {} which is not a valid namespace name", go_quote(ns_t), go_quote(&ns))
        } else {
            format!("{} is not a valid namespace name", go_quote(ns_t))
        });
    }
    let name = resolve(name_t, name_tokens)?;
    if !is_dns1123_subdomain(&name) {
        return Err(if *name_t != name {
            format!("{} resolved to {} which is not a valid secret name", go_quote(name_t), go_quote(&name))
        } else {
            format!("{} is not a valid secret name", go_quote(name_t))
        });
    }
    Ok(Some((name, ns)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: SecretKeys = SecretKeys {
        label: "Snapshotter",
        name: "csi.storage.k8s.io/snapshotter-secret-name",
        namespace: "csi.storage.k8s.io/snapshotter-secret-namespace",
    };

    fn params(name: &str, namespace: &str) -> BTreeMap<String, String> {
        [(KEYS.name.to_string(), name.to_string()), (KEYS.namespace.to_string(), namespace.to_string())].into()
    }

    /// The namespace and the name each resolve with their own tokens: a
    /// token only the name may use is refused in the namespace.
    #[test]
    fn name_and_namespace_resolve_with_their_own_tokens() {
        let ns_tokens = [("volumesnapshotcontent.name", "c1"), ("volumesnapshot.namespace", "team")];
        let name_tokens =
            [("volumesnapshotcontent.name", "c1"), ("volumesnapshot.namespace", "team"), ("volumesnapshot.name", "s1")];
        let p = params("${volumesnapshot.name}-key", "${volumesnapshot.namespace}");
        assert_eq!(
            class_secret_ref(Some(&p), &KEYS, &ns_tokens, &name_tokens),
            Ok(Some(("s1-key".to_string(), "team".to_string())))
        );
        let p = params("key", "${volumesnapshot.name}");
        assert_eq!(
            class_secret_ref(Some(&p), &KEYS, &ns_tokens, &name_tokens),
            Err("error resolving value \"${volumesnapshot.name}\": invalid tokens: [\"volumesnapshot.name\"]"
                .to_string())
        );
        assert_eq!(class_secret_ref(None, &KEYS, &ns_tokens, &name_tokens), Ok(None));
    }
}
