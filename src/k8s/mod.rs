//! The shared Kubernetes runtime: one client per process (with its own
//! request budget), one informer cache, work queues, events, leader election.
//! Controller modules use these; none of them opens its own watch.

pub mod access;
pub mod budget;
pub mod cache;
pub mod cached;
pub mod cached_node;
pub mod client;
pub mod discovery;
pub mod events;
pub mod finalizers;
pub mod group_snapshot_api;
pub mod informers;
pub mod key;
pub mod leader;
pub mod merge_patch;
pub mod names;
pub mod own_writes;
pub mod quantity;
pub mod queue;
pub mod reference_grant;
pub mod secret_templates;
pub mod secrets;
pub mod shared_lease;
pub mod snapshot_api;
pub mod update_fallback;

use std::{collections::BTreeMap, time::Duration};

use crate::flags::SharedFlags;

/// The text of an API error as upstream writes it into objects and events
/// (Go's `err.Error()`): the apiserver's message for its refusals, never
/// kube's `Debug` form of the whole `Status`.
pub fn error_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        kube::Error::Api(s) => {
            format!("the server responded with the status code {} but did not return more information", s.code)
        }
        other => other.to_string(),
    }
}

/// Leader election settings from the shared flags.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeaderSettings {
    /// `--leader-election`.
    pub enabled: bool,
    /// `--leader-election-namespace`.
    pub namespace: Option<String>,
    /// `--leader-election-lease-duration`.
    pub lease_duration: Option<Duration>,
    /// `--leader-election-renew-deadline`.
    pub renew_deadline: Option<Duration>,
    /// `--leader-election-retry-period`.
    pub retry_period: Option<Duration>,
    /// `--leader-election-labels`.
    pub labels: BTreeMap<String, String>,
    /// `--leader-election-shared-lease`: one Lease for every module.
    pub shared_lease: Option<String>,
}

/// One module's `--kube-api-qps`/`--kube-api-burst` (its prefixed or
/// in-segment value, else the shared one; client-go's reading of 0 and
/// negative values applies).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModuleBudget {
    /// The module.
    pub module: &'static str,
    /// Requests per second.
    pub qps: f64,
    /// Burst.
    pub burst: u32,
}

/// The Kubernetes side of the host, built once when a module needs it.
#[derive(Clone)]
pub struct KubeContext {
    /// The client of this context's user: a module's own share of the
    /// process budget (see [`KubeContext::for_module`]); in the host's
    /// context, the shared services' (the informers').
    pub client: kube::Client,
    /// Client for leader election, with its own budget.
    pub leader_client: kube::Client,
    /// The shared informer cache.
    pub informers: informers::Informers,
    /// Leader election settings.
    pub leader: LeaderSettings,
    /// The Lease health of every module, served at `/healthz/leader-election`.
    pub leader_health: LeaderHealth,
    /// The process-wide election with `--leader-election-shared-lease`,
    /// started by the first module that asks.
    shared_lease: std::sync::Arc<tokio::sync::OnceCell<shared_lease::SharedLease>>,
    /// The client configuration, for a module's client with its own budget.
    config: kube::Config,
    /// The client without a budget, under the modules' budgeted clients.
    unbudgeted: kube::Client,
    /// The pooled budget and each limited module's account in it.
    budget: Option<(std::sync::Arc<budget::Budget>, Vec<&'static str>)>,
}

/// All modules' Lease health checks as one: healthy only if each is.
#[derive(Clone, Default)]
pub struct LeaderHealth {
    checks: std::sync::Arc<
        parking_lot::Mutex<std::collections::BTreeMap<String, std::sync::Arc<dyn crate::healthz::HealthCheck>>>,
    >,
}

impl LeaderHealth {
    /// Sets the check of the election `name` (a module, or the process's
    /// shared Lease); a restarted module's replaces its previous one.
    pub fn set(&self, name: &str, check: std::sync::Arc<dyn crate::healthz::HealthCheck>) {
        self.checks.lock().insert(name.to_string(), check);
    }
}

impl crate::healthz::HealthCheck for LeaderHealth {
    fn check(&self) -> futures::future::BoxFuture<'static, crate::healthz::HealthReport> {
        let checks: Vec<_> = self.checks.lock().values().cloned().collect();
        Box::pin(async move {
            let reports = futures::future::join_all(checks.iter().map(|c| c.check())).await;
            reports.into_iter().find(|r| !r.is_healthy()).unwrap_or_else(crate::healthz::HealthReport::ok)
        })
    }
}

/// The Kubernetes context could not be built.
#[derive(Debug, thiserror::Error)]
pub enum KubeContextError {
    /// Client configuration.
    #[error(transparent)]
    Client(#[from] client::ClientError),
    /// A bad flag value.
    #[error("{0}")]
    Flag(String),
}

impl KubeContext {
    /// Builds the clients from the shared flags (`master` overrides the
    /// server URL), every module with its own share of the budget;
    /// `kubeconfig_env`: `$KUBECONFIG` counts (the process runs the
    /// provisioner, which reads it upstream).
    pub async fn connect_with(
        shared: &SharedFlags,
        master: Option<&str>,
        kubeconfig_env: bool,
        budgets: &[ModuleBudget],
    ) -> Result<Self, KubeContextError> {
        let mut config = client::load_config(shared.kubeconfig.as_deref(), kubeconfig_env).await?;
        if let Some(m) = master.filter(|m| !m.is_empty()) {
            config.cluster_url =
                m.parse().map_err(|e| KubeContextError::Flag(format!("invalid --master {m:?}: {e}")))?;
        }
        let agent = client::user_agent(crate::compat::PROGRAM);
        let unbudgeted = client::with_user_agent(&client::build_unlimited(config.clone())?, &agent)?;
        let limited: Vec<(&'static str, (f64, u32))> =
            budgets.iter().filter_map(|b| Some((b.module, client::effective_budget(b.qps, b.burst)?))).collect();
        // Published in the metrics from now on, each module's series at 0.
        let budget = (!limited.is_empty())
            .then(|| (budget::Budget::named(&limited), limited.iter().map(|(m, _)| *m).collect::<Vec<_>>()));
        // The informers, shared by every module, draw on the whole budget.
        let client = match &budget {
            Some((b, _)) => budget::client(&unbudgeted, b.clone(), budget::Taker::Shared),
            None => unbudgeted.clone(),
        };
        // Leader election: a client of its own with the sum of the modules'
        // budgets (unlimited when none is limited), so renewals never wait
        // behind module work.
        let (leader_qps, leader_burst) = if limited.is_empty() {
            (-1.0, 0)
        } else {
            limited.iter().fold((0.0, 0u32), |(q, b), (_, (qps, burst))| (q + qps, b.saturating_add(*burst)))
        };
        let leader_client = client::build(config.clone(), leader_qps, leader_burst)?;
        let leader_client = client::with_user_agent(&leader_client, &agent)?;
        let labels = match shared.leader_election_labels.as_deref() {
            Some(l) => crate::flags::shared::parse_labels(l).map_err(KubeContextError::Flag)?,
            None => BTreeMap::new(),
        };
        let leader = LeaderSettings {
            enabled: shared.leader_election,
            namespace: shared.leader_election_namespace.clone().filter(|n| !n.is_empty()),
            lease_duration: shared.leader_election_lease_duration,
            renew_deadline: shared.leader_election_renew_deadline,
            retry_period: shared.leader_election_retry_period,
            labels,
            shared_lease: shared.leader_election_shared_lease.clone().filter(|n| !n.is_empty()),
        };
        Ok(KubeContext {
            informers: informers::Informers::new(client.clone()),
            client,
            leader_client,
            leader,
            leader_health: LeaderHealth::default(),
            shared_lease: std::sync::Arc::default(),
            config,
            unbudgeted,
            budget,
        })
    }

    /// This context as `module` (upstream program name `program`) sees it:
    /// its client takes tokens from its own account of the process budget
    /// (borrowing idle modules' tokens), and both clients send the module's
    /// `User-Agent` (its field manager).
    pub fn for_module(&self, module: &str, program: &str) -> Result<Self, client::ClientError> {
        let mut ctx = self.clone();
        let agent = client::user_agent(program);
        let account = self.budget.as_ref().and_then(|(b, names)| Some((b, names.iter().position(|n| *n == module)?)));
        let budgeted = match account {
            Some((b, i)) => budget::client(&self.unbudgeted, b.clone(), budget::Taker::Account(i)),
            None => self.unbudgeted.clone(),
        };
        ctx.client = client::with_user_agent(&budgeted, &agent)?;
        ctx.leader_client = client::with_user_agent(&self.leader_client, &agent)?;
        Ok(ctx)
    }

    /// Another client with its own request budget (the provisioner's
    /// CSIStorageCapacity client: `--kube-api-capacity-qps/-burst`), writing
    /// as `program` (its field manager).
    pub fn client_with_budget(&self, qps: f64, burst: u32, program: &str) -> Result<kube::Client, client::ClientError> {
        let c = client::build(self.config.clone(), qps, burst)?;
        client::with_user_agent(&c, &client::user_agent(program))
    }

    /// An elector for `lock_name` when `--leader-election` is on.
    pub fn elector(&self, lock_name: &str) -> Result<Option<leader::LeaderElector>, leader::LeaderError> {
        if !self.leader.enabled {
            return Ok(None);
        }
        self.new_elector(lock_name).map(Some)
    }

    /// An elector for `lock_name` with the `--leader-election-*` settings.
    fn new_elector(&self, lock_name: &str) -> Result<leader::LeaderElector, leader::LeaderError> {
        let mut cfg = leader::LeaderElectionConfig::resolve(lock_name, self.leader.namespace.as_deref())?;
        // Upstream uses the bare host name, so two replicas sharing a host
        // name (hostNetwork pods on one node, or processes on one machine)
        // would both lead. A per-process suffix, as kube-controller-manager
        // uses, keeps identities unique.
        cfg.identity = leader::sanitize_lease_name(&format!("{}_{}", cfg.identity, names::random_word_hex()));
        if let Some(d) = self.leader.lease_duration {
            cfg.lease_duration = d;
        }
        if let Some(d) = self.leader.renew_deadline {
            cfg.renew_deadline = d;
        }
        if let Some(d) = self.leader.retry_period {
            cfg.retry_period = d;
        }
        cfg.labels = self.leader.labels.clone();
        cfg.validate()?;
        Ok(leader::LeaderElector::new(self.leader_client.clone(), cfg))
    }
}

impl KubeContext {
    /// The process-wide election when `--leader-election-shared-lease` is
    /// set (and `--leader-election` on): one elector for all modules, started
    /// on first use and stopped by `shutdown`; each call joins it as one led
    /// module (the Lease is released only after every one has left).
    pub async fn shared_lease(
        &self,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> Result<Option<shared_lease::SharedLease>, leader::LeaderError> {
        let Some(name) = self.leader.shared_lease.as_deref().filter(|_| self.leader.enabled) else { return Ok(None) };
        let lease = self
            .shared_lease
            .get_or_try_init(|| async {
                let elector = self.new_elector(name)?;
                self.leader_health.set(name, elector.health_check());
                Ok::<_, leader::LeaderError>(shared_lease::SharedLease::start(elector, shutdown.clone()))
            })
            .await?;
        Ok(Some(lease.join()))
    }
}
