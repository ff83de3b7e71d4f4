//! csi-sidecar: one executable that replaces the Kubernetes CSI sidecars.
//!
//! See ARCHITECTURE.md for the map of modules and the invariants.

pub mod chart;
pub mod cli;
pub mod compat;
pub mod csi;
pub mod debug;
pub mod explain;
pub mod flags;
pub mod healthz;
pub mod host;
pub mod http;
pub mod k8s;
pub mod logging;
pub mod metrics;
pub mod migration;
pub mod modules;
pub mod supervise;
#[cfg(test)]
mod tidy;
