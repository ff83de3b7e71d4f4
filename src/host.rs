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
    kube::KubeContext,
    metrics::Metrics,
    modules::{ModuleConfig, ModuleContext},
};

/// How long modules get to finish after SIGTERM/SIGINT.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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

/// Runs the invocation until shutdown or a fatal module error.
///
/// Policy: a module that fails fatally stops the whole process with status
/// 1 (the kubelet restarts the container), as each upstream sidecar would.
pub async fn run(inv: Invocation) -> ExitCode {
    for m in &inv.modules {
        if let Err(e) = m.validate() {
            return fail(e);
        }
    }
    let has_prober = inv.modules.iter().any(|m| matches!(m, ModuleConfig::Prober(_)));
    let plan = match http::listen_plan(&inv.shared, has_prober) {
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
    let shutdown = CancellationToken::new();
    if let Err(e) = spawn_signal_handler(shutdown.clone()) {
        return fail(format!("cannot install signal handlers: {e}"));
    }

    let mut tasks = JoinSet::new();
    let discovery_timeout =
        inv.modules.iter().map(ModuleConfig::discovery_timeout).max().unwrap_or(Duration::from_secs(1));
    tasks.spawn(csi.clone().maintain(discovery_timeout, shutdown.clone()));
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
    let listeners = match http::bind(&plan).await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let router = http::router(health.clone(), Some(metrics), inv.shared.metrics_path());
    for l in listeners {
        let (router, shutdown) = (router.clone(), shutdown.clone());
        tasks.spawn(async move {
            if let Err(e) = http::serve(l, router, shutdown).await {
                tracing::error!(error = %e, "HTTP server failed");
            }
        });
    }

    let kube = if inv.modules.iter().any(ModuleConfig::needs_kube) {
        let master = inv.modules.iter().find_map(ModuleConfig::master);
        match KubeContext::connect(&inv.shared, master).await {
            Ok(k) => Some(k),
            Err(e) => return fail(e),
        }
    } else {
        None
    };
    let ctx = ModuleContext { csi, health, shutdown: shutdown.clone(), kube };
    let mut modules = JoinSet::new();
    for m in inv.modules {
        let name = m.name();
        let ctx = ctx.clone();
        modules.spawn(async move { (name, m.run(ctx).await) });
    }

    let mut code = ExitCode::SUCCESS;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            joined = modules.join_next() => match joined {
                None => break,
                Some(Ok((_, Ok(())))) => {}
                Some(Ok((name, Err(e)))) => {
                    tracing::error!(module = name, error = %e, "Module failed; stopping the process");
                    code = ExitCode::from(1);
                    shutdown.cancel();
                }
                Some(Err(e)) => {
                    tracing::error!(error = %e, "Module task panicked; stopping the process");
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
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        tracing::warn!(grace = ?SHUTDOWN_GRACE, "Shutdown grace exceeded; exiting anyway");
    }
    code
}
