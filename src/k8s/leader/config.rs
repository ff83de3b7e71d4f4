//! What a candidate needs to campaign, where its namespace and identity
//! come from, and how leader election fails.

use std::{collections::BTreeMap, fmt, time::Duration};

use crate::compat::{leader_election as upstream, sanitize_lease_name};

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
            lease_duration: upstream::DEFAULT_LEASE_DURATION,
            renew_deadline: upstream::DEFAULT_RENEW_DEADLINE,
            retry_period: upstream::DEFAULT_RETRY_PERIOD,
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
        if self.renew_deadline <= self.retry_period.mul_f64(upstream::JITTER_FACTOR) {
            return bad("the renew deadline must be greater than the retry period × 1.2");
        }
        Ok(())
    }

    pub(super) fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// The namespace of the Lease: the flag, else `$POD_NAMESPACE`, else the
/// service account's namespace file, else `default`.
pub fn resolve_namespace(flag: Option<&str>) -> String {
    let env = std::env::var(upstream::NAMESPACE_ENV).ok();
    let file = || std::fs::read_to_string(upstream::NAMESPACE_FILE).ok();
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
        .unwrap_or(upstream::DEFAULT_NAMESPACE)
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
        source: kube::Error,
    },
    /// The configuration is unusable.
    #[error("invalid leader election configuration: {0}")]
    Config(String),
    /// No identity could be determined.
    #[error("cannot determine the leader election identity: {0}")]
    Identity(String),
}
