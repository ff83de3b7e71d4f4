//! StorageClass parameters with the reserved `csi.storage.k8s.io/` prefix:
//! fsType, the secret references (with their name/namespace templates) and
//! the stripping of reserved keys before `CreateVolume`. Pure functions.

use std::collections::{BTreeMap, HashMap};

pub use crate::k8s::names::{expand, is_dns1123_label, is_dns1123_subdomain};

/// Keys `--extra-create-metadata` adds to `CreateVolume` parameters, and
/// the reserved prefix.
pub use crate::compat::storage_class::{PREFIX, PV_NAME, PVC_NAME, PVC_NAMESPACE};
/// `csi.storage.k8s.io/fstype`.
pub const FSTYPE: &str = crate::compat::provisioner::PARAM_FSTYPE;

/// A StorageClass that cannot be used, worded like upstream's errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// A reserved key nobody knows.
    #[error("found unknown parameter key \"{0}\" with reserved namespace csi.storage.k8s.io/")]
    UnknownReservedKey(String),
    /// `fstype` and `csi.storage.k8s.io/fstype` both set.
    #[error("fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys")]
    FsTypeTwice,
    /// A secret given with both the deprecated and the prefixed key.
    #[error("{0} secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys")]
    SecretTwice(&'static str),
    /// Only one of name and namespace.
    #[error("either name and namespace for {0} secrets specified, Both must be specified")]
    SecretHalf(&'static str),
    /// Name or namespace empty.
    #[error("{0} secrets specified in parameters but value of either namespace or name is empty")]
    SecretEmpty(&'static str),
    /// The name and namespace templates of a secret kind cannot be read
    /// (upstream `getSecretReference`'s wrapping; `which` is `"default "`
    /// for the `csi.storage.k8s.io/secret-*` fallback, else empty).
    #[error("failed to get {which}name and namespace template from params: {cause}")]
    Templates {
        /// `""` or `"default "`.
        which: &'static str,
        /// [`ParamError::SecretTwice`], [`ParamError::SecretHalf`] or [`ParamError::SecretEmpty`].
        cause: Box<ParamError>,
    },
    /// A template with tokens that cannot be resolved.
    #[error("error resolving value {template:?}: invalid tokens: {}", go_quoted_list(.tokens))]
    InvalidTokens {
        /// The template.
        template: String,
        /// The unknown tokens, sorted.
        tokens: Vec<String>,
    },
    /// The resolved namespace is no DNS-1123 label.
    #[error("{0}")]
    BadNamespace(String),
    /// The resolved name is no DNS-1123 subdomain.
    #[error("{0}")]
    BadName(String),
}

/// The kinds of secret a StorageClass can reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretKind {
    /// CreateVolume / DeleteVolume.
    Provisioner,
    /// `spec.csi.controllerPublishSecretRef`.
    ControllerPublish,
    /// `spec.csi.nodeStageSecretRef`.
    NodeStage,
    /// `spec.csi.nodePublishSecretRef`.
    NodePublish,
    /// `spec.csi.controllerExpandSecretRef`.
    ControllerExpand,
    /// `spec.csi.nodeExpandSecretRef`.
    NodeExpand,
    /// The PV's controller-modify secret annotations.
    ControllerModify,
    /// `secret-name`/`secret-namespace`: the default for every kind above.
    Default,
}

struct Keys {
    label: &'static str,
    name: &'static str,
    namespace: &'static str,
    deprecated: Option<(&'static str, &'static str)>,
}

impl SecretKind {
    /// Every kind but the default.
    pub const ALL: [SecretKind; 7] = [
        SecretKind::Provisioner,
        SecretKind::ControllerPublish,
        SecretKind::NodeStage,
        SecretKind::NodePublish,
        SecretKind::ControllerExpand,
        SecretKind::NodeExpand,
        SecretKind::ControllerModify,
    ];

    fn keys(self) -> Keys {
        use crate::compat::storage_class as sc;
        let (label, params) = match self {
            SecretKind::Provisioner => ("Provisioner", sc::PROVISIONER_SECRET),
            SecretKind::ControllerPublish => ("ControllerPublish", sc::CONTROLLER_PUBLISH_SECRET),
            SecretKind::NodeStage => ("NodeStage", sc::NODE_STAGE_SECRET),
            SecretKind::NodePublish => ("NodePublish", sc::NODE_PUBLISH_SECRET),
            SecretKind::ControllerExpand => ("ControllerExpand", sc::CONTROLLER_EXPAND_SECRET),
            SecretKind::NodeExpand => ("NodeExpand", sc::NODE_EXPAND_SECRET),
            SecretKind::ControllerModify => ("ControllerModify", sc::CONTROLLER_MODIFY_SECRET),
            SecretKind::Default => ("Default", sc::DEFAULT_SECRET),
        };
        Keys { label, name: params.name, namespace: params.namespace, deprecated: params.deprecated }
    }
}

fn known_reserved(key: &str) -> bool {
    key == FSTYPE
        || SecretKind::ALL.iter().chain([SecretKind::Default].iter()).any(|k| {
            let keys = k.keys();
            key == keys.name || key == keys.namespace
        })
}

/// The parameters for `CreateVolume`: reserved keys removed (an unknown
/// reserved key is an error); deprecated unprefixed keys are kept, as upstream.
pub fn strip_reserved(params: &BTreeMap<String, String>) -> Result<HashMap<String, String>, ParamError> {
    let mut out = HashMap::new();
    for (k, v) in params {
        if k.starts_with(PREFIX) {
            if !known_reserved(k) {
                return Err(ParamError::UnknownReservedKey(k.clone()));
            }
        } else {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok(out)
}

/// The filesystem type: `csi.storage.k8s.io/fstype` (or the deprecated
/// `fstype`, any case), else `--default-fstype`, else empty.
pub fn fs_type(params: &BTreeMap<String, String>, default_fstype: &str) -> Result<String, ParamError> {
    let found: Vec<&String> = params
        .iter()
        .filter(|(k, _)| k.as_str() == FSTYPE || k.eq_ignore_ascii_case("fstype"))
        .map(|(_, v)| v)
        .collect();
    match found.as_slice() {
        [] => Ok(default_fstype.to_string()),
        [one] if one.is_empty() => Ok(default_fstype.to_string()),
        [one] => Ok((*one).clone()),
        _ => Err(ParamError::FsTypeTwice),
    }
}

/// A resolved secret reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    /// Secret name.
    pub name: String,
    /// Secret namespace.
    pub namespace: String,
}

/// What a template may refer to.
#[derive(Clone, Debug, Default)]
pub struct TemplateContext<'a> {
    /// The PV name (`${pv.name}`).
    pub pv_name: &'a str,
    /// The PVC name (`${pvc.name}`, name templates only).
    pub pvc_name: Option<&'a str>,
    /// The PVC namespace (`${pvc.namespace}`).
    pub pvc_namespace: Option<&'a str>,
    /// The PVC annotations (`${pvc.annotations['key']}`, name templates only).
    pub pvc_annotations: Option<&'a BTreeMap<String, String>>,
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_quoted_list(items: &[String]) -> String {
    format!("[{}]", items.iter().map(|i| format!("{i:?}")).collect::<Vec<_>>().join(" "))
}

fn templates(kind: SecretKind, params: &BTreeMap<String, String>) -> Result<Option<(String, String)>, ParamError> {
    let keys = kind.keys();
    let mut names = Vec::new();
    let mut namespaces = Vec::new();
    if let Some((dn, dns)) = keys.deprecated {
        names.extend(params.get(dn));
        namespaces.extend(params.get(dns));
    }
    names.extend(params.get(keys.name));
    namespaces.extend(params.get(keys.namespace));
    match (names.as_slice(), namespaces.as_slice()) {
        ([], []) => Ok(None),
        ([n], [ns]) if n.is_empty() || ns.is_empty() => Err(ParamError::SecretEmpty(keys.label)),
        ([n], [ns]) => Ok(Some(((*n).clone(), (*ns).clone()))),
        (n, ns) if n.len() > 1 || ns.len() > 1 => Err(ParamError::SecretTwice(keys.label)),
        _ => Err(ParamError::SecretHalf(keys.label)),
    }
}

/// The secret of `kind` (or the default secret) with its templates
/// resolved; `None` when the StorageClass names none.
pub fn secret_ref(
    kind: SecretKind,
    params: &BTreeMap<String, String>,
    ctx: &TemplateContext<'_>,
) -> Result<Option<SecretRef>, ParamError> {
    let wrap = |which| move |e| ParamError::Templates { which, cause: Box::new(e) };
    let found = match templates(kind, params).map_err(wrap(""))? {
        Some(t) => Some(t),
        None => templates(SecretKind::Default, params).map_err(wrap("default "))?,
    };
    let Some((name_t, ns_t)) = found else {
        return Ok(None);
    };
    let ns_lookup = |k: &str| match k {
        "pv.name" => Some(ctx.pv_name.to_string()),
        "pvc.namespace" => ctx.pvc_namespace.map(String::from),
        _ => None,
    };
    let namespace =
        expand(&ns_t, ns_lookup).map_err(|tokens| ParamError::InvalidTokens { template: ns_t.clone(), tokens })?;
    if !is_dns1123_label(&namespace) {
        return Err(ParamError::BadNamespace(if namespace == ns_t {
            format!("{ns_t:?} is not a valid namespace name")
        } else {
            format!("{ns_t:?} resolved to {namespace:?} which is not a valid namespace name")
        }));
    }
    let name_lookup = |k: &str| match k {
        "pv.name" => Some(ctx.pv_name.to_string()),
        "pvc.name" => ctx.pvc_name.map(String::from),
        "pvc.namespace" => ctx.pvc_namespace.map(String::from),
        _ => {
            let key = k.strip_prefix("pvc.annotations['")?.strip_suffix("']")?;
            ctx.pvc_annotations?.get(key).cloned()
        }
    };
    let name = expand(&name_t, name_lookup)
        .map_err(|tokens| ParamError::InvalidTokens { template: name_t.clone(), tokens })?;
    if !is_dns1123_subdomain(&name) {
        return Err(ParamError::BadName(if name == name_t {
            format!("{name_t:?} is not a valid secret name")
        } else {
            format!("{name_t:?} resolved to {name:?} which is not a valid secret name")
        }));
    }
    Ok(Some(SecretRef { name, namespace }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn reserved_keys_are_stripped_and_unknown_ones_refused() {
        let params = p(&[
            ("type", "fast"),
            (FSTYPE, "ext4"),
            ("csi.storage.k8s.io/provisioner-secret-name", "s"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "ns"),
            ("csiNodeStageSecretName", "legacy"),
        ]);
        let out = strip_reserved(&params).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out["type"], "fast");
        assert_eq!(out["csiNodeStageSecretName"], "legacy", "deprecated keys pass through");
        let err = strip_reserved(&p(&[("csi.storage.k8s.io/foo", "x")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "found unknown parameter key \"csi.storage.k8s.io/foo\" with reserved namespace csi.storage.k8s.io/"
        );
    }

    #[test]
    fn fs_types() {
        assert_eq!(fs_type(&p(&[(FSTYPE, "xfs")]), "ext4").unwrap(), "xfs");
        assert_eq!(fs_type(&p(&[("fsType", "xfs")]), "").unwrap(), "xfs");
        assert_eq!(fs_type(&p(&[]), "ext4").unwrap(), "ext4");
        assert_eq!(fs_type(&p(&[]), "").unwrap(), "");
        assert_eq!(fs_type(&p(&[(FSTYPE, "xfs"), ("fstype", "ext4")]), "").unwrap_err(), ParamError::FsTypeTwice);
    }

    fn ctx<'a>(ann: &'a BTreeMap<String, String>) -> TemplateContext<'a> {
        TemplateContext {
            pv_name: "pvc-123",
            pvc_name: Some("data"),
            pvc_namespace: Some("team-a"),
            pvc_annotations: Some(ann),
        }
    }

    #[test]
    fn secret_templates() {
        let ann = p(&[("example.com/secret", "from-annotation")]);
        let c = ctx(&ann);
        let r = |params: &[(&str, &str)], kind| secret_ref(kind, &p(params), &c);
        let ok = |name: &str, ns: &str| Ok(Some(SecretRef { name: name.into(), namespace: ns.into() }));
        use SecretKind::*;
        type Row<'a> = (Vec<(&'a str, &'a str)>, SecretKind, Result<Option<SecretRef>, ParamError>);
        let table: Vec<Row> = vec![
            (vec![], Provisioner, Ok(None)),
            (
                vec![
                    ("csi.storage.k8s.io/provisioner-secret-name", "s"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "ns"),
                ],
                Provisioner,
                ok("s", "ns"),
            ),
            (
                vec![("csi.storage.k8s.io/secret-name", "d"), ("csi.storage.k8s.io/secret-namespace", "dns")],
                NodeStage,
                ok("d", "dns"),
            ),
            (
                vec![
                    ("csi.storage.k8s.io/node-publish-secret-name", "${pvc.name}-${pv.name}"),
                    ("csi.storage.k8s.io/node-publish-secret-namespace", "${pvc.namespace}"),
                ],
                NodePublish,
                ok("data-pvc-123", "team-a"),
            ),
            (
                vec![
                    ("csi.storage.k8s.io/node-publish-secret-name", "${pvc.annotations['example.com/secret']}"),
                    ("csi.storage.k8s.io/node-publish-secret-namespace", "fixed"),
                ],
                NodePublish,
                ok("from-annotation", "fixed"),
            ),
            (
                vec![("csiProvisionerSecretName", "old"), ("csiProvisionerSecretNamespace", "oldns")],
                Provisioner,
                ok("old", "oldns"),
            ),
            (
                vec![
                    ("csiProvisionerSecretName", "old"),
                    ("csi.storage.k8s.io/provisioner-secret-name", "new"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "n"),
                ],
                Provisioner,
                Err(ParamError::Templates { which: "", cause: Box::new(ParamError::SecretTwice("Provisioner")) }),
            ),
            (
                vec![("csi.storage.k8s.io/provisioner-secret-name", "only")],
                Provisioner,
                Err(ParamError::Templates { which: "", cause: Box::new(ParamError::SecretHalf("Provisioner")) }),
            ),
            (
                vec![
                    ("csi.storage.k8s.io/provisioner-secret-name", ""),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "n"),
                ],
                Provisioner,
                Err(ParamError::Templates { which: "", cause: Box::new(ParamError::SecretEmpty("Provisioner")) }),
            ),
            (
                vec![
                    ("csi.storage.k8s.io/provisioner-secret-name", "s"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "${pvc.name}"),
                ],
                Provisioner,
                Err(ParamError::InvalidTokens { template: "${pvc.name}".into(), tokens: vec!["pvc.name".into()] }),
            ),
            (
                vec![
                    ("csi.storage.k8s.io/provisioner-secret-name", "${nope}"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "n"),
                ],
                Provisioner,
                Err(ParamError::InvalidTokens { template: "${nope}".into(), tokens: vec!["nope".into()] }),
            ),
            (
                vec![
                    ("csi.storage.k8s.io/provisioner-secret-name", "Bad_Name"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "n"),
                ],
                Provisioner,
                Err(ParamError::BadName("\"Bad_Name\" is not a valid secret name".into())),
            ),
            (
                vec![
                    ("csi.storage.k8s.io/provisioner-secret-name", "s"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "${pv.name}.x"),
                ],
                Provisioner,
                Err(ParamError::BadNamespace(
                    "\"${pv.name}.x\" resolved to \"pvc-123.x\" which is not a valid namespace name".into(),
                )),
            ),
        ];
        for (params, kind, want) in table {
            assert_eq!(r(&params, kind), want, "{params:?} {kind:?}");
        }
    }

    #[test]
    fn os_expand_forms() {
        let look = |k: &str| (k == "a").then(|| "A".to_string());
        assert_eq!(expand("x-${a}-$a-y", look), Ok("x-A-A-y".into()));
        assert_eq!(expand("cost $ 5", look), Ok("cost $ 5".into()));
        assert_eq!(expand("${b}${c}", look), Err(vec!["b".into(), "c".into()]));
    }

    #[test]
    fn dns_names() {
        assert!(is_dns1123_label("team-a"));
        assert!(!is_dns1123_label("Team"));
        assert!(!is_dns1123_label("-a"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("my.secret-1"));
        assert!(!is_dns1123_subdomain("my..secret"));
    }
}
