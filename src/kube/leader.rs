//! Leader election on a `coordination.k8s.io/v1` Lease, compatible with
//! client-go's `tools/leaderelection` as csi-lib-utils configures it: candidates
//! that run the upstream sidecars and candidates that run csi-sidecar can share
//! one Lease during a rolling upgrade.
//!
//! One round is: read the Lease → [`decide`] (pure, table-tested) → write it
//! with `replace`, whose body carries the `resourceVersion` read, so a 409
//! Conflict means another candidate wrote first and won the round; or `create`
//! it, where AlreadyExists means the same. A candidate retries every retry
//! period (jittered like client-go); the leader renews every retry period and
//! has lost when a renewal round has not succeeded within the renew deadline.
//! On shutdown the leader releases the Lease (empty holder, duration 1 s), so
//! a standby takes over at its next retry instead of after the lease duration.
//! Upstream only does that behind the `ReleaseLeaderElectionOnExit` gate;
//! here it is the default.
//!
//! Deviation, on the safe side: a leader that reads the Lease during a renewal
//! and finds another holder stops leading at once, where client-go keeps
//! retrying until its renew deadline.

use std::{
    collections::{BTreeMap, hash_map::RandomState},
    fmt,
    future::Future,
    hash::BuildHasher,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ::kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use futures::{FutureExt, future::BoxFuture};
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use tokio_util::sync::CancellationToken;

use crate::{
    compat::leader_election as up,
    http::{HealthCheck, HealthReport},
};

/// Upstream's `sanitizeName`, applied to the lock name and to the identity:
/// every character outside `[a-zA-Z0-9-]` becomes `-`, and a trailing `-`
/// gets an `X` appended.
pub fn sanitize_lease_name(s: &str) -> String {
    let mut out: String = s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
    if out.ends_with('-') {
        out.push('X');
    }
    out
}

/// What a candidate needs to campaign.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// Lease name (already sanitized).
    pub lease_name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This candidate's `holderIdentity` (already sanitized).
    pub identity: String,
    /// How long a standby waits, from its last observed change of the Lease,
    /// before taking it over.
    pub lease_duration: Duration,
    /// How long the leader keeps retrying a renewal before it gives up.
    pub renew_deadline: Duration,
    /// Time between attempts (acquisition attempts are jittered).
    pub retry_period: Duration,
    /// Labels set on the Lease while this candidate leads.
    pub labels: BTreeMap<String, String>,
}

impl LeaderElectionConfig {
    /// Upstream's defaults (15 s / 10 s / 5 s, no labels). `lock_name` and
    /// `identity` are sanitized.
    pub fn new(lock_name: &str, namespace: impl Into<String>, identity: &str) -> Self {
        LeaderElectionConfig {
            lease_name: sanitize_lease_name(lock_name),
            namespace: namespace.into(),
            identity: sanitize_lease_name(identity),
            lease_duration: up::DEFAULT_LEASE_DURATION,
            renew_deadline: up::DEFAULT_RENEW_DEADLINE,
            retry_period: up::DEFAULT_RETRY_PERIOD,
            labels: BTreeMap::new(),
        }
    }

    /// Like upstream: the namespace from `namespace_flag`, else
    /// `$POD_NAMESPACE`, else the service account's namespace file, else
    /// `default`; the identity is the host name (the pod name).
    pub fn resolve(lock_name: &str, namespace_flag: Option<&str>) -> Result<Self, LeaderError> {
        Ok(Self::new(lock_name, resolve_namespace(namespace_flag), &default_identity()?))
    }

    /// client-go's checks of the timing parameters, plus non-empty names.
    pub fn validate(&self) -> Result<(), LeaderError> {
        let bad = |m: &str| Err(LeaderError::Config(m.to_string()));
        if self.lease_name.is_empty() {
            return bad("the lease name is empty");
        }
        if self.identity.is_empty() {
            return bad("the identity is empty");
        }
        if self.lease_duration < Duration::from_secs(1) {
            return bad("the lease duration must be at least 1s (the Lease counts whole seconds)");
        }
        if self.retry_period.is_zero() {
            return bad("the retry period must be greater than zero");
        }
        if self.lease_duration <= self.renew_deadline {
            return bad("the lease duration must be greater than the renew deadline");
        }
        if self.renew_deadline <= self.retry_period.mul_f64(up::JITTER_FACTOR) {
            return bad("the renew deadline must be greater than the retry period × 1.2");
        }
        Ok(())
    }

    fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// The namespace of the Lease: the flag, else `$POD_NAMESPACE`, else the
/// service account's namespace file, else `default`.
pub fn resolve_namespace(flag: Option<&str>) -> String {
    let env = std::env::var(up::NAMESPACE_ENV).ok();
    let file = || std::fs::read_to_string(up::NAMESPACE_FILE).ok();
    if flag.is_some_and(|f| !f.is_empty()) || env.as_deref().is_some_and(|e| !e.is_empty()) {
        return choose_namespace(flag, env.as_deref(), None);
    }
    choose_namespace(flag, env.as_deref(), file().as_deref())
}

/// [`resolve_namespace`] without the environment: `file` is the content of
/// the namespace file (whitespace-trimmed, like upstream; the variable is
/// taken as is).
pub fn choose_namespace(flag: Option<&str>, env: Option<&str>, file: Option<&str>) -> String {
    [flag, env, file.map(str::trim)]
        .into_iter()
        .flatten()
        .find(|s| !s.is_empty())
        .unwrap_or(up::DEFAULT_NAMESPACE)
        .to_string()
}

/// The host name (the pod name in a pod), sanitized: Go's `os.Hostname`
/// reads `/proc/sys/kernel/hostname`; `$HOSTNAME` is the fallback.
pub fn default_identity() -> Result<String, LeaderError> {
    let from_proc = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    let name = from_proc
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .ok_or_else(|| LeaderError::Identity("no host name in /proc/sys/kernel/hostname or $HOSTNAME".into()))?;
    Ok(sanitize_lease_name(&name))
}

/// Why a leader stopped leading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// No renewal round succeeded within the renew deadline.
    RenewDeadline {
        /// The last failure seen, if any.
        last_error: Option<String>,
    },
    /// A renewal found the Lease held by another identity (empty: released).
    HeldByOther {
        /// The holder found.
        holder: String,
    },
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::RenewDeadline { last_error: None } => {
                f.write_str("renewal did not succeed within the deadline")
            }
            LostReason::RenewDeadline { last_error: Some(e) } => {
                write!(f, "renewal did not succeed within the deadline (last error: {e})")
            }
            LostReason::HeldByOther { holder } if holder.is_empty() => f.write_str("the lease was released by others"),
            LostReason::HeldByOther { holder } => write!(f, "the lease is held by {holder}"),
        }
    }
}

/// Leader election failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// Leadership was lost; the caller exits 1, like upstream.
    #[error("leader election lost on lease {lease}: {reason}")]
    Lost {
        /// `namespace/name` of the Lease.
        lease: String,
        /// Why.
        reason: LostReason,
    },
    /// A Kubernetes API call failed where the caller asked for its result
    /// (campaigning itself retries API errors, like client-go).
    #[error("lease {lease}: {source}")]
    Api {
        /// `namespace/name` of the Lease.
        lease: String,
        /// The error.
        #[source]
        source: ::kube::Error,
    },
    /// The configuration is unusable.
    #[error("invalid leader election configuration: {0}")]
    Config(String),
    /// No identity could be determined.
    #[error("cannot determine the leader election identity: {0}")]
    Identity(String),
}

/// The last Lease record seen and when this process first saw it, on the
/// local monotonic clock.
///
/// Why not compare the Lease's `renewTime` with our clock: `renewTime` was
/// written with the holder's clock, and the candidates' clocks may disagree by
/// more than the lease duration. Like client-go, a candidate therefore judges
/// expiry by how long the record has stayed *unchanged in its own
/// observation*: a holder that renews changes `renewTime`, which this
/// candidate sees as a new record and restarts its local countdown; a holder
/// that stopped renewing leaves the record unchanged, and after
/// `leaseDurationSeconds` of local time the Lease is expired. Only durations
/// on one clock are compared, so clock skew between nodes does not matter. The
/// cost: a fresh candidate waits a full lease duration before taking over a
/// dead holder's Lease, however old its `renewTime`.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// The Lease's spec as read (or as written by us).
    pub spec: LeaseSpec,
    /// When this process first saw this exact spec.
    pub at: Instant,
}

/// Records the spec just read: the observation time is kept when the record
/// is unchanged and restarts when it changed.
pub fn observe(prev: Option<Observed>, current: &LeaseSpec, now: Instant) -> Observed {
    match prev {
        Some(p) if p.spec == *current => p,
        _ => Observed { spec: current.clone(), at: now },
    }
}

/// Why a candidate takes over a Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TakeOver {
    /// The holder is empty (released on shutdown).
    Released,
    /// The holder has not renewed for its lease duration, by our observation.
    Expired {
        /// The previous holder.
        holder: String,
    },
}

/// What to do with the Lease just read.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// There is no Lease: create it with this spec.
    Create(LeaseSpec),
    /// Replace the Lease's spec with this one, taking it over.
    TakeOver {
        /// Why.
        reason: TakeOver,
        /// The new spec.
        spec: LeaseSpec,
    },
    /// The Lease is ours: replace its spec with this renewed one.
    Renew(LeaseSpec),
    /// Someone else holds a valid Lease.
    Wait {
        /// The holder.
        holder: String,
        /// How long until it expires, if it is not renewed meanwhile.
        expires_in: Duration,
    },
}

/// The holder of a spec (`""` when unset).
pub fn holder_of(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or("")
}

/// The pure core of client-go's `tryAcquireOrRenew`.
///
/// `lease` is the current Lease as [`observe`]d (`None`: it does not exist),
/// `now` the local monotonic time, `wall` the wall-clock time written into
/// `acquireTime`/`renewTime`. A Lease held by someone else is expired when
/// `observed.at + leaseDurationSeconds < now`, with the duration the holder
/// wrote (the local-observation form of client-go's `renewTime +
/// leaseDurationSeconds < now`; see [`Observed`]).
pub fn decide(
    lease: Option<&Observed>,
    now: Instant,
    wall: Timestamp,
    me: &str,
    config: &LeaderElectionConfig,
) -> Decision {
    let time = Some(MicroTime(wall));
    let mine = |mut spec: LeaseSpec| {
        spec.holder_identity = Some(me.to_string());
        spec.lease_duration_seconds = Some(config.lease_duration_seconds());
        spec.renew_time = time.clone();
        spec
    };
    let Some(observed) = lease else {
        return Decision::Create(LeaseSpec {
            acquire_time: time.clone(),
            lease_transitions: Some(0),
            ..mine(LeaseSpec::default())
        });
    };
    let old = &observed.spec;
    let holder = holder_of(old);
    if holder == me {
        return Decision::Renew(mine(old.clone()));
    }
    let reason = if holder.is_empty() {
        TakeOver::Released
    } else {
        let secs = u64::try_from(old.lease_duration_seconds.unwrap_or(0)).unwrap_or(0);
        let expires = observed.at + Duration::from_secs(secs);
        if expires >= now {
            return Decision::Wait { holder: holder.to_string(), expires_in: expires - now };
        }
        TakeOver::Expired { holder: holder.to_string() }
    };
    let spec = LeaseSpec {
        acquire_time: time.clone(),
        lease_transitions: Some(old.lease_transitions.unwrap_or(0).saturating_add(1)),
        ..mine(old.clone())
    };
    Decision::TakeOver { reason, spec }
}

/// The spec that releases a Lease: no holder, duration 1 s, times now, the
/// transition count kept (client-go's `release`).
pub fn released(old: &LeaseSpec, wall: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(up::RELEASED_LEASE_DURATION_SECONDS),
        acquire_time: Some(MicroTime(wall)),
        renew_time: Some(MicroTime(wall)),
        ..old.clone()
    }
}

/// The `/healthz/leader-election` answer: 200 `ok` unless this process leads
/// and its last successful renewal is more than lease duration + 20 s old.
pub fn leader_health(
    leading: bool,
    last_renewal: Option<Instant>,
    now: Instant,
    lease_duration: Duration,
    lease_name: &str,
) -> HealthReport {
    match last_renewal {
        Some(t) if leading && now.saturating_duration_since(t) > lease_duration + up::HEALTH_CHECK_TIMEOUT => {
            HealthReport::failed(500, up::body_renew_failed(lease_name))
        }
        _ => HealthReport::ok(),
    }
}

/// A wait of `base × (1 + 1.2 × r)`, r uniform in [0, 1): client-go's
/// jittered acquisition retry, so candidates that started together spread out.
pub fn jittered(base: Duration) -> Duration {
    // A fresh `RandomState` has fresh keys: hashing anything yields a random word.
    let word = RandomState::new().hash_one(0u8);
    let r = (word >> 11) as f64 / (1u64 << 53) as f64;
    base + base.mul_f64(up::JITTER_FACTOR * r)
}

/// The wall clock at microsecond precision (the resolution of `MicroTime`,
/// so what we write compares equal to what the server returns).
fn wall_now() -> Timestamp {
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
    /// Someone else does (or won this round); `None` when unknown (a conflict).
    Standby(Option<String>),
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
        metrics::describe_gauge!(up::METRIC_MASTER_STATUS, up::METRIC_MASTER_STATUS_HELP);
        metrics::describe_counter!(up::METRIC_SLOWPATH_TOTAL, up::METRIC_SLOWPATH_TOTAL_HELP);
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
    /// [`up::HEALTH_CHECK_NAME`]): 200 `ok` when not leading or when the last
    /// successful renewal is at most lease duration + 20 s old; else 500 with
    /// upstream's text.
    pub fn health_check(&self) -> Arc<dyn HealthCheck> {
        Arc::new(LeaderHealth(self.inner.clone()))
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
    /// Err(LeaderError::Lost{..}) if leadership was lost (the caller exits
    /// 1, like upstream).
    ///
    /// On shutdown, `lead` must return soon after its token is cancelled: the
    /// Lease is renewed until it does, and released after. On loss, the token
    /// is cancelled and the `lead` future is dropped at once, not awaited (no
    /// more work under a lease that another candidate may hold): tasks it
    /// spawned must watch the token.
    pub async fn run<F, Fut>(&self, shutdown: CancellationToken, lead: F) -> Result<(), LeaderError>
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
        let lead_fut = std::pin::pin!(lead(lead_token.clone()));
        let renewing = std::pin::pin!(self.keep_renewing());
        let lost = tokio::select! {
            () = lead_fut => None,
            reason = renewing => Some(reason),
        };
        match lost {
            Some(reason) => {
                lead_token.cancel();
                self.set_leading(false);
                self.inner.lock().mine = None;
                tracing::error!(lease, %reason, "Stopped leading");
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
        metrics::gauge!(up::METRIC_MASTER_STATUS, up::LABEL_NAME => name).set(if leading { 1.0 } else { 0.0 });
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
            match attempt {
                Ok(Ok(Attempt::Leading)) => return true,
                Ok(Ok(Attempt::Standby(holder))) => {
                    tracing::debug!(lease, holder = holder.as_deref().unwrap_or("?"), "lease is held by another")
                }
                Ok(Ok(Attempt::Lost(_))) => {}
                Ok(Err(e)) => tracing::warn!(lease, error = %e, "error acquiring leader lease"),
                Err(_) => tracing::warn!(lease, "acquiring the leader lease timed out"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(jittered(cfg.retry_period)) => {}
            }
        }
    }

    /// Renews every retry period; returns when leadership is lost.
    async fn keep_renewing(&self) -> LostReason {
        let cfg = &self.inner.config;
        let lease = self.inner.lease_ref.as_str();
        loop {
            tokio::time::sleep(cfg.retry_period).await;
            let deadline = tokio::time::Instant::now() + cfg.renew_deadline;
            let mut last_error = None;
            loop {
                let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                if remaining.is_zero() {
                    return LostReason::RenewDeadline { last_error };
                }
                match tokio::time::timeout(remaining, self.try_acquire_or_renew(true)).await {
                    Ok(Ok(Attempt::Leading)) => break,
                    Ok(Ok(Attempt::Lost(holder))) => return LostReason::HeldByOther { holder },
                    Ok(Ok(Attempt::Standby(_))) => last_error = Some("conflicting update of the lease".to_string()),
                    Ok(Err(e)) => {
                        tracing::warn!(lease, error = %e, "error renewing leader lease");
                        last_error = Some(e.to_string());
                    }
                    Err(_) => return LostReason::RenewDeadline { last_error },
                }
                tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + cfg.retry_period)).await;
            }
        }
    }

    /// One round of client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&self, renewing: bool) -> Result<Attempt, ::kube::Error> {
        let cfg = &self.inner.config;
        let inner = &self.inner;
        if renewing {
            if let Some(attempt) = self.fast_renew().await {
                return Ok(attempt);
            }
            let name = cfg.lease_name.clone();
            metrics::counter!(up::METRIC_SLOWPATH_TOTAL, up::LABEL_NAME => name).increment(1);
        }
        let current = inner.api.get_opt(&cfg.lease_name).await?;
        let (now, wall) = (Instant::now(), wall_now());
        let Some(current) = current else {
            let Decision::Create(spec) = decide(None, now, wall, &cfg.identity, cfg) else {
                return Ok(Attempt::Standby(None));
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
                Err(::kube::Error::Api(s)) if s.is_already_exists() => Ok(Attempt::Standby(None)),
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
            Decision::Wait { holder, .. } => return Ok(Attempt::Standby(Some(holder))),
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
    async fn write(&self, lease: Lease, spec: LeaseSpec) -> Result<Attempt, ::kube::Error> {
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
            Err(::kube::Error::Api(s)) if s.is_conflict() => Ok(Attempt::Standby(None)),
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
        if let Ok(Err(::kube::Error::Api(e))) = &result
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
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "me";
    const OTHER: &str = "other";

    fn cfg() -> LeaderElectionConfig {
        LeaderElectionConfig::new("lease", "ns", ME)
    }

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn t(secs: i64) -> Option<MicroTime> {
        Some(MicroTime(ts(secs)))
    }

    fn spec(holder: Option<&str>, duration: i32, renew: i64, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(String::from),
            lease_duration_seconds: Some(duration),
            acquire_time: t(0),
            renew_time: t(renew),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn sanitizes_like_upstream() {
        let cases = [
            ("hostpath.csi.k8s.io", "hostpath-csi-k8s-io"),
            ("external-attacher-leader-hostpath.csi.k8s.io", "external-attacher-leader-hostpath-csi-k8s-io"),
            ("a/b-", "a-b-X"),
            ("a.", "a-X"),
            ("Node_1", "Node-1"),
            ("plain-name", "plain-name"),
            ("ü", "-X"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(sanitize_lease_name(input), want, "{input:?}");
        }
    }

    #[test]
    fn config_sanitizes_and_uses_upstream_defaults() {
        let c = LeaderElectionConfig::new("hostpath.csi.k8s.io", "kube-system", "node.1");
        assert_eq!(c.lease_name, "hostpath-csi-k8s-io");
        assert_eq!(c.identity, "node-1");
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (Duration::from_secs(15), Duration::from_secs(10), Duration::from_secs(5))
        );
        assert!(c.validate().is_ok());
    }

    #[test]
    fn validation_follows_client_go() {
        let with = |f: fn(&mut LeaderElectionConfig)| {
            let mut c = cfg();
            f(&mut c);
            c.validate().is_ok()
        };
        assert!(!with(|c| c.renew_deadline = c.lease_duration));
        // renew deadline must exceed 1.2 × retry period: 10 s vs 8.4 s is fine, 6 s is not.
        assert!(with(|c| c.retry_period = Duration::from_secs(7)));
        assert!(!with(|c| c.retry_period = Duration::from_secs(9)));
        assert!(!with(|c| c.lease_duration = Duration::from_millis(500)));
        assert!(!with(|c| c.retry_period = Duration::ZERO));
        assert!(!with(|c| c.identity.clear()));
        assert!(!with(|c| c.lease_name.clear()));
    }

    #[test]
    fn namespace_resolution_order() {
        let cases = [
            ((Some("flag"), Some("env"), Some("file")), "flag"),
            ((Some(""), Some("env"), Some("file")), "env"),
            ((None, Some(""), Some(" file\n")), "file"),
            ((None, None, Some("  \n")), "default"),
            ((None, None, None), "default"),
        ];
        for ((flag, env, file), want) in cases {
            assert_eq!(choose_namespace(flag, env, file), want, "{flag:?} {env:?} {file:?}");
        }
    }

    #[test]
    fn observation_restarts_only_when_the_record_changes() {
        let t0 = Instant::now();
        let s = spec(Some(OTHER), 15, 0, 0);
        let first = observe(None, &s, t0);
        assert_eq!(first.at, t0);
        let same = observe(Some(first.clone()), &s, t0 + Duration::from_secs(9));
        assert_eq!(same.at, t0, "unchanged record keeps the first observation time");
        let renewed = spec(Some(OTHER), 15, 9, 0);
        let changed = observe(Some(same), &renewed, t0 + Duration::from_secs(10));
        assert_eq!(changed.at, t0 + Duration::from_secs(10));
        assert_eq!(changed.spec, renewed);
    }

    /// One row: the Lease as observed `ago` seconds before now (None: absent)
    /// → the expected decision.
    #[test]
    fn decision_table() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(100);
        let wall = ts(1000);
        let at = |ago_ms: u64| now - Duration::from_millis(ago_ms);
        let mine_new = |transitions: i32| LeaseSpec {
            holder_identity: Some(ME.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(wall)),
            renew_time: Some(MicroTime(wall)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        };
        let expired = |h: &str| TakeOver::Expired { holder: h.to_string() };
        let cases: Vec<(&str, Option<Observed>, Decision)> = vec![
            ("no lease: create it, 0 transitions", None, Decision::Create(mine_new(0))),
            (
                "holder unset: released, take over",
                Some(Observed { spec: spec(None, 1, 50, 3), at: at(0) }),
                Decision::TakeOver { reason: TakeOver::Released, spec: mine_new(4) },
            ),
            (
                "holder empty string: released (client-go's ReleaseOnCancel)",
                Some(Observed { spec: spec(Some(""), 1, 50, 3), at: at(0) }),
                Decision::TakeOver { reason: TakeOver::Released, spec: mine_new(4) },
            ),
            (
                "someone else's, observed 1 s ago: wait 14 s",
                Some(Observed { spec: spec(Some(OTHER), 15, 99, 2), at: at(1_000) }),
                Decision::Wait { holder: OTHER.into(), expires_in: Duration::from_secs(14) },
            ),
            (
                "someone else's, renewTime ancient by their clock, but just observed: wait (clock skew)",
                Some(Observed { spec: spec(Some(OTHER), 15, -100_000, 2), at: at(0) }),
                Decision::Wait { holder: OTHER.into(), expires_in: Duration::from_secs(15) },
            ),
            (
                "someone else's, renewTime in our future, unchanged for 16 s: expired (clock skew)",
                Some(Observed { spec: spec(Some(OTHER), 15, 100_000, 2), at: at(16_000) }),
                Decision::TakeOver { reason: expired(OTHER), spec: mine_new(3) },
            ),
            (
                "someone else's, unchanged exactly the lease duration: still valid",
                Some(Observed { spec: spec(Some(OTHER), 15, 99, 2), at: at(15_000) }),
                Decision::Wait { holder: OTHER.into(), expires_in: Duration::ZERO },
            ),
            (
                "someone else's, unchanged 1 ms past the lease duration: expired, transitions + 1",
                Some(Observed { spec: spec(Some(OTHER), 15, 99, 2), at: at(15_001) }),
                Decision::TakeOver { reason: expired(OTHER), spec: mine_new(3) },
            ),
            (
                "the holder's own duration counts, not ours: 60 s, 20 s ago: wait",
                Some(Observed { spec: spec(Some(OTHER), 60, 80, 0), at: at(20_000) }),
                Decision::Wait { holder: OTHER.into(), expires_in: Duration::from_secs(40) },
            ),
            (
                "no duration written: expired as soon as time passes",
                Some(Observed {
                    spec: LeaseSpec { lease_duration_seconds: None, ..spec(Some(OTHER), 0, 99, 0) },
                    at: at(1),
                }),
                Decision::TakeOver { reason: expired(OTHER), spec: mine_new(1) },
            ),
            (
                "mine: renew, keeping acquireTime and transitions",
                Some(Observed { spec: spec(Some(ME), 15, 95, 7), at: at(5_000) }),
                Decision::Renew(LeaseSpec { acquire_time: t(0), lease_transitions: Some(7), ..mine_new(0) }),
            ),
            (
                "mine even though expired (e.g. restarted with the same pod name): renew",
                Some(Observed { spec: spec(Some(ME), 15, 0, 7), at: at(60_000) }),
                Decision::Renew(LeaseSpec { acquire_time: t(0), lease_transitions: Some(7), ..mine_new(0) }),
            ),
            (
                "mine with another duration: renewed with ours",
                Some(Observed { spec: spec(Some(ME), 30, 95, 1), at: at(0) }),
                Decision::Renew(LeaseSpec { acquire_time: t(0), lease_transitions: Some(1), ..mine_new(0) }),
            ),
        ];
        for (name, lease, want) in cases {
            assert_eq!(decide(lease.as_ref(), now, wall, ME, &cfg()), want, "{name}");
        }
    }

    #[test]
    fn take_over_keeps_fields_we_do_not_own() {
        let now = Instant::now() + Duration::from_secs(100);
        let old = LeaseSpec {
            strategy: Some("OldestEmulationVersion".into()),
            preferred_holder: Some("p".into()),
            ..spec(None, 15, 0, 0)
        };
        let Decision::TakeOver { spec, .. } = decide(Some(&Observed { spec: old, at: now }), now, ts(5), ME, &cfg())
        else {
            panic!("expected a take-over");
        };
        assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
        assert_eq!(spec.preferred_holder.as_deref(), Some("p"));
    }

    #[test]
    fn release_empties_the_holder_and_keeps_transitions() {
        let r = released(&spec(Some(ME), 15, 10, 4), ts(20));
        assert_eq!(r.holder_identity.as_deref(), Some(""));
        assert_eq!(r.lease_duration_seconds, Some(1));
        assert_eq!(r.lease_transitions, Some(4));
        assert_eq!((r.acquire_time, r.renew_time), (t(20), t(20)));
        // A candidate that reads it takes over at once, counting a transition.
        let now = Instant::now();
        let d = decide(
            Some(&Observed { spec: released(&spec(Some(OTHER), 15, 10, 4), ts(20)), at: now }),
            now,
            ts(21),
            ME,
            &cfg(),
        );
        assert!(
            matches!(d, Decision::TakeOver { reason: TakeOver::Released, spec } if spec.lease_transitions == Some(5))
        );
    }

    #[test]
    fn health_check_semantics() {
        let t0 = Instant::now();
        let lease = Duration::from_secs(15);
        let ok = HealthReport::ok();
        let failed = HealthReport::failed(
            500,
            "internal server error: failed election to renew leadership on lease external-attacher-leader-x",
        );
        let name = "external-attacher-leader-x";
        let cases = [
            ("standby", false, Some(t0), t0 + Duration::from_secs(3600), &ok),
            ("never renewed", true, None, t0 + Duration::from_secs(3600), &ok),
            ("fresh", true, Some(t0), t0 + Duration::from_secs(5), &ok),
            ("exactly lease duration + 20 s", true, Some(t0), t0 + Duration::from_secs(35), &ok),
            ("just past it", true, Some(t0), t0 + Duration::from_millis(35_001), &failed),
        ];
        for (what, leading, last, now, want) in cases {
            assert_eq!(&leader_health(leading, last, now, lease, name), want, "{what}");
        }
    }

    #[test]
    fn jitter_stays_within_client_go_bounds() {
        let base = Duration::from_secs(5);
        let samples: Vec<_> = (0..200).map(|_| jittered(base)).collect();
        assert!(samples.iter().all(|d| *d >= base && *d < base.mul_f64(2.2)));
        assert!(samples.iter().any(|d| *d != samples[0]), "jitter varies");
    }

    #[test]
    fn wall_clock_has_microsecond_precision() {
        let w = wall_now();
        assert_eq!(w.subsec_nanosecond() % 1000, 0);
        assert!(w > ts(0));
    }

    #[test]
    fn lost_reasons_read_well() {
        assert_eq!(LostReason::HeldByOther { holder: "b".into() }.to_string(), "the lease is held by b");
        let e = LeaderError::Lost { lease: "ns/l".into(), reason: LostReason::RenewDeadline { last_error: None } };
        assert_eq!(e.to_string(), "leader election lost on lease ns/l: renewal did not succeed within the deadline");
    }

    /// The I/O loop against an in-memory Lease API with the apiserver's
    /// optimistic concurrency (PUT with a stale resourceVersion → 409,
    /// POST of an existing name → 409 AlreadyExists). Short timings: lease
    /// 2 s, renew deadline 1 s, retry period 200 ms.
    mod io {
        use std::{
            convert::Infallible,
            sync::atomic::{AtomicBool, AtomicU64},
        };

        use axum::http::{Method, Request, Response};
        use k8s_openapi::serde_json::{self, json};

        use super::*;

        const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

        #[derive(Default)]
        struct FakeApi {
            lease: Mutex<Option<Lease>>,
            rv: AtomicU64,
            /// Every request fails with 500 (an unreachable apiserver).
            down: AtomicBool,
            gets: AtomicU64,
            puts: AtomicU64,
        }

        fn status(code: u16, reason: &str) -> (u16, String) {
            let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                "code": code, "message": reason});
            (code, body.to_string())
        }

        impl FakeApi {
            fn store(&self, mut lease: Lease) -> String {
                let rv = self.rv.fetch_add(1, Ordering::SeqCst) + 1;
                lease.metadata.resource_version = Some(rv.to_string());
                let text = serde_json::to_string(&lease).unwrap();
                *self.lease.lock().unwrap() = Some(lease);
                text
            }

            fn handle(&self, method: &Method, path: &str, body: &[u8]) -> (u16, String) {
                if self.down.load(Ordering::SeqCst) {
                    return status(500, "InternalError");
                }
                let counter = if *method == Method::GET { &self.gets } else { &self.puts };
                counter.fetch_add(1, Ordering::SeqCst);
                let current = self.lease.lock().unwrap().clone();
                let named = path == format!("{PATH}/lease");
                match (method.as_str(), named, current) {
                    ("GET", true, Some(l)) => (200, serde_json::to_string(&l).unwrap()),
                    ("GET", true, None) | ("PUT", true, None) => status(404, "NotFound"),
                    ("POST", false, Some(_)) if path == PATH => status(409, "AlreadyExists"),
                    ("POST", false, None) if path == PATH => (201, self.store(serde_json::from_slice(body).unwrap())),
                    ("PUT", true, Some(old)) => {
                        let new: Lease = serde_json::from_slice(body).unwrap();
                        if new.metadata.resource_version != old.metadata.resource_version {
                            return status(409, "Conflict");
                        }
                        (200, self.store(new))
                    }
                    _ => status(405, "MethodNotAllowed"),
                }
            }

            fn spec(&self) -> Option<LeaseSpec> {
                self.lease.lock().unwrap().clone().and_then(|l| l.spec)
            }

            fn holder(&self) -> Option<String> {
                self.spec().and_then(|s| s.holder_identity)
            }

            /// Another writer (not an elector of ours) sets the holder.
            fn write_as(&self, holder: &str) {
                let mut lease = self.lease.lock().unwrap().clone().unwrap_or_else(|| Lease {
                    metadata: ObjectMeta {
                        name: Some("lease".into()),
                        namespace: Some("ns".into()),
                        ..Default::default()
                    },
                    spec: None,
                });
                lease.spec = Some(LeaseSpec {
                    holder_identity: Some(holder.into()),
                    lease_duration_seconds: Some(2),
                    renew_time: Some(MicroTime(wall_now())),
                    ..lease.spec.unwrap_or_default()
                });
                self.store(lease);
            }
        }

        fn client(api: Arc<FakeApi>) -> Client {
            let svc = tower::service_fn(move |req: Request<::kube::client::Body>| {
                let api = api.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let bytes = body.collect_bytes().await.unwrap();
                    let (code, text) = api.handle(&parts.method, parts.uri.path(), &bytes);
                    let resp = Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(::kube::client::Body::from(text.into_bytes()))
                        .unwrap();
                    Ok::<_, Infallible>(resp)
                }
            });
            Client::new(svc, "ns")
        }

        fn elector(api: &Arc<FakeApi>, identity: &str) -> LeaderElector {
            let mut c = LeaderElectionConfig::new("lease", "ns", identity);
            c.lease_duration = Duration::from_secs(2);
            c.renew_deadline = Duration::from_secs(1);
            c.retry_period = Duration::from_millis(200);
            c.labels.insert("app".into(), "csi-sidecar".into());
            LeaderElector::new(client(api.clone()), c)
        }

        type Running = tokio::task::JoinHandle<(Result<(), LeaderError>, bool)>;

        /// Runs `e` until `shutdown`; the result says whether the token given
        /// to `lead` was cancelled by the time `run` returned.
        fn spawn(e: &LeaderElector, shutdown: &CancellationToken) -> Running {
            let (e, shutdown) = (e.clone(), shutdown.clone());
            tokio::spawn(async move {
                let given: Arc<Mutex<Option<CancellationToken>>> = Arc::default();
                let slot = given.clone();
                let r = e
                    .run(shutdown, |token| async move {
                        *slot.lock().unwrap() = Some(token.clone());
                        token.cancelled().await;
                    })
                    .await;
                let cancelled = given.lock().unwrap().as_ref().is_some_and(CancellationToken::is_cancelled);
                (r, cancelled)
            })
        }

        async fn wait_for(what: &str, limit: Duration, cond: impl Fn() -> bool) -> Duration {
            let start = Instant::now();
            while !cond() {
                assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            start.elapsed()
        }

        #[tokio::test]
        async fn one_leader_then_release_hands_over_at_once() {
            let api = Arc::new(FakeApi::default());
            let (a, b) = (elector(&api, "a"), elector(&api, "b"));
            let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
            let (run_a, run_b) = (spawn(&a, &stop_a), spawn(&b, &stop_b));
            wait_for("a leader", Duration::from_secs(3), || a.is_leader() || b.is_leader()).await;
            // Several renewals later there is still exactly one.
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(a.is_leader() ^ b.is_leader());
            let (leader, stop_leader, run_leader, other, stop_other, run_other) =
                if a.is_leader() { (a, stop_a, run_a, b, stop_b, run_b) } else { (b, stop_b, run_b, a, stop_a, run_a) };
            let spec = api.spec().unwrap();
            assert_eq!(spec.holder_identity.as_deref(), Some(leader.config().identity.as_str()));
            assert_eq!(spec.lease_duration_seconds, Some(2));
            assert_eq!(spec.lease_transitions, Some(0));
            let labels = api.lease.lock().unwrap().clone().unwrap().metadata.labels.unwrap();
            assert_eq!(labels.get("app").map(String::as_str), Some("csi-sidecar"));
            assert!(leader.health_check().check().await.is_healthy());

            stop_leader.cancel();
            let (result, lead_cancelled) = run_leader.await.unwrap();
            assert!(result.is_ok(), "{result:?}");
            assert!(lead_cancelled && !leader.is_leader());
            let took = wait_for("take-over", Duration::from_secs(2), || other.is_leader()).await;
            assert!(took < Duration::from_secs(1), "released lease taken over in {took:?}");
            let spec = api.spec().unwrap();
            assert_eq!(spec.holder_identity.as_deref(), Some(other.config().identity.as_str()));
            assert_eq!(spec.lease_transitions, Some(1));

            stop_other.cancel();
            assert!(run_other.await.unwrap().0.is_ok());
            assert_eq!(api.holder().as_deref(), Some(""), "released on shutdown");
            assert_eq!(api.spec().unwrap().lease_duration_seconds, Some(1));
        }

        #[tokio::test]
        async fn a_renewed_foreign_lease_keeps_us_standby_until_it_expires() {
            let api = Arc::new(FakeApi::default());
            api.write_as("foreign");
            let e = elector(&api, "me");
            let stop = CancellationToken::new();
            let run = spawn(&e, &stop);
            // The foreign holder renews for 3 s (longer than the 2 s lease).
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(3) {
                api.write_as("foreign");
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert!(!e.is_leader(), "took a lease that is being renewed");
            }
            // It stops renewing: we take over after ~2 s of unchanged record.
            let took = wait_for("expiry take-over", Duration::from_secs(4), || e.is_leader()).await;
            assert!(took >= Duration::from_millis(1500), "took over after only {took:?}");
            assert_eq!(api.holder().as_deref(), Some("me"));
            assert_eq!(api.spec().unwrap().lease_transitions, Some(1));
            stop.cancel();
            assert!(run.await.unwrap().0.is_ok());
        }

        #[tokio::test]
        async fn shutdown_while_standby_returns_without_leading() {
            let api = Arc::new(FakeApi::default());
            api.write_as("foreign");
            let e = elector(&api, "me");
            let stop = CancellationToken::new();
            let run = spawn(&e, &stop);
            tokio::time::sleep(Duration::from_millis(300)).await;
            stop.cancel();
            let (result, lead_ran) = run.await.unwrap();
            assert!(result.is_ok() && !lead_ran);
            assert_eq!(api.holder().as_deref(), Some("foreign"), "not ours to release");
        }

        #[tokio::test]
        async fn unreachable_apiserver_loses_leadership_within_the_renew_deadline() {
            let api = Arc::new(FakeApi::default());
            let e = elector(&api, "me");
            let run = spawn(&e, &CancellationToken::new());
            wait_for("leader", Duration::from_secs(2), || e.is_leader()).await;
            api.down.store(true, Ordering::SeqCst);
            let start = Instant::now();
            let (result, lead_cancelled) = run.await.unwrap();
            // At most one retry period until the round starts, plus the deadline.
            assert!(start.elapsed() < Duration::from_millis(1200 + 500), "{:?}", start.elapsed());
            assert!(
                matches!(&result, Err(LeaderError::Lost { reason: LostReason::RenewDeadline { .. }, .. })),
                "{result:?}"
            );
            assert!(lead_cancelled && !e.is_leader());
            assert!(e.health_check().check().await.is_healthy(), "not leading: healthy");
        }

        #[tokio::test]
        async fn another_writer_taking_the_lease_stops_us_at_once() {
            let api = Arc::new(FakeApi::default());
            let e = elector(&api, "me");
            let run = spawn(&e, &CancellationToken::new());
            wait_for("leader", Duration::from_secs(2), || e.is_leader()).await;
            api.write_as("intruder");
            let start = Instant::now();
            let (result, lead_cancelled) = run.await.unwrap();
            assert!(start.elapsed() < Duration::from_millis(500), "{:?}", start.elapsed());
            match result {
                Err(LeaderError::Lost { lease, reason: LostReason::HeldByOther { holder } }) => {
                    assert_eq!((lease.as_str(), holder.as_str()), ("ns/lease", "intruder"))
                }
                other => panic!("{other:?}"),
            }
            assert!(lead_cancelled);
            assert_eq!(api.holder().as_deref(), Some("intruder"), "a lost lease is not released");
        }

        #[tokio::test]
        async fn the_leader_renews_without_reading_first() {
            let api = Arc::new(FakeApi::default());
            let e = elector(&api, "me");
            let stop = CancellationToken::new();
            let run = spawn(&e, &stop);
            wait_for("leader", Duration::from_secs(2), || e.is_leader()).await;
            let (gets, puts) = (api.gets.load(Ordering::SeqCst), api.puts.load(Ordering::SeqCst));
            tokio::time::sleep(Duration::from_millis(1100)).await;
            assert_eq!(api.gets.load(Ordering::SeqCst), gets, "fast path: no GET while renewing");
            assert!(api.puts.load(Ordering::SeqCst) >= puts + 3, "a renewal every 200 ms");
            let renewed = api.spec().unwrap().renew_time.unwrap().0;
            assert!(wall_now().as_microsecond() - renewed.as_microsecond() < 500_000);
            stop.cancel();
            assert!(run.await.unwrap().0.is_ok());
        }

        #[tokio::test]
        async fn same_identity_after_restart_resumes_at_once() {
            let api = Arc::new(FakeApi::default());
            api.write_as("me");
            let e = elector(&api, "me");
            let stop = CancellationToken::new();
            let run = spawn(&e, &stop);
            wait_for("leader", Duration::from_millis(500), || e.is_leader()).await;
            stop.cancel();
            assert!(run.await.unwrap().0.is_ok());
        }

        #[tokio::test]
        async fn invalid_config_is_refused_before_any_call() {
            let api = Arc::new(FakeApi::default());
            let mut e = elector(&api, "me");
            Arc::get_mut(&mut e.inner).unwrap().config.renew_deadline = Duration::from_secs(5);
            let r = e.run(CancellationToken::new(), |_| async {}).await;
            assert!(matches!(r, Err(LeaderError::Config(_))), "{r:?}");
            assert!(api.lease.lock().unwrap().is_none());
        }
    }
}
