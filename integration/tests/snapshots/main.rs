//! The snapshots world: the control plane with the snapshot CRDs and the real
//! snapshot-controller (`ControlPlane::with_snapshots`), and the snapshotter.
//!
//! One binary per world; integration/scripts/run-tests.py runs each module in
//! a process of its own (`<binary> --exact <its tests>`).

mod group_snapshots;
mod snapshot_metadata;
mod snapshot_metadata_watches;
mod snapshotter;
mod snapshotter_faults;
