//! Generated wire types: the CSI spec (`csi.v1`), the project's decoding of
//! the volume condition v1.13 removed (`csi.v112`) and kubelet plugin
//! registration (`pluginregistration`), compiled from `proto/` by `build.rs`.

#![allow(clippy::all, missing_docs)]

/// CSI spec v1.13.0.
pub mod csi {
    /// Package `csi.v1`.
    pub mod v1 {
        tonic::include_proto!("csi.v1");

        use crate::csi::redact::{Redact, strip_secret_map};
        include!(concat!(env!("OUT_DIR"), "/csi_secret_fields.rs"));
    }

    /// Package `csi.v112`: `ListVolumes` and `ControllerGetVolume` answers
    /// with the v1.12 `volume_condition` (field 2 of their `VolumeStatus`).
    pub mod v112 {
        tonic::include_proto!("csi.v112");

        // No secrets in these answers (build.rs would emit `strip_secret_map` calls).
        use crate::csi::redact::Redact;
        include!(concat!(env!("OUT_DIR"), "/csi_v112_secret_fields.rs"));
    }
}

/// Kubelet plugin registration API v1.
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}
