//! The provisioner under test: its command line, its start until ready, its
//! stop, and the problems its log shows.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow, bail};
use csi_sidecar_integration::{bench::Qps, cluster::ControlPlane, process::Proc};
use kube::Client;
use nix::sys::signal::Signal;

use super::Args;

pub struct Env {
    pub cp: ControlPlane,
    pub admin: Client,
    pub kcm: Option<Client>,
    pub sidecar_kubeconfig: PathBuf,
    pub csi_sock: PathBuf,
    pub log_dir: PathBuf,
    /// What runs as the provisioner: the program and its first arguments.
    pub command: Command,
    pub args: Args,
}

/// The provisioner's program, the arguments before the bench's flags, and the
/// log text that shows it is ready.
pub struct Command {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub ready_log: String,
    pub label: String,
}

impl Command {
    /// csi-sidecar's provisioner, or `--sidecar-command` split at whitespace.
    pub fn resolve(
        sidecar_command: Option<&str>,
        ready_log: Option<&str>,
        sidecar: impl FnOnce() -> PathBuf,
    ) -> Result<Self> {
        match sidecar_command {
            None => {
                let program = sidecar();
                Ok(Command {
                    label: format!("{} provisioner", program.display()),
                    program,
                    args: vec!["provisioner".into()],
                    ready_log: ready_log.unwrap_or("Caches synced").into(),
                })
            }
            Some(cmd) => {
                let mut words = cmd.split_whitespace().map(String::from);
                let program = words.next().ok_or_else(|| anyhow!("--sidecar-command is empty"))?;
                Ok(Command {
                    label: cmd.trim().to_string(),
                    program: PathBuf::from(program),
                    args: words.collect(),
                    ready_log: ready_log.unwrap_or("Started provisioner controller").into(),
                })
            }
        }
    }
}

pub struct Sidecar {
    proc: Proc,
    log: PathBuf,
    pub synced_after: Duration,
    /// Per kind, when the log said "Watch synced kind=KIND" (since the spawn).
    pub watch_synced: BTreeMap<String, Duration>,
}

/// The kinds of the `Watch synced kind=KIND` lines of a csi-sidecar log.
pub fn watch_synced_kinds(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("Watch synced"))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("kind=")))
        .map(|k| k.trim_matches('"').to_string())
        .collect()
}

impl Env {
    /// The provisioner's arguments: the command's own, the bench's, `extra`, then `--sidecar-arg`s.
    fn provisioner_args(&self, qps: &Qps, extra: &[String]) -> Vec<String> {
        let mut args = self.command.args.clone();
        args.push(format!("--csi-address={}", self.csi_sock.display()));
        args.push(format!("--kubeconfig={}", self.sidecar_kubeconfig.display()));
        args.extend(qps.flags());
        args.extend(extra.iter().cloned());
        args.extend(self.args.sidecar_arg.iter().cloned());
        args
    }

    /// Spawns a provisioner with a fresh log file; returns it and its log's path.
    pub fn spawn_provisioner(&self, name: &str, qps: &Qps, extra: &[String]) -> (Proc, PathBuf) {
        let log = self.log_dir.join(format!("{name}.log"));
        let _ = std::fs::remove_file(&log);
        let proc = Proc::spawn(name, &self.command.program, &self.provisioner_args(qps, extra), &self.log_dir);
        (proc, log)
    }

    /// Starts a provisioner and waits until it logs the ready text.
    pub async fn start_sidecar(&self, name: &str, qps: &Qps) -> Result<Sidecar> {
        let t = Instant::now();
        let (mut proc, log) = self.spawn_provisioner(name, qps, &[]);
        let mut watch_synced = BTreeMap::new();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            for kind in watch_synced_kinds(&text) {
                watch_synced.entry(kind).or_insert_with(|| t.elapsed());
            }
            if text.contains(&self.command.ready_log) {
                break;
            }
            if let Some(status) = proc.try_exit() {
                bail!("provisioner {name} exited ({status}) before it was ready; log:\n{}", proc.logs());
            }
            if t.elapsed() > Duration::from_secs(600) {
                bail!("provisioner {name}: no {:?} within 600 s; log:\n{}", self.command.ready_log, proc.logs());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Sidecar { proc, log, synced_after: t.elapsed(), watch_synced })
    }
}

impl Sidecar {
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// SIGTERM; how it ended.
    pub async fn stop(mut self) -> String {
        let t = Instant::now();
        self.proc.signal(Signal::SIGTERM);
        match self.proc.wait_exit(Duration::from_secs(10)).await {
            Some(s) if s.success() => format!("exited 0 in {} ms after SIGTERM", t.elapsed().as_millis()),
            Some(s) => format!("exited with {s} after SIGTERM"),
            None => {
                self.proc.kill();
                "did not exit within 10 s of SIGTERM (killed)".into()
            }
        }
    }

    /// WARN/ERROR lines (normalised: no timestamp, digit runs as '#') with counts,
    /// and the number of lines mentioning throttling.
    pub fn log_problems(&self) -> (usize, Vec<(String, usize)>) {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut total = 0;
        for line in text.lines() {
            if !(line.contains(" WARN ") || line.contains(" ERROR ") || line.to_lowercase().contains("throttl")) {
                continue;
            }
            total += 1;
            let body = line.split_once(' ').map(|(_, b)| b.trim()).unwrap_or(line);
            let mut norm = normalize(body);
            norm.truncate(300);
            *counts.entry(norm).or_default() += 1;
        }
        let mut v: Vec<_> = counts.into_iter().collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1));
        (total, v)
    }
}

/// Replaces ids by `x` (hex parts of 4+ characters with a digit, or every hex
/// part of a word with 3+ of them, like a UUID) and numbers by `#`, so that
/// repeats of a message group together.
fn normalize(line: &str) -> String {
    let mut out = String::new();
    let mut word = String::new();
    let hex = |p: &str| p.len() >= 4 && p.chars().all(|c| c.is_ascii_hexdigit());
    let flush = |word: &mut String, out: &mut String| {
        let uuid_like = word.split('-').filter(|p| hex(p)).count() >= 3;
        let parts: Vec<&str> = word
            .split('-')
            .map(|p| {
                if hex(p) && (uuid_like || p.chars().any(|c| c.is_ascii_digit())) {
                    "x"
                } else if !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()) {
                    "#"
                } else {
                    p
                }
            })
            .collect();
        out.push_str(&parts.join("-"));
        word.clear();
    };
    for c in line.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_synced_lines_give_their_kinds() {
        let log = "2026-12-01T10:00:00.1Z  INFO Watch synced kind=PersistentVolume objects=10000\n\
                   2026-12-01T10:00:00.2Z  INFO something else kind=Node\n\
                   2026-12-01T10:00:00.3Z  INFO Watch synced kind=\"PersistentVolumeClaim\" objects=0\n";
        assert_eq!(watch_synced_kinds(log), ["PersistentVolume", "PersistentVolumeClaim"]);
    }

    #[test]
    fn a_sidecar_command_is_split_and_gets_the_generic_ready_text() {
        let c = Command::resolve(Some(" /opt/csi-provisioner  --v=5 "), None, || unreachable!()).expect("command");
        assert_eq!(c.program, PathBuf::from("/opt/csi-provisioner"));
        assert_eq!(c.args, ["--v=5"]);
        assert_eq!(c.ready_log, "Started provisioner controller");
        let own = Command::resolve(None, None, || PathBuf::from("/x/csi-sidecar")).expect("command");
        assert_eq!(
            (own.args.as_slice(), own.ready_log.as_str()),
            (["provisioner".to_string()].as_slice(), "Caches synced")
        );
        assert!(Command::resolve(Some("  "), None, || unreachable!()).is_err());
    }

    #[test]
    fn normalizes_ids() {
        assert_eq!(
            normalize("WARN volume{pv=pvc-872b831a-acff-4b94-1234}: failed after 12 tries, added"),
            "WARN volume{pv=pvc-x-x-x-x}: failed after # tries, added"
        );
    }
}
