//! prober: livenessprobe parity.
//!
//! `/healthz` answers from a CSI `Probe` within `--probe-timeout`, with
//! upstream's codes and bodies. Unlike upstream it dials nothing per request:
//! it uses the process's shared driver connection, and concurrent requests
//! share one in-flight `Probe`.

pub mod config;
pub mod decide;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};

use crate::{
    csi::Connection,
    http::{HealthCheck, HealthReport},
    modules::{ModuleContext, ModuleError},
};
use config::ProberFlags;

type InFlight = Shared<BoxFuture<'static, HealthReport>>;

/// The health check: one `Probe` at a time, shared by concurrent callers.
pub struct SharedProbe {
    csi: Connection,
    timeout: Duration,
    in_flight: Mutex<Option<InFlight>>,
}

impl SharedProbe {
    /// A check probing through `csi` with `timeout` per probe.
    pub fn new(csi: Connection, timeout: Duration) -> Self {
        SharedProbe { csi, timeout, in_flight: Mutex::new(None) }
    }

    fn join_or_start(&self) -> InFlight {
        let mut slot = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = slot.as_ref() {
            return f.clone();
        }
        let csi = self.csi.clone();
        let timeout = self.timeout;
        let fut = async move { decide::report(csi.probe(timeout).await) }.boxed().shared();
        *slot = Some(fut.clone());
        fut
    }

    fn finish(&self, done: &InFlight) {
        let mut slot = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|f| f.ptr_eq(done)) {
            *slot = None;
        }
    }

    /// Runs (or joins) a probe.
    pub async fn probe(self: Arc<Self>) -> HealthReport {
        let fut = self.join_or_start();
        let report = fut.clone().await;
        self.finish(&fut);
        if report.is_healthy() {
            tracing::trace!("Health check succeeded");
        } else {
            tracing::error!(status = report.status, body = %report.body, "Health check failed");
        }
        report
    }
}

impl HealthCheck for Arc<SharedProbe> {
    fn check(&self) -> BoxFuture<'static, HealthReport> {
        self.clone().probe().boxed()
    }
}

/// Registers the health check and serves until shutdown.
pub async fn run(cfg: ProberFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    let probe = Arc::new(SharedProbe::new(ctx.csi.clone(), cfg.probe_timeout));
    ctx.health.register("prober", Arc::new(probe));
    ctx.shutdown.cancelled().await;
    Ok(())
}
