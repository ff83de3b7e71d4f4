//! Lease orchestration for the controller modules: run a module's work
//! while it leads (its own upstream-named Lease, or the process's shared one).

use std::{future::Future, sync::Arc};

use tokio_util::sync::CancellationToken;

use super::contract::{ModuleContext, ModuleError};

/// Runs `work` now, or, with `--leader-election`, only while this process
/// holds the module's Lease `lock_name` (upstream's name: one Lease per
/// module, so csi-sidecar and upstream sidecars can be mixed in a rollout),
/// or, with `--leader-election-shared-lease`, the process's one Lease and
/// then the module's own (the migration guard).
/// Every module's Lease health is served together at
/// `/healthz/leader-election` (and per module at
/// `/healthz/leader-election-<module>`).
///
/// A lost Lease cancels the work's token; the work in hand gets the host's
/// grace to finish (as on shutdown), then this returns
/// [`ModuleError::LostLease`] and the host starts the module again, in
/// standby. Upstream's sidecars exit instead, which costs every other
/// module of a combined process its leadership.
pub async fn run_while_leading<F, Fut>(
    ctx: &ModuleContext,
    module: &'static str,
    lock_name: &str,
    work: F,
) -> Result<(), ModuleError>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = ()>,
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
    if let Some(shared) = kube.shared_lease(&ctx.process).await.map_err(|e| fatal(e.to_string()))? {
        let elector = shared.elector().clone();
        ledger.set_leader(Arc::new(move || elector.view()));
        ctx.health.register("leader-election", Arc::new(kube.leader_health.clone()));
        tracing::info!(module, "Waiting for the process's shared Lease");
        ledger.set_phase(crate::debug::Phase::Standby);
        let Some(token) = shared.leading().await.map_err(fatal)? else { return Ok(()) };
        // KEP-4958's Lease-migration guard: the module also takes its own
        // upstream-named Lease and works only while it holds both, so an
        // upstream sidecar of the previous deployment (which leads that
        // Lease) and this process never lead the module at once, in a
        // rollout or a rollback. The shared term ending is this election's
        // shutdown: the work drains, then the module's Lease is released.
        let Some(own) = kube.elector(lock_name).map_err(|e| fatal(e.to_string()))? else {
            return Err(fatal("a shared Lease without leader election".into()));
        };
        watch_own_lease(ctx, module, &own);
        let grace = ctx.grace;
        let led =
            own.run(token.clone(), grace, move |t| async move { drained(&t, grace, work(t.clone())).await }).await;
        if ctx.shutdown.is_cancelled() {
            // On shutdown the shared Lease is released once every module's
            // work has drained.
            return shared.outcome().await.map_err(fatal);
        }
        return match led {
            Ok(()) if token.is_cancelled() => {
                Err(ModuleError::LostLease { module, message: "the process's shared Lease was lost".into() })
            }
            Ok(()) => Ok(()),
            Err(lost @ crate::k8s::leader::LeaderError::Lost { .. }) => {
                Err(ModuleError::LostLease { module, message: lost.to_string() })
            }
            Err(e) => Err(fatal(e.to_string())),
        };
    }
    match kube.elector(lock_name).map_err(|e| fatal(e.to_string()))? {
        Some(elector) => {
            let observed = elector.clone();
            ledger.set_leader(Arc::new(move || observed.view()));
            watch_own_lease(ctx, module, &elector);
            ledger.set_phase(crate::debug::Phase::Standby);
            ctx.health.register("leader-election", Arc::new(kube.leader_health.clone()));
            match elector.run(ctx.shutdown.clone(), ctx.grace, work).await {
                Ok(()) => Ok(()),
                Err(lost @ crate::k8s::leader::LeaderError::Lost { .. }) => {
                    Err(ModuleError::LostLease { module, message: lost.to_string() })
                }
                Err(e) => Err(fatal(e.to_string())),
            }
        }
        None => {
            work(ctx.shutdown.clone()).await;
            Ok(())
        }
    }
}

/// Serves the health of the module's own Lease at
/// `/healthz/leader-election-<module>` and in `/healthz/leader-election`.
fn watch_own_lease(ctx: &ModuleContext, module: &'static str, elector: &crate::k8s::leader::LeaderElector) {
    let check = elector.health_check();
    ctx.health.register(&format!("leader-election-{module}"), check.clone());
    if let Some(kube) = ctx.kube.as_ref() {
        kube.leader_health.set(module, check);
    }
}

/// Runs `work` until it returns, or until `grace` after `token` was
/// cancelled (then it is dropped, with a warning).
async fn drained(token: &CancellationToken, grace: std::time::Duration, work: impl Future<Output = ()>) {
    let overdue = async {
        token.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        () = work => {}
        () = overdue => tracing::warn!(?grace, "The work in hand did not finish within the drain time; dropped"),
    }
}
