//! health-monitor: external-health-monitor-controller parity (v0.18.0), and
//! the CSI 1.13 form ahead of upstream's release.
//!
//! The driver's capabilities choose the form and mode ([`decide::plan`]):
//! a CSI <= 1.12 driver reports `VolumeCondition` through ListVolumes (list
//! mode) or ControllerGetVolume (get mode), a CSI 1.13 driver through
//! ControllerListVolumeHealth / ControllerGetVolumeHealth. What the driver
//! says goes out as events on the claim (`VolumeConditionAbnormal`,
//! `VolumeConditionNormal`), or, for a 1.13 driver on a cluster that serves
//! `PersistentVolumeClaim.status.healthStatus` (Kubernetes 1.37 with
//! `CSIVolumeHealth`: found out by asking the apiserver, [`status_api`]),
//! as that field. Both are written on change only; what was last reported
//! is recalled after a restart from this monitor's own events (two lists
//! scoped by reason and source: no cluster-wide Event cache) or from the
//! claim's status. The volumes come from the shared cache (bound PVs of the
//! driver and their claims) at every pass, so a PV that leaves Bound and
//! comes back is monitored again. Abnormal claims are also a metric
//! ([`gauges`]). Lease `external-health-monitor-leader-<driver>`.

pub mod config;
pub mod decide;
mod gauges;
mod monitor;
mod nodes;
mod status_api;

use std::{sync::Arc, time::Duration};

use futures::future::BoxFuture;

use crate::{
    compat::health_monitor as upstream,
    modules::{
        contract::{Module, ModuleContext, ModuleError},
        kit::Kit,
    },
};
use config::HealthMonitorFlags;

const NAME: &str = "health-monitor";

/// The module's entry points for the host.
impl Module for HealthMonitorFlags {
    fn validate(&self) -> Result<(), ModuleError> {
        HealthMonitorFlags::validate(self).map_err(|message| ModuleError::Config { module: NAME, message })
    }

    fn discovery_timeout(&self) -> Duration {
        self.timeout
    }

    fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>> {
        Box::pin(run(self.clone(), ctx))
    }
}

/// Runs the health monitor until shutdown (or until its Lease is lost).
pub async fn run(cfg: HealthMonitorFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    let kit = Kit::new(NAME, ctx)?;
    cfg.validate().map_err(|message| kit.config_error(message))?;
    let Some(driver) = kit.driver().await else { return Ok(()) };
    let (ctx, kube) = (&kit.ctx, &kit.kube);
    let plan = match decide::plan(driver.health_capabilities()) {
        Ok(plan) => plan,
        Err(message) => {
            // At info level: upstream logs this at V(2) only, and the
            // container crash-loops without a word (kubernetes#101616).
            tracing::info!(driver = %driver.name, "{message}");
            return Err(kit.config_error(message));
        }
    };
    let pvs = crate::modules::views::driver_pvs(&kube.informers, &driver.name);
    let claims = crate::modules::views::bound_claims(&kube.informers, &driver.name, monitor::claim_may_be_for_driver);
    let nodes = cfg.enable_node_watcher.then(|| nodes::NodeWatcher::new(&kube.informers, &ctx.shutdown));
    kube.informers.start(&ctx.process);
    tracing::info!(driver = %driver.name, form = ?plan.form, mode = ?plan.mode, "Health monitor starting");
    let gauges = gauges::Gauges::install(&driver.name);
    let m = Arc::new(monitor::Monitor {
        plan,
        csi: ctx.csi.clone(),
        client: kube.client.clone(),
        events: kit.recorder(&upstream::event_component(&driver.name)),
        pvs_informer: pvs,
        claims_informer: claims,
        reported: Default::default(),
        status: status_api::StatusApi::default(),
        nodes,
        gauges,
        driver: driver.clone(),
        ledger: ctx.debug.ledger(NAME),
        cfg,
    });
    kit.lead(&upstream::lease_lock_name(&driver.name), move |crew| async move { m.lead(crew.token().clone()).await })
        .await
}
