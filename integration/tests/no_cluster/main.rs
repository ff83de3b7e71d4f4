//! The world without a cluster: the binary under its upstream names, the
//! manifests and the chart rendered and checked, the registrar and the prober
//! against a driver, the monitoring rules, the migration corpus.
//!
//! One binary per world; integration/scripts/run-tests.py runs each module in
//! a process of its own (`<binary> --exact <its tests>`).

mod cli;
mod csi_streams;
mod manifests;
mod migration_corpus;
mod monitoring;
mod prober;
mod registrar;
