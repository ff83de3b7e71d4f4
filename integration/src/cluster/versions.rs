//! What the launcher does differently per Kubernetes version: one table
//! ([`VERSION_FLAGS`]), read where the components' arguments are built, so no
//! version conditional is scattered through the launcher.
//!
//! The version is the one the built binary reports (`kube-apiserver
//! --version`), so the table follows `CSI_SIDECAR_KUBE_VERSION` without a
//! second source of truth. Differences that are not flags live elsewhere and
//! are listed in docs/versions.md: the etcd each release pins (the
//! `etcd.mod` beside its module), a version without a kubelet (its module's
//! `tool` list).

use std::{path::Path, process::Command};

use anyhow::{Context, Result, anyhow};

/// A component of the control plane whose arguments the table extends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    KubeApiserver,
}

/// One row: from `since` (major, minor) on, `component` gets `flag`.
#[derive(Debug, Clone, Copy)]
pub struct VersionFlag {
    pub since: (u32, u32),
    pub component: Component,
    pub flag: &'static str,
    /// Why, for the launcher's log.
    pub reason: &'static str,
}

/// Every per-version flag of the test world. Between 1.34 and 1.38 the
/// components accepted the same flags (checked by the skew suite: every
/// component starts with one argument list); what differs is what a feature
/// gate unlocks.
pub const VERSION_FLAGS: &[VersionFlag] = &[VersionFlag {
    since: (1, 37),
    component: Component::KubeApiserver,
    flag: "--feature-gates=CSIVolumeHealth=true",
    reason: "PersistentVolumeClaim.status.healthStatus (1.37, alpha gate) for the health monitor's status form",
}];

/// The flags of `component` at `version`, with their reasons.
pub fn flags_for(component: Component, version: (u32, u32)) -> Vec<&'static VersionFlag> {
    VERSION_FLAGS.iter().filter(|f| f.component == component && version >= f.since).collect()
}

/// (major, minor) of `v1.34.4`, `Kubernetes v1.38.0-beta.0`, `1.36`.
pub fn parse_minor(text: &str) -> Option<(u32, u32)> {
    let v = text.split_whitespace().last()?.trim_start_matches('v');
    let mut parts = v.split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The version a Kubernetes binary reports (`--version`).
pub fn binary_version(bin: &Path) -> Result<(u32, u32)> {
    let out = Command::new(bin).arg("--version").output().with_context(|| format!("{} --version", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_minor(text.trim()).ok_or_else(|| anyhow!("{} --version printed {text:?}", bin.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_from_what_the_binaries_print() {
        assert_eq!(parse_minor("Kubernetes v1.34.4"), Some((1, 34)));
        assert_eq!(parse_minor("Kubernetes v1.38.0-beta.0"), Some((1, 38)));
        assert_eq!(parse_minor("v1.36.3"), Some((1, 36)));
        assert_eq!(parse_minor("Kubernetes"), None);
        assert_eq!(parse_minor(""), None);
    }

    #[test]
    fn a_row_applies_from_its_version_on() {
        let at = |minor| flags_for(Component::KubeApiserver, (1, minor)).iter().map(|f| f.flag).collect::<Vec<_>>();
        assert!(at(34).is_empty() && at(36).is_empty());
        assert_eq!(at(37), vec!["--feature-gates=CSIVolumeHealth=true"]);
        assert_eq!(at(38), at(37));
    }
}
