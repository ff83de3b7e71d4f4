//! What a real node leaves on the host, and its removal. containerd and the
//! kubelet create things outside any directory they are given: cgroups in
//! every hierarchy, mounts (the kubelet's root made rshared, projected
//! volumes, container root filesystems, network namespaces), shim processes
//! that outlive containerd, `/run/containerd/s`, `/var/lib/cni`, symlinks in
//! `/var/log/containers`, and the kernel tunables the kubelet sets. The
//! footprint records the host before the node starts and removes exactly
//! what appeared; [`Footprint::leftovers`] says what is still there.

use std::{
    collections::BTreeSet,
    ffi::OsString,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::{
    mount::{MntFlags, umount2},
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde::{Deserialize, Serialize};

/// Host paths containerd, runc, the CNI plugins or the kubelet create
/// whatever their configuration says.
const FIXED_HOST_DIRS: [&str; 3] = ["/run/containerd", "/var/lib/cni", "/var/log/containers"];

/// The kernel tunables the kubelet's container manager sets at start.
const KUBELET_SYSCTLS: [&str; 6] = [
    "/proc/sys/vm/overcommit_memory",
    "/proc/sys/vm/panic_on_oom",
    "/proc/sys/kernel/panic",
    "/proc/sys/kernel/panic_on_oops",
    "/proc/sys/kernel/keys/root_maxkeys",
    "/proc/sys/kernel/keys/root_maxbytes",
];

/// The host before a real node started, and what the node owns.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Footprint {
    /// The node's directory: removed whole.
    pub node_dir: PathBuf,
    /// containerd's socket: its shims carry it on their command line.
    pub containerd_socket: PathBuf,
    /// The node's cgroup root in every hierarchy (created for the kubelet).
    pub cgroup_dirs: Vec<PathBuf>,
    /// Of [`FIXED_HOST_DIRS`]: those that did not exist before (removed
    /// whole) and, for those that did, the entries they had.
    pub fixed_dirs_absent_before: Vec<PathBuf>,
    /// Entries of the fixed directories that existed before.
    pub fixed_entries_before: Vec<(PathBuf, Vec<OsString>)>,
    /// Kernel tunables and their values before.
    pub sysctls_before: Vec<(PathBuf, String)>,
    /// Where the containers' logs are copied before the node's directory
    /// goes (`<run dir>/logs/pods`, kept with a failed run).
    pub save_pod_logs_to: PathBuf,
}

impl Footprint {
    /// Records the host as it is before the node starts; `cgroup_root` is
    /// the kubelet's `cgroupRoot` (`/name`).
    pub fn record(node_dir: &Path, containerd_socket: &Path, cgroup_root: &str, save_pod_logs_to: &Path) -> Footprint {
        let mut fixed_dirs_absent_before = Vec::new();
        let mut fixed_entries_before = Vec::new();
        for dir in FIXED_HOST_DIRS.map(PathBuf::from) {
            match entries(&dir) {
                Some(e) => fixed_entries_before.push((dir, e.into_iter().collect())),
                None => fixed_dirs_absent_before.push(dir),
            }
        }
        let name = cgroup_root.trim_start_matches('/');
        Footprint {
            node_dir: node_dir.to_path_buf(),
            containerd_socket: containerd_socket.to_path_buf(),
            cgroup_dirs: cgroup_mounts().into_iter().map(|m| m.join(name)).collect(),
            fixed_dirs_absent_before,
            fixed_entries_before,
            sysctls_before: KUBELET_SYSCTLS
                .iter()
                .filter_map(|p| Some((PathBuf::from(p), std::fs::read_to_string(p).ok()?.trim().to_string())))
                .collect(),
            save_pod_logs_to: save_pod_logs_to.to_path_buf(),
        }
    }

    /// Creates the node's cgroup root in every hierarchy (the kubelet
    /// requires it to exist).
    pub fn create_cgroups(&self) -> std::io::Result<()> {
        for d in &self.cgroup_dirs {
            std::fs::create_dir_all(d)?;
        }
        Ok(())
    }

    /// Removes what the node left, after its kubelet and containerd were
    /// stopped: container processes (by cgroup) and shims (by socket), then
    /// mounts under the node's directory, the cgroups, the directory, what
    /// appeared in the fixed host directories, and the tunables' values.
    /// Returns what could not be removed.
    pub fn clean(&self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pids: BTreeSet<i32> = self.cgroup_pids().into_iter().chain(self.shim_pids()).collect();
            if pids.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for _ in 0..10 {
            let mounts = self.mounts();
            if mounts.is_empty() {
                break;
            }
            for m in mounts {
                let _ = umount2(&m, MntFlags::MNT_DETACH);
            }
        }
        for dir in &self.cgroup_dirs {
            remove_cgroup_tree(dir, deadline);
        }
        copy_logs(&self.node_dir.join("pod-logs"), &self.save_pod_logs_to);
        let _ = std::fs::remove_dir_all(&self.node_dir);
        for dir in &self.fixed_dirs_absent_before {
            let _ = std::fs::remove_dir_all(dir);
        }
        for (dir, before) in &self.fixed_entries_before {
            for entry in entries(dir).unwrap_or_default() {
                if !before.contains(&entry) {
                    let p = dir.join(&entry);
                    let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
                }
            }
        }
        for (path, value) in &self.sysctls_before {
            if std::fs::read_to_string(path).is_ok_and(|now| now.trim() != value) {
                let _ = std::fs::write(path, value);
            }
        }
        self.leftovers()
    }

    /// What of the node is still on the host: processes, mounts, cgroups,
    /// directories, entries, changed tunables. Empty after a clean teardown.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for pid in self.cgroup_pids() {
            left.push(format!("process {pid} in the node's cgroups"));
        }
        for pid in self.shim_pids() {
            left.push(format!("containerd shim {pid} of {}", self.containerd_socket.display()));
        }
        for m in self.mounts() {
            left.push(format!("mount {}", m.display()));
        }
        for d in self.cgroup_dirs.iter().filter(|d| d.exists()) {
            left.push(format!("cgroup {}", d.display()));
        }
        if self.node_dir.exists() {
            left.push(format!("directory {}", self.node_dir.display()));
        }
        for d in self.fixed_dirs_absent_before.iter().filter(|d| d.exists()) {
            left.push(format!("directory {} (absent before)", d.display()));
        }
        for (dir, before) in &self.fixed_entries_before {
            for e in entries(dir).unwrap_or_default().into_iter().filter(|e| !before.contains(e)) {
                left.push(format!("{}", dir.join(e).display()));
            }
        }
        for (path, value) in &self.sysctls_before {
            if let Ok(now) = std::fs::read_to_string(path)
                && now.trim() != value
            {
                left.push(format!("{} is {} (was {value})", path.display(), now.trim()));
            }
        }
        left
    }

    /// Every process in the node's cgroups (any hierarchy, any depth).
    fn cgroup_pids(&self) -> BTreeSet<i32> {
        let mut pids = BTreeSet::new();
        for dir in &self.cgroup_dirs {
            walk_dirs(dir, &mut |d| {
                if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
                    pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
                }
            });
        }
        pids
    }

    /// containerd shims serving this node's containerd (`-address <socket>`).
    fn shim_pids(&self) -> Vec<i32> {
        let socket = self.containerd_socket.display().to_string();
        let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
        procs
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
                args.first().is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"))
                    && args.contains(&socket.as_bytes())
            })
            .collect()
    }

    /// Mount points under the node's directory, deepest first.
    fn mounts(&self) -> Vec<PathBuf> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut found: Vec<PathBuf> = text
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(unescape_mount_path)
            .filter(|p| p.starts_with(&self.node_dir))
            .collect();
        found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        found.dedup();
        found
    }
}

/// The mount points of every cgroup hierarchy (v1 and the unified one).
fn cgroup_mounts() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter(|l| l.split(" - ").nth(1).is_some_and(|fs| fs.starts_with("cgroup ") || fs.starts_with("cgroup2 ")))
        .filter_map(|l| l.split(' ').nth(4).map(unescape_mount_path))
        .collect()
}

/// `/proc/self/mountinfo` escapes space, tab, newline and backslash as octal.
fn unescape_mount_path(s: &str) -> PathBuf {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(b) => {
                out.push(b as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    PathBuf::from(out)
}

fn entries(dir: &Path) -> Option<Vec<OsString>> {
    let rd = std::fs::read_dir(dir).ok()?;
    Some(rd.filter_map(|e| e.ok().map(|e| e.file_name())).collect())
}

/// Copies the `*.log` files below `from` to the same relative paths below
/// `to` (the kubelet's symlinks are not followed).
fn copy_logs(from: &Path, to: &Path) {
    walk_dirs(from, &mut |d| {
        for f in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = f.path();
            if f.file_type().is_ok_and(|t| t.is_file())
                && p.extension().is_some_and(|x| x == "log")
                && let Ok(rel) = p.strip_prefix(from)
            {
                let dest = to.join(rel);
                if let Some(parent) = dest.parent() {
                    let _ = std::fs::create_dir_all(parent);
                }
                let _ = std::fs::copy(&p, dest);
            }
        }
    });
}

/// Calls `f` on `dir` and every directory below it.
fn walk_dirs(dir: &Path, f: &mut dyn FnMut(&Path)) {
    if !dir.is_dir() {
        return;
    }
    f(dir);
    for sub in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if sub.file_type().is_ok_and(|t| t.is_dir()) {
            walk_dirs(&sub.path(), f);
        }
    }
}

/// Removes a cgroup and its children, children first (a cgroup directory
/// goes with `rmdir` once no process is left in it).
fn remove_cgroup_tree(dir: &Path, deadline: Instant) {
    let mut all = Vec::new();
    walk_dirs(dir, &mut |d| all.push(d.to_path_buf()));
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for d in all {
        while std::fs::remove_dir(&d).is_err() && d.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mount_path(r"/a\040b/c"), PathBuf::from("/a b/c"));
        assert_eq!(unescape_mount_path(r"/a\134b"), PathBuf::from(r"/a\b"));
        assert_eq!(unescape_mount_path("/plain"), PathBuf::from("/plain"));
        assert_eq!(unescape_mount_path(r"/odd\x"), PathBuf::from(r"/odd\x"));
    }
}
