//! provisioner: external-provisioner parity.
pub mod decide;
pub mod params;
