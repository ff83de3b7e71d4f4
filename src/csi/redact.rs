//! Secret redaction for CSI requests, the counterpart of Go's protosanitizer.
//!
//! The set of secret fields is not written by hand: `build.rs` walks the CSI
//! descriptor for fields marked `csi_secret` and implements [`Redact`] for
//! every message that has one.

use std::collections::HashMap;

/// The value logged in place of a secret map.
pub const STRIPPED: &str = "***stripped***";

/// A CSI message that may carry secrets.
pub trait Redact {
    /// Replaces every secret field with [`STRIPPED`].
    fn redact_secrets(&mut self);
}

/// Replaces a non-empty secrets map by a single `***stripped***` marker, so a
/// log shows that secrets were present without keys or values.
pub fn strip_secret_map(secrets: &mut HashMap<String, String>) {
    if !secrets.is_empty() {
        secrets.clear();
        secrets.insert(STRIPPED.to_string(), STRIPPED.to_string());
    }
}

/// A `Debug` rendering of `msg` with its secrets stripped.
pub fn redacted_debug<T: Redact + Clone + std::fmt::Debug>(msg: &T) -> String {
    let mut copy = msg.clone();
    copy.redact_secrets();
    format!("{copy:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::proto::csi::v1::{self as csi, SECRET_FIELDS};

    #[test]
    fn spec_marks_every_secrets_field() {
        // CSI v1.13.0 marks (at least) these request fields as secret.
        assert!(SECRET_FIELDS.len() >= 19, "{SECRET_FIELDS:?}");
        assert!(SECRET_FIELDS.iter().all(|(_, f)| *f == "secrets"));
        for m in [
            "csi.v1.CreateVolumeRequest",
            "csi.v1.DeleteVolumeRequest",
            "csi.v1.ControllerPublishVolumeRequest",
            "csi.v1.NodeStageVolumeRequest",
        ] {
            assert!(SECRET_FIELDS.iter().any(|(msg, _)| *msg == m), "{m} missing");
        }
    }

    #[test]
    fn create_volume_secrets_never_reach_the_log_text() {
        let req = csi::CreateVolumeRequest {
            name: "pvc-1".into(),
            secrets: [("password".to_string(), "hunter2".to_string())].into(),
            parameters: [("type".to_string(), "fast".to_string())].into(),
            ..Default::default()
        };
        let text = redacted_debug(&req);
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("password"), "{text}");
        assert!(text.contains(STRIPPED), "{text}");
        assert!(text.contains("fast"), "{text}");
        // The original is untouched.
        assert_eq!(req.secrets["password"], "hunter2");
    }

    #[test]
    fn empty_secrets_stay_empty() {
        let req = csi::DeleteVolumeRequest { volume_id: "v".into(), ..Default::default() };
        assert!(!redacted_debug(&req).contains(STRIPPED));
    }

    #[test]
    fn publish_contexts_never_reach_the_log_text() {
        let resp = csi::ControllerPublishVolumeResponse {
            publish_context: [("chap-secret".to_string(), "hunter2".to_string())].into(),
        };
        let text = redacted_debug(&resp);
        assert!(!text.contains("hunter2") && !text.contains("chap-secret") && text.contains(STRIPPED), "{text}");
        let req = csi::NodeStageVolumeRequest {
            publish_context: [("token".to_string(), "hunter2".to_string())].into(),
            ..Default::default()
        };
        assert!(!redacted_debug(&req).contains("hunter2"));
        // Not a csi_secret of the spec: the secret table stays the spec's.
        assert!(SECRET_FIELDS.iter().all(|(_, f)| *f != "publish_context"));
    }

    #[test]
    fn responses_are_cut_to_the_max_log_length() {
        use crate::csi::connection::truncated;
        assert_eq!(truncated("abcdef".into(), -1), "abcdef");
        assert_eq!(truncated("abcdef".into(), 6), "abcdef");
        assert_eq!(truncated("abcdef".into(), 2), "ab [response truncated, 4 more characters]");
        assert_eq!(truncated("ééé".into(), 1), "é [response truncated, 2 more characters]");
        assert_eq!(truncated("abc".into(), 0), " [response truncated, 3 more characters]");
    }
}
