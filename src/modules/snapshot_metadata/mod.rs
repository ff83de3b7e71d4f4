//! snapshot-metadata (external-snapshot-metadata, Changed Block Tracking):
//! in progress (issue 39). Not in the module table yet; what is here is
//! the pure part of serving a request, table-tested.

pub mod api;
pub mod config;
pub mod decide;
pub mod health;
pub mod tls;
