//! One shared control plane of each kind per test module: a world's test
//! binary (`tests/<world>/main.rs`) holds several modules, and each keeps
//! the control plane it had as a binary of its own, however the binary runs
//! (one module per process under run-tests.py, or all of them in one
//! `cargo test`).

use std::{
    collections::BTreeMap,
    path::{Component, Path},
    sync::{Mutex, OnceLock, PoisonError},
};

use super::ControlPlane;

/// A control plane started on first use, or why it did not start.
type Slot = OnceLock<Result<ControlPlane, String>>;

/// The control planes of one kind, by test module.
pub(super) struct PerModule(Mutex<BTreeMap<String, &'static Slot>>);

impl PerModule {
    pub(super) const fn new() -> Self {
        Self(Mutex::new(BTreeMap::new()))
    }

    /// The control plane of the test module that `file` (a caller's
    /// `Location::file`) belongs to, started with `start` on its first use.
    /// Callers of one module wait for the same start.
    pub(super) fn get(
        &self,
        file: &str,
        start: impl FnOnce() -> Result<ControlPlane, String>,
    ) -> &'static Result<ControlPlane, String> {
        let slot: &'static Slot = {
            let mut slots = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            slots.entry(test_module(file)).or_insert_with(|| Box::leak(Box::default()))
        };
        slot.get_or_init(start)
    }
}

/// The test module of a source file: `<module>` in `…/tests/<world>/<module>.rs`
/// or `…/tests/<world>/<module>/…`; empty for any other file (the library,
/// the benchmarks and the demo share one).
fn test_module(file: &str) -> String {
    let parts: Vec<&str> = Path::new(file)
        .components()
        .filter_map(|c| match c {
            Component::Normal(part) => part.to_str(),
            _ => None,
        })
        .collect();
    match parts.iter().rposition(|p| *p == "tests") {
        Some(i) if parts.len() > i + 2 => parts[i + 2].trim_end_matches(".rs").to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::test_module;

    #[test]
    fn a_file_belongs_to_the_module_after_its_world() {
        for (file, module) in [
            ("integration/tests/control_plane/provisioner.rs", "provisioner"),
            ("integration/tests/control_plane/rbac/cycle.rs", "rbac"),
            ("/home/u/tests/checkout/integration/tests/snapshots/snapshotter.rs", "snapshotter"),
            ("integration/tests/control_plane/main.rs", "main"),
            ("integration/src/fault_driver/env.rs", ""),
            ("integration/src/bin/demo/real_node.rs", ""),
            ("tests/world.rs", ""),
        ] {
            assert_eq!(test_module(file), module, "{file}");
        }
    }
}
