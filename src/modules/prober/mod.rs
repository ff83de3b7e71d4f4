//! prober: livenessprobe parity.
pub mod config;
