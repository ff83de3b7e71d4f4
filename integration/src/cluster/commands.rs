//! The launcher's stdin commands (`restart kube-apiserver`) and their JSON
//! answers.

#[allow(unused_imports)]
use super::*;

/// A command of the launcher's stdin protocol (one per line, after the
/// cluster is ready; each is answered by one [`CommandReply`] JSON line on
/// stdout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LauncherCommand {
    /// `restart kube-apiserver`: stop kube-apiserver and start it again with the
    /// same flags (same port, same etcd), answering once `/readyz` is ok.
    RestartApiserver,
}

impl LauncherCommand {
    /// The line that requests this command.
    pub fn line(self) -> &'static str {
        match self {
            LauncherCommand::RestartApiserver => "restart kube-apiserver",
        }
    }

    /// Parses one stdin line.
    pub fn parse(line: &str) -> Result<LauncherCommand, String> {
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["restart", "kube-apiserver"] => Ok(LauncherCommand::RestartApiserver),
            ["restart", other] => Err(format!("cannot restart {other:?} (only kube-apiserver)")),
            _ => Err(format!("unknown command {line:?} (known: \"restart kube-apiserver\")")),
        }
    }
}

/// A component restarted by the launcher.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Restarted {
    /// The component's name.
    pub component: String,
    /// Its new process ID.
    pub pid: u32,
    /// Milliseconds from the stop request until it was ready again.
    pub ms: u64,
}

/// The launcher's answer to a [`LauncherCommand`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CommandReply {
    /// The component was restarted and is ready.
    Restarted(Restarted),
    /// The command failed (or was not understood).
    Error(String),
}

pub(super) async fn run_command(
    line: &str,
    running: &mut Running,
    info: &mut ClusterInfo,
    opts: &ServeOptions,
    log: &Log,
) -> CommandReply {
    log.info(&format!("command: {line}"));
    let result = match LauncherCommand::parse(line) {
        Ok(LauncherCommand::RestartApiserver) => restart_apiserver(running, info, opts, log).await,
        Err(e) => Err(anyhow!(e)),
    };
    match result {
        Ok(r) => {
            log.info(&format!("{} restarted (pid {}) and ready in {} ms", r.component, r.pid, r.ms));
            CommandReply::Restarted(r)
        }
        Err(e) => {
            log.error(&format!("command {line:?} failed: {e:#}"));
            CommandReply::Error(format!("{e:#}"))
        }
    }
}

/// Restarts kube-apiserver in place and waits for `/readyz`; records the new
/// PID in `info` and in the info files.
pub(super) async fn restart_apiserver(
    running: &mut Running,
    info: &mut ClusterInfo,
    opts: &ServeOptions,
    log: &Log,
) -> Result<Restarted> {
    let t0 = Instant::now();
    let comp = running
        .comps
        .iter_mut()
        .find(|c| c.name == "kube-apiserver")
        .ok_or_else(|| anyhow!("kube-apiserver is not running"))?;
    comp.respawn(opts.grace, log).await?;
    let admin = client_from_kubeconfig(&info.kubeconfig).await?;
    wait_ready(comp, "/readyz after a restart", Duration::from_secs(90), async || {
        Ok(get_text(&admin, "/readyz").await? == "ok")
    })
    .await?;
    info.pids.kube_apiserver = comp.pid();
    let line = serde_json::to_string(&*info).unwrap_or_default();
    for f in std::iter::once(info.run_dir.join(INFO_FILE)).chain(opts.info_file.clone()) {
        write_file(&f, &format!("{line}\n"), false)?;
    }
    Ok(Restarted { component: comp.name.to_string(), pid: comp.pid(), ms: t0.elapsed().as_millis() as u64 })
}
