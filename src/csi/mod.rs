//! Everything that speaks gRPC to the CSI driver.
pub mod proto;
pub mod redact;
