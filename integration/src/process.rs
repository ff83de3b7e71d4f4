//! Child processes that never outlive the test: killed on drop, logs kept
//! in a file and printed when a test fails.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// A running child process.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Proc {
    /// Starts `program args` with stdout and stderr in `<log_dir>/<name>.log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], log_dir: &Path) -> Proc {
        Self::spawn_env(name, program, args, &[], log_dir)
    }

    /// [`Proc::spawn`] with these environment variables set (`None`: removed).
    pub fn spawn_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, Option<&str>)],
        log_dir: &Path,
    ) -> Proc {
        let mut cmd = Command::new(program);
        for (k, v) in env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        Self::spawn_command(name, cmd.args(args), log_dir)
    }

    /// [`Proc::spawn`] as another user and group, without supplementary
    /// groups (the caller must be root).
    pub fn spawn_as(name: &str, program: &Path, args: &[String], (uid, gid): (u32, u32), log_dir: &Path) -> Proc {
        use std::os::unix::process::CommandExt;
        // With a uid and no explicit groups, std drops the supplementary groups.
        Self::spawn_command(name, Command::new(program).args(args).uid(uid).gid(gid), log_dir)
    }

    fn spawn_command(name: &str, cmd: &mut Command, log_dir: &Path) -> Proc {
        let log = log_dir.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let program = PathBuf::from(cmd.get_program());
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        Proc { name: name.to_string(), child, log, exited: None }
    }

    /// The name it was spawned with (its log file's).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the process wrote so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends a signal.
    pub fn signal(&self, sig: Signal) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), sig);
    }

    /// Whether it has exited; records the status.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// Waits for exit up to `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(s) = self.try_exit() {
                return Some(s);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// SIGTERM, then the exit status (panics with the logs if it does not exit in 10 s).
    pub async fn terminate(&mut self) -> ExitStatus {
        self.signal(Signal::SIGTERM);
        match self.wait_exit(Duration::from_secs(10)).await {
            Some(s) => s,
            None => panic!("{} did not exit within 10s of SIGTERM; logs:\n{}", self.name, self.logs()),
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if self.try_exit().is_none() {
            let _ = self.child.kill();
            self.exited = self.child.wait().ok();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("----- {} logs ({}) -----\n{}", self.name, self.log.display(), self.logs());
        }
    }
}

/// Runs a command to completion with a timeout: (status code, stdout, stderr).
pub fn run_to_end(program: &Path, args: &[&str], timeout: Duration) -> (Option<i32>, String, String) {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
    let start = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            panic!("{} {args:?} did not finish within {timeout:?}", program.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`; a trailing colon
/// is optional), 0 if unreadable.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let field = field.trim_end_matches(':');
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let value = l.strip_prefix(field)?.strip_prefix(':')?;
                value.trim().trim_end_matches(" kB").trim().parse().ok()
            })
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod status_tests {
    use super::status_kib;

    /// A field is read with or without its colon (bench-isolation asked for
    /// `VmHWM` and read 0), and a name is never a prefix of another's.
    #[test]
    fn a_status_field_is_read_with_or_without_its_colon() {
        let me = std::process::id();
        let hwm = status_kib(me, "VmHWM:");
        assert!(hwm > 0, "this process has a peak RSS");
        // A peak only grows between the two reads.
        assert!(status_kib(me, "VmHWM") >= hwm, "read without the colon too");
        assert_eq!(status_kib(me, "VmHW"), 0, "no field is named VmHW");
    }
}
