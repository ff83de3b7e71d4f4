//! Generated wire types: the CSI spec (`csi.v1`) and kubelet plugin
//! registration (`pluginregistration`), compiled from `proto/` by `build.rs`.

#![allow(clippy::all, missing_docs)]

/// CSI spec v1.12.0.
pub mod csi {
    /// Package `csi.v1`.
    pub mod v1 {
        tonic::include_proto!("csi.v1");

        use crate::csi::redact::{Redact, strip_secret_map};
        include!(concat!(env!("OUT_DIR"), "/csi_secret_fields.rs"));
    }
}

/// Kubelet plugin registration API v1.
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}
