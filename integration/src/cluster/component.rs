//! The launcher's component processes: spawned in their own process group,
//! waited for until ready, stopped (SIGTERM, then SIGKILL) or restarted; the
//! running set, stopped in reverse start order; the launcher's log.

#[allow(unused_imports)]
use super::*;

/// The launcher's log: `<log_dir>/cluster.log`, and stderr unless quiet.
pub(super) struct Log {
    pub(crate) file: Mutex<Option<std::fs::File>>,
    pub(crate) quiet: bool,
}

impl Log {
    pub(crate) fn line(&self, important: bool, msg: &str) {
        if important || !self.quiet {
            // Not eprintln!: a closed stderr (a reader that went away) must not
            // panic the launcher in the middle of a teardown.
            let _ = writeln!(std::io::stderr(), "cluster: {msg}");
        }
        if let Ok(mut guard) = self.file.lock()
            && let Some(f) = guard.as_mut()
        {
            let _ = writeln!(f, "{} {msg}", unix_millis());
        }
    }
    pub(crate) fn info(&self, msg: &str) {
        self.line(false, msg)
    }
    pub(crate) fn error(&self, msg: &str) {
        self.line(true, msg)
    }
}

pub(super) fn unix_millis() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

/// One component process, in its own process group (a terminal's Ctrl-C reaches
/// only the launcher, which then stops the components in order).
pub(super) struct Component {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
    pub(crate) status: Option<ExitStatus>,
    /// What it was started with, for [`Component::respawn`].
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
}

impl Component {
    pub(crate) fn spawn(name: &'static str, program: &Path, args: &[String], log_dir: &Path) -> Result<Component> {
        let log = log_dir.join(format!("{name}.log"));
        let child = Self::start_process(program, args, &log)?;
        Ok(Component { name, child, log, status: None, program: program.to_path_buf(), args: args.to_vec() })
    }

    pub(crate) fn start_process(program: &Path, args: &[String], log: &Path) -> Result<Child> {
        use std::os::unix::process::CommandExt;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open {}", log.display()))?;
        let err = out.try_clone()?;
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .process_group(0)
            .spawn()
            .with_context(|| format!("spawn {}", program.display()))
    }

    /// Stops the process (SIGTERM, SIGKILL after `grace`) and starts it again
    /// with the same program and arguments, appending to the same log.
    pub(crate) async fn respawn(&mut self, grace: Duration, log: &Log) -> Result<()> {
        if self.exited().is_none() {
            self.stop(grace, log).await;
        }
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&self.log) {
            let _ = writeln!(f, "----- restarted by the launcher at {} -----", unix_millis());
        }
        self.child = Self::start_process(&self.program, &self.args, &self.log)?;
        self.status = None;
        Ok(())
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL. Returns whether it stopped cleanly
    /// (exited on SIGTERM, or had already exited with success).
    pub(crate) async fn stop(&mut self, grace: Duration, log: &Log) -> bool {
        if let Some(status) = self.exited() {
            log.error(&format!("{} had already exited: {status}", self.name));
            return false;
        }
        let start = Instant::now();
        let _ = kill(Pid::from_raw(self.pid() as i32), Signal::SIGTERM);
        while start.elapsed() < grace {
            if let Some(status) = self.exited() {
                log.info(&format!("{} stopped in {} ms ({status})", self.name, start.elapsed().as_millis()));
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        log.error(&format!("{} did not exit within {grace:?} of SIGTERM; SIGKILL", self.name));
        let _ = self.child.kill();
        self.status = self.child.wait().ok();
        false
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Picks `N` distinct free loopback ports for the components ([`crate::ports`]:
/// no other test process picks them meanwhile).
pub(super) fn free_ports<const N: usize>() -> Result<[u16; N]> {
    crate::ports::free_ports::<N>().context("pick free loopback ports")
}

pub(super) async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(10));
    Ok(kube::Client::try_from(config)?)
}

pub(crate) async fn get_text(client: &kube::Client, path: &str) -> Result<String> {
    let req = http::Request::get(path).body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

/// Polls `probe` every 50 ms until it returns `Ok(true)`; fails early when the
/// component exits, and after `timeout` with the last error.
pub(super) async fn wait_ready(
    comp: &mut Component,
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let last = match probe().await {
            Ok(true) => return Ok(()),
            Ok(false) => "not ready".to_string(),
            Err(e) => format!("{e:#}"),
        };
        if let Some(status) = comp.exited() {
            bail!(
                "{} exited ({status}) before {what}; last lines of {}:\n{}",
                comp.name,
                comp.log.display(),
                comp.log_tail(30)
            );
        }
        if start.elapsed() > timeout {
            bail!(
                "{} not ready ({what}) within {timeout:?}: {last}; last lines of {}:\n{}",
                comp.name,
                comp.log.display(),
                comp.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The running components, stopped in reverse start order, and what a real
/// node left on the host, removed after them.
#[derive(Default)]
pub(super) struct Running {
    pub(crate) comps: Vec<Component>,
    pub(crate) footprints: Vec<super::real_node::Footprint>,
    /// Locks held while a real node is on the host (one at a time per host:
    /// nodes share /run/containerd), released after its footprint is gone.
    pub(crate) host_locks: Vec<std::fs::File>,
}

impl Running {
    /// Stops the components in the reverse order of their start (nodes and
    /// controllers, KCM, the apiserver, etcd). Returns whether all stopped
    /// cleanly.
    pub(crate) async fn stop(&mut self, grace: Duration, log: &Log) -> bool {
        let mut clean = true;
        while let Some(mut c) = self.comps.pop() {
            clean &= c.stop(grace, log).await;
        }
        for footprint in self.footprints.drain(..) {
            let left = tokio::task::spawn_blocking(move || footprint.clean()).await.unwrap_or_default();
            for l in &left {
                log.error(&format!("the real node left {l}"));
            }
            clean &= left.is_empty();
        }
        self.host_locks.clear();
        clean
    }

    /// The first component that has exited, if any.
    pub(crate) fn first_exited(&mut self) -> Option<(&'static str, ExitStatus)> {
        self.comps.iter_mut().find_map(|c| c.exited().map(|s| (c.name, s)))
    }
}
