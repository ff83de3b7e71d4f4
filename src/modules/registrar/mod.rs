//! registrar: node-driver-registrar parity.
pub mod config;
