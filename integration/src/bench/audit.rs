//! The apiserver's audit log as a request count per client program: the
//! APF FlowSchema of [`super::SIDECAR_USER`] counts that user's requests as
//! one number; the audit log also carries each request's `User-Agent`, which
//! names the module that sent it (`csi-provisioner/<version> ...`, also when
//! several modules share one process and client).
//!
//! [`AuditLog::for_user`] writes a policy that logs only the user's requests,
//! once each (stage `ResponseComplete`, metadata only); the launcher passes
//! it to kube-apiserver (`launcher_args`); [`AuditLog::mark`] and
//! [`AuditLog::count_since`] count what completed in between.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

/// An audit policy and the log kube-apiserver writes with it.
pub struct AuditLog {
    /// The log file (JSON lines), written by the apiserver.
    pub path: PathBuf,
    /// `--apiserver-arg` pairs for [`crate::cluster::ControlPlane::spawn_launcher`].
    pub launcher_args: Vec<String>,
}

impl AuditLog {
    /// Writes a policy logging `user`'s requests (metadata, one line per
    /// completed request; a watch when it ends) into `dir`; the log goes to
    /// `dir/audit.log`.
    pub fn for_user(dir: &Path, user: &str) -> Result<AuditLog> {
        let policy = dir.join("audit-policy.yaml");
        let text = format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\nrules:\n\
             - level: Metadata\n  users: [{user:?}]\n- level: None\n"
        );
        std::fs::write(&policy, text).with_context(|| format!("write {}", policy.display()))?;
        let path = dir.join("audit.log");
        let launcher_args = vec![
            "--apiserver-arg".into(),
            format!("--audit-policy-file={}", policy.display()),
            "--apiserver-arg".into(),
            format!("--audit-log-path={}", path.display()),
        ];
        Ok(AuditLog { path, launcher_args })
    }

    /// The log's current length: the start of a [`AuditLog::count_since`].
    pub fn mark(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// The requests completed since `mark`, by `classify(user agent)`.
    pub fn count_since(&self, mark: u64, classify: impl Fn(&str) -> String) -> Result<BTreeMap<String, f64>> {
        let bytes = std::fs::read(&self.path).with_context(|| format!("read {}", self.path.display()))?;
        let from = usize::try_from(mark).unwrap_or(usize::MAX).min(bytes.len());
        Ok(count_lines(&String::from_utf8_lossy(&bytes[from..]), classify))
    }
}

/// Counts the audit events (JSON lines) of stage `ResponseComplete` by
/// `classify(userAgent)`; other lines are skipped.
pub fn count_lines(text: &str, classify: impl Fn(&str) -> String) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if event["stage"].as_str() != Some("ResponseComplete") {
            continue;
        }
        *out.entry(classify(event["userAgent"].as_str().unwrap_or(""))).or_insert(0.0) += 1.0;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_completed_requests_by_user_agent() {
        let text = r#"{"stage":"ResponseComplete","verb":"create","userAgent":"csi-provisioner/0.1 (linux/amd64) csi-sidecar"}
{"stage":"ResponseComplete","verb":"patch","userAgent":"csi-resizer/0.1 (linux/amd64) csi-sidecar"}
{"stage":"Panic","verb":"patch","userAgent":"csi-resizer/0.1 (linux/amd64) csi-sidecar"}
{"stage":"ResponseComplete","verb":"update","userAgent":"csi-provisioner/0.1 (linux/amd64) csi-sidecar"}
{"stage":"ResponseCom"#;
        let by = count_lines(text, |ua| ua.split('/').next().unwrap_or("").to_string());
        assert_eq!(by, [("csi-provisioner".to_string(), 2.0), ("csi-resizer".to_string(), 1.0)].into());
    }
}
