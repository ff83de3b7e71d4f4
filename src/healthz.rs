//! What a health check answers ([`HealthReport`]) and the trait a check
//! implements ([`HealthCheck`]): the leaf that the HTTP server serving
//! `/healthz` and the runtime parts registering checks (the Lease elector)
//! both import, so neither imports the other.

use futures::future::BoxFuture;

use crate::compat;

/// The answer of one health check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthReport {
    /// HTTP status code.
    pub status: u16,
    /// Response body.
    pub body: String,
}

impl HealthReport {
    /// 200 `ok`.
    pub fn ok() -> Self {
        HealthReport { status: 200, body: compat::prober::BODY_OK.to_string() }
    }

    /// A failed check.
    pub fn failed(status: u16, body: impl Into<String>) -> Self {
        HealthReport { status, body: body.into() }
    }

    /// Whether this is a 2xx answer.
    pub fn is_healthy(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// A named health check registered by a module.
pub trait HealthCheck: Send + Sync + 'static {
    /// Runs the check.
    fn check(&self) -> BoxFuture<'static, HealthReport>;
}
