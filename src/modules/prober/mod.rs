//! prober: livenessprobe parity.
//!
//! `/healthz` answers from a CSI `Probe` within `--probe-timeout`, with
//! upstream's codes and bodies. Unlike upstream it dials nothing per request:
//! it uses the process's shared driver connection, and the health registry
//! makes concurrent requests share one in-flight `Probe`. A request while
//! the driver is still being discovered waits for the discovery (within the
//! timeout), so the `Probe` is counted under the driver's name, as upstream
//! asks the name before each `Probe`.

pub mod config;
pub mod decide;

use std::{sync::Arc, time::Duration};

use futures::{FutureExt, future::BoxFuture};

use crate::{
    csi::Connection,
    healthz::{HealthCheck, HealthReport},
    modules::contract::{Module, ModuleContext, ModuleError},
};
use config::ProberFlags;

/// The health check: a `Probe` through the shared connection.
pub struct ProbeCheck {
    csi: Connection,
    timeout: Duration,
}

impl HealthCheck for ProbeCheck {
    fn check(&self) -> BoxFuture<'static, HealthReport> {
        let (csi, timeout) = (self.csi.clone(), self.timeout);
        async move {
            let started = tokio::time::Instant::now();
            let never = tokio_util::sync::CancellationToken::new();
            // Not discovered within the timeout: the driver is down or
            // broken, and the Probe gets the whole timeout to say how (the
            // answer then takes up to twice the timeout).
            let budget = match tokio::time::timeout(timeout, csi.wait_for_driver(&never)).await {
                Ok(_) => timeout.saturating_sub(started.elapsed()),
                Err(_) => timeout,
            };
            let report = decide::report(csi.probe(budget).await);
            if report.is_healthy() {
                tracing::trace!("Health check succeeded");
            } else {
                tracing::error!(status = report.status, body = %report.body, "Health check failed");
            }
            report
        }
        .boxed()
    }
}

/// The module's entry points for the host.
impl Module for ProberFlags {
    fn validate(&self) -> Result<(), ModuleError> {
        Ok(())
    }

    fn discovery_timeout(&self) -> Duration {
        self.probe_timeout
    }

    fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>> {
        Box::pin(run(self.clone(), ctx))
    }
}

/// Registers the health check and serves until shutdown.
pub async fn run(cfg: ProberFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    ctx.health.register("prober", Arc::new(ProbeCheck { csi: ctx.csi.clone(), timeout: cfg.probe_timeout }));
    ctx.shutdown.cancelled().await;
    Ok(())
}
