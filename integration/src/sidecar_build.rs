//! The csi-sidecar binary the tests run is the one the sources describe: a
//! test started after a change in `src/` (the fast loop `cargo test -p
//! csi-sidecar-integration --test <name>`, which does not build the root
//! package's binary) rebuilds it first, so a stale binary is never tested.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::SystemTime,
};

/// What the binary is built from, relative to the workspace root.
const INPUTS: &[&str] = &["src", "proto", "build.rs", "Cargo.toml", "Cargo.lock", "third_party"];

/// Why the binary could not be made fresh.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("cannot run cargo to rebuild {bin}: {cause}")]
    Spawn { bin: PathBuf, cause: std::io::Error },
    #[error("cargo could not rebuild {bin} ({status}):\n{stderr}")]
    Failed { bin: PathBuf, status: std::process::ExitStatus, stderr: String },
}

/// The newest modification time of the files under `paths` (pure over the
/// file system's answers; unreadable entries are skipped).
pub fn newest_input(root: &Path, paths: &[&str]) -> Option<(SystemTime, PathBuf)> {
    fn walk(p: &Path, newest: &mut Option<(SystemTime, PathBuf)>) {
        let Ok(meta) = std::fs::metadata(p) else { return };
        if meta.is_dir() {
            for entry in std::fs::read_dir(p).into_iter().flatten().flatten() {
                walk(&entry.path(), newest);
            }
        } else if let Ok(t) = meta.modified()
            && newest.as_ref().is_none_or(|(n, _)| t > *n)
        {
            *newest = Some((t, p.to_path_buf()));
        }
    }
    let mut newest = None;
    for p in paths {
        walk(&root.join(p), &mut newest);
    }
    newest
}

/// Whether `bin` is missing or older than the newest input.
pub fn is_stale(bin: &Path, newest: Option<SystemTime>) -> bool {
    match (std::fs::metadata(bin).and_then(|m| m.modified()), newest) {
        (Err(_), _) => true,
        (Ok(built), Some(input)) => input > built,
        (Ok(_), None) => false,
    }
}

/// Rebuilds `bin` (in `target_dir`, `release` or not) when it is stale,
/// with the workspace's feature resolution (`--workspace`), as `test.sh`'s
/// `cargo build --workspace --bins` builds it.
pub fn ensure_fresh(root: &Path, target_dir: &Path, release: bool, bin: &Path) -> Result<(), BuildError> {
    if !is_stale(bin, newest_input(root, INPUTS).map(|(t, _)| t)) {
        return Ok(());
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root).args(["build", "--workspace", "--bin", "csi-sidecar", "--target-dir"]).arg(target_dir);
    if release {
        cmd.arg("--release");
    }
    let out = cmd.output().map_err(|cause| BuildError::Spawn { bin: bin.to_path_buf(), cause })?;
    if !out.status.success() {
        return Err(BuildError::Failed {
            bin: bin.to_path_buf(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_older_than_any_input_is_stale() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("csi-sidecar");
        assert!(is_stale(&bin, None), "a missing binary is stale");
        std::fs::write(&bin, b"x").expect("write");
        let built = std::fs::metadata(&bin).and_then(|m| m.modified()).expect("mtime");
        assert!(!is_stale(&bin, Some(built - std::time::Duration::from_secs(1))));
        assert!(is_stale(&bin, Some(built + std::time::Duration::from_secs(1))));
        std::fs::create_dir_all(dir.path().join("src/a")).expect("mkdir");
        std::fs::write(dir.path().join("src/a/b.rs"), b"fn main() {}").expect("write");
        let (_, newest) = newest_input(dir.path(), &["src", "missing"]).expect("a file");
        assert!(newest.ends_with("src/a/b.rs"), "{newest:?}");
    }
}
