//! Lease orchestration for the controller modules: run a module's work
//! while it leads (its own upstream-named Lease, or the process's shared one).

use super::contract::{ModuleContext, ModuleError};

/// Runs `work` now, or, with `--leader-election`, only while this process
/// holds the module's Lease `lock_name` (upstream's name: one Lease per
/// module, so csi-sidecar and upstream sidecars can be mixed in a rollout),
/// or, with `--leader-election-shared-lease`, the process's one Lease.
/// Every module's Lease health is served together at
/// `/healthz/leader-election` (and per module at
/// `/healthz/leader-election-<module>`).
pub async fn run_led<F, Fut>(
    ctx: &ModuleContext,
    module: &'static str,
    lock_name: &str,
    work: F,
) -> Result<(), ModuleError>
where
    F: FnOnce(tokio_util::sync::CancellationToken) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let fatal = |message: String| ModuleError::Fatal { module, message };
    let kube = ctx.kube.as_ref().ok_or_else(|| fatal("no Kubernetes client".into()))?;
    let ledger = ctx.debug.ledger(module);
    // The workers' queues record `Running` when they start.
    let work = {
        let ledger = ledger.clone();
        move |token| {
            ledger.set_phase(crate::debug::Phase::SyncingCache);
            work(token)
        }
    };
    if let Some(shared) = kube.shared_lease(&ctx.shutdown).await.map_err(|e| fatal(e.to_string()))? {
        let elector = shared.elector().clone();
        ledger.set_leader(std::sync::Arc::new(move || elector.view()));
        ctx.health.register("leader-election", std::sync::Arc::new(kube.leader_health.clone()));
        tracing::info!(module, "Waiting for the process's shared Lease");
        ledger.set_phase(crate::debug::Phase::Standby);
        let Some(token) = shared.leading().await.map_err(fatal)? else { return Ok(()) };
        // On shutdown the work drains (in-flight calls finish, then the
        // Lease is released); on a lost Lease it is dropped at once, as the
        // per-module elector does (upstream exits): another replica may
        // lead as soon as the Lease expires.
        tokio::select! {
            () = work(token.clone()) => {}
            reason = shared.lost() => return Err(fatal(reason)),
        }
        return if token.is_cancelled() { shared.outcome().await.map_err(fatal) } else { Ok(()) };
    }
    match kube.elector(lock_name).map_err(|e| fatal(e.to_string()))? {
        Some(elector) => {
            let observed = elector.clone();
            ledger.set_leader(std::sync::Arc::new(move || observed.view()));
            let check = elector.health_check();
            ctx.health.register(&format!("leader-election-{module}"), check.clone());
            kube.leader_health.add(check);
            ledger.set_phase(crate::debug::Phase::Standby);
            ctx.health.register("leader-election", std::sync::Arc::new(kube.leader_health.clone()));
            elector.run(ctx.shutdown.clone(), work).await.map_err(|e| fatal(e.to_string()))
        }
        None => {
            work(ctx.shutdown.clone()).await;
            Ok(())
        }
    }
}
