//! Each module is its own failure domain: the host runs every module under
//! a supervisor that starts a new instance of it, in-process, when one
//! stops before shutdown. The others keep running and keep their Leases.
//!
//! The rule ([`next`], pure, table-tested):
//! - a lost Lease: a new instance at once, which campaigns from standby;
//! - a failure or a panic outside any sync: a new instance after a backoff
//!   of 1 s doubling to 5 min, reset once an instance has run 10 min;
//! - a configuration error: the process exits 1, as upstream's sidecar
//!   would (the flags will not change);
//! - a module that returns by itself has finished: nothing is restarted.
//!
//! A new instance rebuilds its state from the shared cache: its handlers
//! are replayed every cached object, so nothing queued is lost. While a
//! controller module is down, and while it crash-loops (3 failures without
//! 10 min of running in between), `/healthz/<module>` answers 500, and so
//! does `/healthz/leader-election` (the chart's liveness probe), so the
//! kubelet restarts the container when a module cannot recover
//! ([`healthy`]).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::future::BoxFuture;
use parking_lot::Mutex;

use crate::{
    healthz::{HealthCheck, HealthReport},
    modules::{ModuleConfig, ModuleContext, ModuleError},
};

/// The first restart's delay after a failure.
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
/// The longest delay between restarts.
pub const MAX_DELAY: Duration = Duration::from_secs(300);
/// A module that ran this long counts as healthy again: the backoff resets.
pub const HEALTHY_RESET: Duration = Duration::from_secs(600);
/// Consecutive failures (without [`HEALTHY_RESET`] of running between them)
/// from which the module's health check fails while it runs.
pub const CRASH_LOOP: u32 = 3;

/// Instances started again, per module and reason.
pub const METRIC_RESTARTS: &str = "csi_sidecar_module_restarts_total";
const METRIC_RESTARTS_HELP: &str = "Times a module was started again in the process, by why its instance stopped.";

/// How a module instance ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It returned by itself before shutdown.
    Finished,
    /// It lost its Lease.
    LostLease(String),
    /// It failed.
    Failed(String),
    /// It panicked outside any sync.
    Panicked(String),
    /// Its configuration cannot work.
    Config(String),
}

impl Ended {
    /// The `reason` label of [`METRIC_RESTARTS`].
    fn reason(&self) -> &'static str {
        match self {
            Ended::Finished => "finished",
            Ended::LostLease(_) => "lost-lease",
            Ended::Failed(_) => "failed",
            Ended::Panicked(_) => "panicked",
            Ended::Config(_) => "config",
        }
    }

    fn from_result(joined: Result<Result<(), ModuleError>, tokio::task::JoinError>) -> Ended {
        match joined {
            Ok(Ok(())) => Ended::Finished,
            Ok(Err(e @ ModuleError::Config { .. })) => Ended::Config(e.to_string()),
            Ok(Err(e @ ModuleError::LostLease { .. })) => Ended::LostLease(e.to_string()),
            Ok(Err(e @ ModuleError::Fatal { .. })) => Ended::Failed(e.to_string()),
            Err(e) if e.is_panic() => Ended::Panicked(panic_message(e.into_panic())),
            Err(e) => Ended::Failed(e.to_string()),
        }
    }
}

/// What follows an instance's end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// The module is done; nothing to restart.
    Done,
    /// The process exits 1 with this message.
    Exit(String),
    /// A new instance after this delay.
    Restart(Duration),
}

/// What follows `ended`, after an instance that ran for `ran_for`;
/// `failures` counts the module's consecutive failures and is updated.
pub fn next(ended: &Ended, ran_for: Duration, failures: &mut u32) -> Next {
    if ran_for >= HEALTHY_RESET {
        *failures = 0;
    }
    match ended {
        Ended::Finished => Next::Done,
        Ended::Config(message) => Next::Exit(message.clone()),
        Ended::LostLease(_) => Next::Restart(Duration::ZERO),
        Ended::Failed(_) | Ended::Panicked(_) => {
            *failures = failures.saturating_add(1);
            Next::Restart(backoff(*failures))
        }
    }
}

/// The delay before the restart after `failures` consecutive failures.
pub fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY)
}

/// Where a module is, for its health check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// An instance runs since `since`, after `failures` consecutive failures.
    Running { since: Instant, failures: u32 },
    /// No instance runs: the last one ended so.
    Down { why: String },
}

/// Whether the module is healthy in `state` at `now`: an instance runs,
/// and it is not crash-looping (fewer than [`CRASH_LOOP`] consecutive
/// failures, or it has run [`HEALTHY_RESET`] since).
pub fn healthy(state: &State, now: Instant) -> Result<(), String> {
    match state {
        State::Down { why } => Err(format!("module down: {why}")),
        State::Running { since, failures } => {
            if *failures >= CRASH_LOOP && now.saturating_duration_since(*since) < HEALTHY_RESET {
                Err(format!("module crash-looping: {failures} failures in a row"))
            } else {
                Ok(())
            }
        }
    }
}

/// A module's `/healthz/<module>` check.
#[derive(Clone)]
struct Status(Arc<Mutex<State>>);

impl Status {
    fn set(&self, state: State) {
        *self.0.lock() = state;
    }
}

impl HealthCheck for Status {
    fn check(&self) -> BoxFuture<'static, HealthReport> {
        let verdict = healthy(&self.0.lock(), Instant::now());
        Box::pin(async move {
            match verdict {
                Ok(()) => HealthReport::ok(),
                Err(why) => HealthReport::failed(500, why),
            }
        })
    }
}

/// Runs `module` until shutdown, each instance in a scope of its own under
/// `base.shutdown` (the process's), starting new ones per [`next`]. `Err`:
/// the process must exit 1.
pub async fn supervise(module: ModuleConfig, base: ModuleContext) -> Result<(), String> {
    let name = module.name();
    let process = base.shutdown.clone();
    let status = Status(Arc::new(Mutex::new(State::Running { since: Instant::now(), failures: 0 })));
    if module.desc().needs.kube {
        // The node modules serve their own check under their name.
        base.health.register(name, Arc::new(status.clone()));
        // And in `/healthz/leader-election`, the path the chart's liveness
        // probe asks: a controller that cannot recover restarts the pod.
        if let Some(kube) = base.kube.as_ref() {
            kube.leader_health.set(&format!("module:{name}"), Arc::new(status.clone()));
        }
    }
    metrics::describe_counter!(METRIC_RESTARTS, METRIC_RESTARTS_HELP);
    let mut failures = 0;
    loop {
        let instance = process.child_token();
        let ctx = ModuleContext { shutdown: instance.clone(), ..base.clone() };
        let started = Instant::now();
        status.set(State::Running { since: started, failures });
        let joined = tokio::spawn(module.run(ctx)).await;
        // Whatever the instance started (handlers, recorder, tasks) stops.
        instance.cancel();
        let ended = Ended::from_result(joined);
        if process.is_cancelled() {
            if let Ended::Failed(e) | Ended::Panicked(e) = &ended {
                tracing::error!(module = name, error = %e, "Module failed while stopping");
            }
            return Ok(());
        }
        let delay = match next(&ended, started.elapsed(), &mut failures) {
            Next::Done => return Ok(()),
            Next::Exit(message) => return Err(message),
            Next::Restart(delay) => delay,
        };
        let reason = ended.reason();
        metrics::counter!(METRIC_RESTARTS, "module" => name, "reason" => reason).increment(1);
        let why = match &ended {
            Ended::LostLease(m) | Ended::Failed(m) | Ended::Panicked(m) | Ended::Config(m) => m.clone(),
            Ended::Finished => String::new(),
        };
        if matches!(ended, Ended::LostLease(_)) {
            tracing::warn!(module = name, %why, "Module lost its Lease; starting it again in standby");
        } else {
            tracing::error!(module = name, %why, reason, ?delay, failures, "Module stopped; starting it again");
        }
        status.set(State::Down { why });
        tokio::select! {
            () = process.cancelled() => return Ok(()),
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// The text of a panic's payload.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => {
            payload.downcast_ref::<&str>().map_or_else(|| "a non-text panic".to_string(), |s| s.to_string())
        }
    }
}

#[cfg(test)]
mod tests;
