//! The host: builds the shared services the modules need (one driver
//! connection, one health registry, one HTTP server, one shutdown token),
//! runs the modules, and shuts everything down within a bounded grace.

use std::{process::ExitCode, time::Duration};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    cli::Invocation,
    csi::Connection,
    http::{self, HealthRegistry},
    k8s::KubeContext,
    metrics::Metrics,
    modules::{ModuleConfig, ModuleContext},
};

/// The shortest shutdown grace (what every process gets, whatever its
/// timeouts).
pub const MIN_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Time after the longest CSI call for the API write of its result and the
/// Lease release.
pub const FINAL_WRITES_MARGIN: Duration = Duration::from_secs(3);

/// A pod's default `terminationGracePeriodSeconds`: the kubelet sends
/// SIGKILL this long after SIGTERM.
pub const POD_TERMINATION_GRACE: Duration = Duration::from_secs(30);

/// Kept free of [`POD_TERMINATION_GRACE`], so the process exits (and logs
/// why) before the SIGKILL.
pub const EXIT_MARGIN: Duration = Duration::from_secs(2);

/// How long modules get to finish after SIGTERM/SIGINT: the longest
/// per-call CSI timeout of the modules plus [`FINAL_WRITES_MARGIN`], so a
/// call in flight can finish, be recorded and the Lease released; at least
/// [`MIN_SHUTDOWN_GRACE`], at most the pod's default grace minus
/// [`EXIT_MARGIN`].
pub fn shutdown_grace(call_timeouts: impl IntoIterator<Item = Duration>) -> Duration {
    let longest = call_timeouts.into_iter().max().unwrap_or_default();
    let wanted = longest.saturating_add(FINAL_WRITES_MARGIN);
    wanted.clamp(MIN_SHUTDOWN_GRACE, POD_TERMINATION_GRACE.saturating_sub(EXIT_MARGIN))
}

/// Fires `token` on SIGTERM or SIGINT.
fn spawn_signal_handler(token: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
            _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
        }
        token.cancel();
    });
    Ok(())
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    tracing::error!("{message}");
    ExitCode::from(1)
}

/// A module's view of the shared services: its Kubernetes clients send its
/// upstream program name (`csi-attacher`, ...) as `User-Agent`, which the
/// apiserver records as the field manager of its writes.
fn module_context(
    ctx: &ModuleContext,
    desc: &crate::modules::ModuleDesc,
) -> Result<ModuleContext, crate::k8s::client::ClientError> {
    let mut ctx = ctx.clone();
    let program = desc.binary_names.first().copied().unwrap_or(desc.name);
    if let Some(kube) = ctx.kube.as_mut() {
        *kube = kube.for_module(desc.name, program)?;
    }
    Ok(ctx)
}

/// Runs the invocation until shutdown or a process-wide failure.
///
/// Policy: a module that fails, panics or loses its Lease is started again
/// alone (`supervise`); the process exits 1 (the kubelet restarts the
/// container) on what no module restart can mend: a configuration error,
/// the driver answering under another name, the HTTP port lost, the shared
/// cache unable to start.
pub async fn run(inv: Invocation) -> ExitCode {
    let shutdown = CancellationToken::new();
    if let Err(e) = spawn_signal_handler(shutdown.clone()) {
        return fail(format!("cannot install signal handlers: {e}"));
    }
    run_until(inv, shutdown).await
}

/// [`run`] without the signal handlers: the process stops when `shutdown`
/// is cancelled (a program that embeds csi-sidecar, or a test, owns it).
pub async fn run_until(inv: Invocation, shutdown: CancellationToken) -> ExitCode {
    for m in &inv.modules {
        if let Err(e) = m.validate() {
            return fail(e);
        }
    }
    let health_port = inv.modules.iter().any(|m| m.desc().needs.default_health_port);
    let plan = match http::listen_plan(&inv.shared, health_port) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let metrics = match Metrics::install() {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let csi = match Connection::new(inv.shared.csi_address()) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };

    let mut tasks = JoinSet::new();
    // Each module's `discovery_timeout` is its per-call CSI `--timeout`.
    let grace = shutdown_grace(inv.modules.iter().map(ModuleConfig::discovery_timeout));
    let discovery_timeout =
        inv.modules.iter().map(ModuleConfig::discovery_timeout).max().unwrap_or(Duration::from_secs(1));
    // The controller modules wait for a ready driver, as upstream's do.
    let probe = inv.modules.iter().any(ModuleConfig::needs_kube);
    let mut driver_watch = tokio::spawn(csi.clone().maintain_with(discovery_timeout, probe, shutdown.clone()));
    {
        let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => metrics.upkeep(),
                }
            }
        });
    }

    let health = HealthRegistry::default();
    let debug = crate::debug::Registry::default();
    debug.export_gauges();
    {
        let csi = csi.clone();
        debug.set_driver_source(std::sync::Arc::new(move || csi.driver().map(|d| d.name.to_string())));
    }
    let listeners = match http::bind(&plan).await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let served_debug = inv.shared.enable_debug_endpoints.then(|| debug.clone());
    let router = http::router(health.clone(), Some(metrics), inv.shared.metrics_path(), served_debug);
    // The HTTP port lost is a process-wide failure: no module restart mends it.
    let http_failed = CancellationToken::new();
    for l in listeners {
        let (router, shutdown, failed) = (router.clone(), shutdown.clone(), http_failed.clone());
        tasks.spawn(async move {
            if let Err(e) = http::serve(l, router, shutdown).await {
                tracing::error!(error = %e, "HTTP server failed");
                failed.cancel();
            }
        });
    }

    let kube = if inv.modules.iter().any(ModuleConfig::needs_kube) {
        let master = inv.modules.iter().find_map(ModuleConfig::master);
        let kubeconfig_env = inv.modules.iter().any(|m| m.desc().needs.kubeconfig_env);
        match KubeContext::connect_with(&inv.shared, master, kubeconfig_env, &inv.budgets).await {
            Ok(k) => Some(k),
            Err(e) => return fail(e),
        }
    } else {
        None
    };
    // Every controller module is listed from the start (`Starting`).
    for m in inv.modules.iter().filter(|m| m.needs_kube()) {
        debug.ledger(m.name());
    }
    let ctx = ModuleContext {
        csi,
        health,
        shutdown: shutdown.clone(),
        process: shutdown.clone(),
        grace,
        kube,
        debug,
        listener: None,
    };
    let mut modules = JoinSet::new();
    for m in inv.modules {
        let name = m.name();
        let mut ctx = match module_context(&ctx, m.desc()) {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        // A module's port lost is a process-wide failure, as the HTTP port's.
        if let Some(addr) = m.listen_address() {
            match http::listen_std(&addr).await {
                Ok(l) => ctx.listener = Some(std::sync::Arc::new(l)),
                Err(e) => return fail(format!("{name}: cannot listen on {addr}: {e}")),
            }
        }
        // Each module is its own failure domain: restarted alone (supervise.rs).
        modules.spawn(async move { (name, crate::supervise::supervise(m, ctx).await) });
    }

    let mut code = ExitCode::SUCCESS;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = http_failed.cancelled() => {
                code = ExitCode::from(1);
                shutdown.cancel();
                break;
            }
            renamed = &mut driver_watch => {
                if let Ok(Err(e)) = renamed {
                    tracing::error!("{e}");
                    code = ExitCode::from(1);
                }
                shutdown.cancel();
                break;
            }
            joined = modules.join_next() => match joined {
                None => break,
                Some(Ok((_, Ok(())))) => {}
                Some(Ok((name, Err(e)))) => {
                    tracing::error!(module = name, error = %e, "Module cannot run; stopping the process");
                    code = ExitCode::from(1);
                    shutdown.cancel();
                }
                Some(Err(e)) => {
                    tracing::error!(error = %e, "Module supervisor panicked; stopping the process");
                    code = ExitCode::from(1);
                    shutdown.cancel();
                }
            }
        }
    }
    shutdown.cancel();
    let drain = async {
        while let Some(joined) = modules.join_next().await {
            if let Ok((name, Err(e))) = joined {
                tracing::error!(module = name, error = %e, "Module failed while stopping");
            }
        }
        while tasks.join_next().await.is_some() {}
    };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!(?grace, "Shutdown grace exceeded; exiting anyway");
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shutdown_grace_covers_the_longest_call_within_a_pods_grace() {
        let s = Duration::from_secs;
        let cases: &[(&str, &[Duration], Duration)] = &[
            ("no module", &[], s(5)),
            ("prober's 1 s probe: the floor", &[s(1)], s(5)),
            ("exactly the floor", &[s(2)], s(5)),
            ("provisioner's default 10 s", &[s(10)], s(13)),
            ("attacher's default 15 s with a prober", &[s(1), s(15)], s(18)),
            ("fractions are kept", &[Duration::from_millis(12_500)], Duration::from_millis(15_500)),
            ("25 s: the ceiling", &[s(25)], s(28)),
            ("a 2 min timeout is cut to the pod's grace", &[s(120)], s(28)),
            ("an absurd timeout does not overflow", &[Duration::MAX], s(28)),
        ];
        for (what, timeouts, want) in cases {
            assert_eq!(shutdown_grace(timeouts.iter().copied()), *want, "{what}");
        }
    }
}
