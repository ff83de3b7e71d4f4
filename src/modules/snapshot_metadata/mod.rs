//! snapshot-metadata (external-snapshot-metadata, Changed Block Tracking):
//! in progress (issue 39). Not in the module table yet; what is here is
//! tested piece by piece: a request's checks (`decide`), the server's TLS
//! (`tls`) and health service (`health`), and the driver's stream passed
//! on (`forward`).

pub mod api;
pub mod config;
pub mod decide;
pub mod forward;
pub mod health;
pub mod tls;
