//! The I/O around [`decide`]: campaigning, renewing and releasing a Lease
//! through the Kubernetes API.

use parking_lot::Mutex;
use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use futures::{FutureExt, future::BoxFuture};
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    config::{LeaderElectionConfig, LeaderError, LostReason},
    decide::{
        Decision, Observed, decide, holder_of, jittered, leader_health, observe, released, standby_jittered,
        standby_wait,
    },
};
use crate::{
    compat::leader_election as upstream,
    healthz::{HealthCheck, HealthReport},
};

/// The wall clock at microsecond precision (the resolution of `MicroTime`,
/// so what we write compares equal to what the server returns).
pub(super) fn wall_now() -> Timestamp {
    let micros = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0);
    Timestamp::from_microsecond(i64::try_from(micros).unwrap_or(i64::MAX)).unwrap_or(Timestamp::UNIX_EPOCH)
}

#[derive(Default)]
struct State {
    /// The last record seen, for expiry by local observation.
    observed: Option<Observed>,
    /// The Lease as we last wrote it (with its resourceVersion) while leading:
    /// the renewal fast path and the release update it without reading first.
    mine: Option<Lease>,
    /// When the last write of ours succeeded.
    last_renewal: Option<Instant>,
}

struct Inner {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    /// `namespace/name`, for logs and errors.
    lease_ref: String,
    leading: AtomicBool,
    state: Mutex<State>,
}

/// The result of one round.
enum Attempt {
    /// We hold the Lease now.
    Leading,
    /// Someone else does (or won this round): the holder (`None` when
    /// unknown: a conflict) and how long until its Lease expires unless renewed.
    Standby { holder: Option<String>, expires_in: Option<std::time::Duration> },
    /// While renewing: the Lease has another holder.
    Lost(String),
}

/// A candidate for one Lease. Cheap to clone; clones share the state.
#[derive(Clone)]
pub struct LeaderElector {
    inner: Arc<Inner>,
}

impl LeaderElector {
    /// A candidate using `client` (give it a client of its own, with its own
    /// request budget, so busy modules cannot starve renewals).
    pub fn new(client: Client, config: LeaderElectionConfig) -> Self {
        metrics::describe_gauge!(upstream::METRIC_MASTER_STATUS, upstream::METRIC_MASTER_STATUS_HELP);
        metrics::describe_counter!(upstream::METRIC_SLOWPATH_TOTAL, upstream::METRIC_SLOWPATH_TOTAL_HELP);
        let inner = Inner {
            api: Api::namespaced(client, &config.namespace),
            lease_ref: format!("{}/{}", config.namespace, config.lease_name),
            config,
            leading: AtomicBool::new(false),
            state: Mutex::new(State::default()),
        };
        let elector = LeaderElector { inner: Arc::new(inner) };
        elector.set_leading(false);
        elector
    }

    /// The configuration.
    pub fn config(&self) -> &LeaderElectionConfig {
        &self.inner.config
    }

    /// Whether this process currently leads.
    pub fn is_leader(&self) -> bool {
        self.inner.leading.load(Ordering::SeqCst)
    }

    /// The `/healthz/leader-election` check (register it under
    /// [`upstream::HEALTH_CHECK_NAME`]): 200 `ok` when not leading or when the last
    /// successful renewal is at most lease duration + 20 s old; else 500 with
    /// upstream's text.
    pub fn health_check(&self) -> Arc<dyn HealthCheck> {
        Arc::new(LeaderHealth(self.inner.clone()))
    }

    /// What `/debug/objects` shows of this election: the Lease, whether we
    /// lead, and the holder last observed (no API call).
    pub fn view(&self) -> crate::debug::LeaderView {
        let holder = self.inner.state.lock().observed.as_ref().map(|o| holder_of(&o.spec).to_string());
        crate::debug::LeaderView {
            lease: self.inner.lease_ref.clone(),
            leading: self.is_leader(),
            holder: holder.filter(|h| !h.is_empty()),
        }
    }

    /// Reads the Lease's current holder (`None`: no Lease or no holder).
    pub async fn current_holder(&self) -> Result<Option<String>, LeaderError> {
        let lease = self
            .inner
            .api
            .get_opt(&self.inner.config.lease_name)
            .await
            .map_err(|source| LeaderError::Api { lease: self.inner.lease_ref.clone(), source })?;
        Ok(lease.and_then(|l| l.spec).and_then(|s| s.holder_identity).filter(|h| !h.is_empty()))
    }

    /// Campaigns until this process leads, then runs `lead` with a token that
    /// is cancelled when leadership is lost or `shutdown` fires; releases the
    /// Lease on shutdown. Returns Ok(()) after a clean shutdown, or when
    /// `lead` returned by itself (the Lease is released then too);
    /// Err(LeaderError::Lost{..}) if leadership was lost (the caller then
    /// campaigns again; upstream exits).
    ///
    /// On shutdown, `lead` must return soon after its token is cancelled: the
    /// Lease is renewed until it does, and released after. On loss, the token
    /// is cancelled and `lead` gets `drain` to finish the work in hand (the
    /// calls in flight, as on shutdown; no new work starts), then it is
    /// dropped: tasks it spawned must watch the token.
    pub async fn run<F, Fut>(
        &self,
        shutdown: CancellationToken,
        drain: std::time::Duration,
        lead: F,
    ) -> Result<(), LeaderError>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        let cfg = &self.inner.config;
        cfg.validate()?;
        let lease = self.inner.lease_ref.as_str();
        tracing::info!(lease, identity = %cfg.identity, "attempting to acquire leader lease");
        if !self.acquire(&shutdown).await {
            return Ok(());
        }
        self.set_leading(true);
        tracing::info!(lease, identity = %cfg.identity, "successfully acquired lease");

        let lead_token = shutdown.child_token();
        let mut lead_fut = std::pin::pin!(lead(lead_token.clone()));
        let renewing = std::pin::pin!(self.keep_renewing());
        let lost = tokio::select! {
            () = &mut lead_fut => None,
            reason = renewing => Some(reason),
        };
        match lost {
            Some(reason) => {
                lead_token.cancel();
                self.set_leading(false);
                self.inner.lock().mine = None;
                tracing::error!(lease, %reason, "Stopped leading");
                if tokio::time::timeout(drain, lead_fut).await.is_err() {
                    tracing::warn!(lease, ?drain, "The work in hand did not finish within the drain time; dropped");
                }
                Err(LeaderError::Lost { lease: lease.to_string(), reason })
            }
            None => {
                self.release().await;
                self.set_leading(false);
                tracing::info!(lease, "Stopped leading");
                Ok(())
            }
        }
    }

    fn set_leading(&self, leading: bool) {
        self.inner.leading.store(leading, Ordering::SeqCst);
        let name = self.inner.config.lease_name.clone();
        metrics::gauge!(upstream::METRIC_MASTER_STATUS, upstream::LABEL_NAME => name).set(if leading {
            1.0
        } else {
            0.0
        });
    }

    /// Retries (jittered) until we lead (true) or `shutdown` fires (false).
    async fn acquire(&self, shutdown: &CancellationToken) -> bool {
        let cfg = &self.inner.config;
        let lease = self.inner.lease_ref.as_str();
        loop {
            let attempt = tokio::select! {
                () = shutdown.cancelled() => return false,
                a = tokio::time::timeout(cfg.renew_deadline, self.try_acquire_or_renew(false)) => a,
            };
            let mut next = jittered(cfg.retry_period);
            match attempt {
                Ok(Ok(Attempt::Leading)) => return true,
                Ok(Ok(Attempt::Standby { holder, expires_in })) => {
                    tracing::debug!(lease, holder = holder.as_deref().unwrap_or("?"), "lease is held by another");
                    next = standby_wait(standby_jittered(cfg.retry_period), expires_in);
                }
                Ok(Ok(Attempt::Lost(_))) => {}
                Ok(Err(e)) => tracing::warn!(lease, error = %e, "error acquiring leader lease"),
                Err(_) => tracing::warn!(lease, "acquiring the leader lease timed out"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(next) => {}
            }
        }
    }

    /// Renews every retry period; returns when leadership is lost.
    async fn keep_renewing(&self) -> LostReason {
        let cfg = &self.inner.config;
        let lease = self.inner.lease_ref.as_str();
        loop {
            tokio::time::sleep(cfg.retry_period).await;
            let deadline = Instant::now() + cfg.renew_deadline;
            let mut last_error = None;
            loop {
                let remaining = deadline.saturating_duration_since(Instant::now());
                if remaining.is_zero() {
                    return LostReason::RenewDeadline { last_error };
                }
                match tokio::time::timeout(remaining, self.try_acquire_or_renew(true)).await {
                    Ok(Ok(Attempt::Leading)) => break,
                    Ok(Ok(Attempt::Lost(holder))) => return LostReason::HeldByOther { holder },
                    Ok(Ok(Attempt::Standby { .. })) => last_error = Some("conflicting update of the lease".to_string()),
                    Ok(Err(e)) => {
                        tracing::warn!(lease, error = %e, "error renewing leader lease");
                        last_error = Some(e.to_string());
                    }
                    Err(_) => return LostReason::RenewDeadline { last_error },
                }
                tokio::time::sleep_until(deadline.min(Instant::now() + cfg.retry_period)).await;
            }
        }
    }

    /// One round of client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&self, renewing: bool) -> Result<Attempt, kube::Error> {
        let cfg = &self.inner.config;
        let inner = &self.inner;
        if renewing {
            if let Some(attempt) = self.fast_renew().await {
                return Ok(attempt);
            }
            let name = cfg.lease_name.clone();
            metrics::counter!(upstream::METRIC_SLOWPATH_TOTAL, upstream::LABEL_NAME => name).increment(1);
        }
        let current = inner.api.get_opt(&cfg.lease_name).await?;
        let (now, wall) = (Instant::now(), wall_now());
        let Some(current) = current else {
            let Decision::Create(spec) = decide(None, now, wall, &cfg.identity, cfg) else {
                return Ok(Attempt::Standby { holder: None, expires_in: None });
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.lease_name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    labels: (!cfg.labels.is_empty()).then(|| cfg.labels.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            return match inner.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.wrote(created);
                    Ok(Attempt::Leading)
                }
                Err(kube::Error::Api(s)) if s.is_already_exists() => {
                    Ok(Attempt::Standby { holder: None, expires_in: None })
                }
                Err(e) => Err(e),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        let observed = {
            let mut state = inner.lock();
            let prev = state.observed.take();
            if prev.as_ref().is_none_or(|p| holder_of(&p.spec) != holder_of(&spec)) && !holder_of(&spec).is_empty() {
                tracing::info!(lease = %inner.lease_ref, leader = holder_of(&spec), "new leader observed");
            }
            let observed = observe(prev, &spec, now);
            state.observed = Some(observed.clone());
            observed
        };
        if renewing && holder_of(&spec) != cfg.identity {
            return Ok(Attempt::Lost(holder_of(&spec).to_string()));
        }
        let spec = match decide(Some(&observed), now, wall, &cfg.identity, cfg) {
            Decision::Wait { holder, expires_in } => {
                return Ok(Attempt::Standby { holder: Some(holder), expires_in: Some(expires_in) });
            }
            Decision::TakeOver { reason, spec } => {
                tracing::debug!(lease = %inner.lease_ref, ?reason, "taking over the lease");
                spec
            }
            Decision::Renew(spec) | Decision::Create(spec) => spec,
        };
        self.write(current, spec).await
    }

    /// The leader's optimistic renewal (client-go's fast path): update the
    /// Lease as we last wrote it, without reading it first, while our own
    /// record is still valid. `None` when it failed or does not apply: the
    /// caller then takes the slow path (read, decide, write), which is what
    /// `leader_election_slowpath_total` counts.
    async fn fast_renew(&self) -> Option<Attempt> {
        let cfg = &self.inner.config;
        let (mine, observed) = {
            let state = self.inner.lock();
            (state.mine.clone()?, state.observed.clone()?)
        };
        let now = Instant::now();
        if now.saturating_duration_since(observed.at) > cfg.lease_duration {
            return None;
        }
        let Decision::Renew(spec) = decide(Some(&observed), now, wall_now(), &cfg.identity, cfg) else {
            return None;
        };
        match self.write(mine, spec).await {
            Ok(Attempt::Leading) => Some(Attempt::Leading),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(lease = %self.inner.lease_ref, error = %e, "optimistic renewal failed");
                None
            }
        }
    }

    /// Replaces `lease`'s spec (and sets our labels); the body carries the
    /// `resourceVersion` of `lease`, so a concurrent writer makes this a 409.
    async fn write(&self, lease: Lease, spec: LeaseSpec) -> Result<Attempt, kube::Error> {
        let cfg = &self.inner.config;
        let mut lease = lease;
        if !cfg.labels.is_empty() {
            lease.metadata.labels.get_or_insert_default().extend(cfg.labels.clone());
        }
        lease.spec = Some(spec);
        match self.inner.api.replace(&cfg.lease_name, &PostParams::default(), &lease).await {
            Ok(written) => {
                self.wrote(written);
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(Attempt::Standby { holder: None, expires_in: None }),
            Err(e) => Err(e),
        }
    }

    /// Records a successful write of ours.
    fn wrote(&self, lease: Lease) {
        let now = Instant::now();
        let mut state = self.inner.lock();
        state.observed = Some(Observed { spec: lease.spec.clone().unwrap_or_default(), at: now });
        state.mine = Some(lease);
        state.last_renewal = Some(now);
    }

    /// Gives the Lease up (client-go's `ReleaseOnCancel`), so a standby takes
    /// over at its next retry. A conflict means someone else wrote it since:
    /// then it is not ours to release.
    async fn release(&self) {
        let cfg = &self.inner.config;
        let lease = self.inner.lease_ref.as_str();
        let Some(mut mine) = self.inner.lock().mine.take() else {
            return;
        };
        mine.spec = Some(released(&mine.spec.clone().unwrap_or_default(), wall_now()));
        let pp = PostParams::default();
        let call = self.inner.api.replace(&cfg.lease_name, &pp, &mine);
        let mut result = tokio::time::timeout(cfg.renew_deadline, call).await;
        // A renewal cut short by the shutdown may have been written after
        // `mine`: re-read once and release that version if it is still ours.
        if let Ok(Err(kube::Error::Api(e))) = &result
            && e.code == 409
            && let Ok(Some(mut current)) = self.inner.api.get_opt(&cfg.lease_name).await
            && current.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(cfg.identity.as_str())
        {
            current.spec = Some(released(&current.spec.clone().unwrap_or_default(), wall_now()));
            let call = self.inner.api.replace(&cfg.lease_name, &pp, &current);
            result = tokio::time::timeout(cfg.renew_deadline, call).await;
        }
        match result {
            Ok(Ok(written)) => {
                let mut state = self.inner.lock();
                state.observed = Some(Observed { spec: written.spec.unwrap_or_default(), at: Instant::now() });
                tracing::info!(lease, "released leader lease");
            }
            Ok(Err(e)) => tracing::warn!(lease, error = %e, "cannot release leader lease"),
            Err(_) => tracing::warn!(lease, "releasing the leader lease timed out"),
        }
    }
}

impl Inner {
    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }
}

struct LeaderHealth(Arc<Inner>);

impl HealthCheck for LeaderHealth {
    fn check(&self) -> BoxFuture<'static, HealthReport> {
        let inner = &self.0;
        let last_renewal = inner.lock().last_renewal;
        let leading = inner.leading.load(Ordering::SeqCst);
        let report =
            leader_health(leading, last_renewal, Instant::now(), inner.config.lease_duration, &inner.config.lease_name);
        futures::future::ready(report).boxed()
    }
}
