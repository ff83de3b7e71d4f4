//! The controller kit: the wiring every controller module shares, so a
//! module holds only its decisions and its writes.
//!
//! A controller module builds a [`Kit`] from its context (the Kubernetes
//! client it must have, its backoff, its ledger), waits for the driver,
//! makes its typed queues ([`Kit::queue`]), feeds them from its views,
//! and hands its workers to [`Kit::lead`]: they run on a [`Crew`] while the
//! module leads, each sync in a span carrying the module, queue and object
//! key, each result ([`Reconciled`]) settled by the one error policy
//! ([`settle`]): the queue's next step, what the object waits for, its
//! error.

mod reconciled;

use std::{future::Future, sync::Arc, time::Duration};

use futures::future::BoxFuture;
use kube::Resource;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use self::reconciled::{Done, Reconciled, Retry, Settled, Wait, settle};
use crate::{
    csi::DriverInfo,
    k8s::{
        KubeContext,
        events::Recorder,
        key::ObjectKey,
        queue::{Backoff, Outcome, WorkQueue},
    },
    modules::contract::{ModuleContext, ModuleError},
};

/// A controller module's share of the host, and its wiring.
pub struct Kit {
    /// The module's table name (metrics, logs, its ledger).
    pub module: &'static str,
    /// What the host gave the module.
    pub ctx: ModuleContext,
    /// The module's Kubernetes client (its own budget) and the shared cache.
    pub kube: KubeContext,
    /// Per-key backoff of every queue (`--retry-interval-start`/`-max`).
    pub backoff: Backoff,
    ledger: crate::debug::Ledger,
}

impl Kit {
    /// The kit of `module`; an error if the host gave it no Kubernetes
    /// client (a module row that does not ask for one). Its queues back off
    /// as client-go's default controller rate limiter until
    /// [`Kit::retrying`] sets the module's flags.
    pub fn new(module: &'static str, ctx: ModuleContext) -> Result<Kit, ModuleError> {
        let kube =
            ctx.kube.clone().ok_or_else(|| ModuleError::Fatal { module, message: "no Kubernetes client".into() })?;
        let ledger = ctx.debug.ledger(module);
        let backoff = Backoff { start: Duration::from_millis(5), max: Duration::from_secs(1000) };
        Ok(Kit { module, ctx, kube, backoff, ledger })
    }

    /// This kit, its queues backing off per `backoff`
    /// (`--retry-interval-start`/`-max`).
    pub fn retrying(self, backoff: Backoff) -> Kit {
        Kit { backoff, ..self }
    }

    /// A configuration error of this module (exit status 1, like upstream).
    pub fn config_error(&self, message: impl Into<String>) -> ModuleError {
        ModuleError::Config { module: self.module, message: message.into() }
    }

    /// A failure this module cannot recover from.
    pub fn fatal(&self, message: impl Into<String>) -> ModuleError {
        ModuleError::Fatal { module: self.module, message: message.into() }
    }

    /// The driver, once the shared connection has discovered it; `None` on
    /// shutdown first.
    pub async fn driver(&self) -> Option<Arc<DriverInfo>> {
        self.ctx.csi.wait_for_driver(&self.ctx.shutdown).await
    }

    /// A queue of objects of kind `K`, named `name` (upstream's name, in
    /// the workqueue metrics), filing its syncs in the module's ledger.
    pub fn queue<K: Resource<DynamicType = ()> + 'static>(&self, name: &'static str) -> WorkQueue<ObjectKey<K>> {
        WorkQueue::new(name, self.backoff).tracked(&self.ledger, ObjectKey::<K>::kind())
    }

    /// A sibling of `queue` (its own keys, workers and metrics; one worker
    /// of the group at a time per key), filing in the module's ledger.
    pub fn sibling<K: Resource<DynamicType = ()> + 'static>(
        &self,
        queue: &WorkQueue<ObjectKey<K>>,
        name: &'static str,
    ) -> WorkQueue<ObjectKey<K>> {
        queue.sibling(name).tracked(&self.ledger, ObjectKey::<K>::kind())
    }

    /// The module's event recorder as `component` (upstream's).
    pub fn recorder(&self, component: &str) -> Recorder {
        Recorder::new(self.kube.client.clone(), self.module, component, "", &self.ctx.shutdown)
    }

    /// Runs `work` on a [`Crew`] while the module leads its Lease
    /// `lock_name` (or at once without leader election), until shutdown.
    pub async fn lead<F, Fut>(&self, lock_name: &str, work: F) -> Result<(), ModuleError>
    where
        F: FnOnce(Crew) -> Fut,
        Fut: Future<Output = ()>,
    {
        let module = self.module;
        crate::modules::leading::run_while_leading(&self.ctx, module, lock_name, move |token| {
            work(Crew::new(module, token))
        })
        .await
    }
}

/// The workers of a leading module: they run until the Lease is lost or
/// the process shuts down, and finish the key in hand before they stop.
pub struct Crew {
    module: &'static str,
    token: CancellationToken,
    tasks: Vec<BoxFuture<'static, ()>>,
}

impl Crew {
    fn new(module: &'static str, token: CancellationToken) -> Crew {
        Crew { module, token, tasks: Vec::new() }
    }

    /// The token the crew stops on.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Waits until `synced` (the module's views have listed), then logs
    /// "Caches synced; `activity`" (what the module now does:
    /// "attaching"); false when the crew stops first (a cache that cannot
    /// sync, a forbidden watch, must not hold up a shutdown: nothing was
    /// started that needs draining).
    pub async fn synced(&mut self, activity: &str, synced: impl Future) -> bool {
        let done = self.token.run_until_cancelled(synced).await.is_some();
        if done {
            tracing::info!(module = self.module, "Caches synced; {activity}");
        }
        done
    }

    /// Runs `workers` workers on `queue`, each sync `reconcile(target, key)`
    /// in a span `sync{module, queue, key}` and settled by [`settle`].
    pub fn serve<K, T, F, Fut>(
        &mut self,
        queue: &WorkQueue<ObjectKey<K>>,
        workers: usize,
        target: &Arc<T>,
        reconcile: F,
    ) where
        K: 'static,
        T: Send + Sync + 'static,
        F: Fn(Arc<T>, ObjectKey<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Reconciled> + Send + 'static,
    {
        let (queue, token, target, module) = (queue.clone(), self.token.clone(), target.clone(), self.module);
        let name = queue.name();
        let reconcile = Arc::new(reconcile);
        self.tasks.push(Box::pin(async move {
            queue
                .run(workers, token, move |key: ObjectKey<K>| {
                    let span = tracing::info_span!("sync", module, queue = name, key = %key);
                    #[cfg(debug_assertions)]
                    let point = format!("{module}:{key}");
                    let sync = reconcile(target.clone(), key);
                    #[cfg(debug_assertions)]
                    let sync = async move {
                        panic_point(&point);
                        sync.await
                    };
                    // On the heap at once: a sync's future is large (its CSI
                    // and API calls), and each wrapper would copy it.
                    let sync = Box::pin(sync);
                    async move { apply(&contained(module, sync).await) }.instrument(span)
                })
                .await
        }));
    }

    /// Runs `task` beside the workers (a periodic pass), until the crew stops.
    pub fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.push(Box::pin(task));
    }

    /// Runs every worker and task until the crew stops.
    pub async fn run(self) {
        futures::future::join_all(self.tasks).await;
    }
}

/// The tests' fault point, in debug builds only (a release build does not
/// contain it, nor the variable's name): the sync of the object named by
/// `$CSI_SIDECAR_TEST_PANIC` (`<module>:<namespace>/<name>`) panics, as a
/// defect in a reconcile would.
#[cfg(debug_assertions)]
fn panic_point(point: &str) {
    static TARGET: std::sync::LazyLock<Option<String>> =
        std::sync::LazyLock::new(|| std::env::var("CSI_SIDECAR_TEST_PANIC").ok());
    if TARGET.as_deref() == Some(point) {
        panic!("the test panic point of {point}");
    }
}

/// The counter of syncs that panicked, per module.
pub const PANICS_TOTAL: &str = "csi_sidecar_panics_total";

/// Runs one sync; a panic in it stays in it (where the build unwinds): the
/// object is retried with its backoff like any failure, the panic logged
/// with the module and the message, counted, and filed as the object's
/// last error.
async fn contained(module: &'static str, sync: impl Future<Output = Reconciled>) -> Reconciled {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(sync).catch_unwind().await {
        Ok(result) => result,
        Err(payload) => {
            let message = panic_message(payload.as_ref());
            metrics::counter!(PANICS_TOTAL, "module" => module).increment(1);
            tracing::error!(module, panic = %message, "Sync panicked; retrying with backoff");
            Err(Wait::failed(crate::debug::WaitingFor::Retry, format!("panicked: {message}")))
        }
    }
}

/// The text a panic was raised with.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Files a reconcile's notes for the current sync and returns the queue's
/// step; a stop with an error is logged where it happened (the span names
/// the object).
pub fn apply(result: &Reconciled) -> Outcome {
    let settled = settle(result);
    if let Some(w) = settled.waiting_for {
        crate::debug::waiting_for(w);
    }
    if let Some(error) = settled.error {
        tracing::warn!(waiting_for = w_text(settled.waiting_for), %error, "Sync stopped; retrying");
        crate::debug::failed(error);
    }
    settled.outcome
}

fn w_text(w: Option<crate::debug::WaitingFor>) -> &'static str {
    w.map_or("", crate::debug::WaitingFor::as_str)
}

#[cfg(test)]
mod tests;
