//! Everything that speaks gRPC to the CSI driver (invariant: nothing else
//! does). Modules use [`Connection`]'s typed, metered, redacting calls.
pub mod address;
pub mod calls;
pub mod connection;
pub mod dial_error;
pub mod driver;
pub mod health;
pub mod proto;
pub mod redact;

pub use connection::Connection;
pub use driver::{DriverInfo, HealthCapabilities};
pub use health::{HealthCondition, HealthStatus, LegacyCondition, VolumeHealth};
