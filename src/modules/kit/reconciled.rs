//! What a reconcile returns, and the one error policy that turns it into
//! the queue's next step and the object's `/debug/objects` entry (pure).
//!
//! A reconcile either finishes the object ([`Done`]) or stops short of it
//! ([`Wait`]): every stop says what the object waits for, so a retry can
//! never lose its reason (invariant 15 is this return type).

use std::time::Duration;

use crate::{debug::WaitingFor, k8s::queue::Outcome};

/// The result of one reconcile of one object.
pub type Reconciled = Result<Done, Wait>;

/// The object needs nothing more until its next event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// Finished: its backoff is reset and its entry leaves the ledger.
    Finished,
    /// Nothing to do now, and something outside this module must happen
    /// first (an event brings the object back): the entry stays with this
    /// reason, no retry is scheduled.
    Parked(WaitingFor),
}

/// The reconcile stopped short: retried later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    /// What the object waits for.
    pub waiting_for: WaitingFor,
    /// The error that stopped it (an event's or a status's text), if any.
    pub error: Option<String>,
    /// When to try again.
    pub retry: Retry,
}

/// When a stopped object is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// After the key's next backoff delay.
    Backoff,
    /// After exactly this delay (the backoff count is kept).
    After(Duration),
}

impl Wait {
    /// Retry after the backoff, waiting for `waiting_for`, no error.
    pub fn on(waiting_for: WaitingFor) -> Self {
        Wait { waiting_for, error: None, retry: Retry::Backoff }
    }

    /// Retry after the backoff: `error` stopped the object, which waits for
    /// `waiting_for`.
    pub fn failed(waiting_for: WaitingFor, error: impl Into<String>) -> Self {
        Wait { waiting_for, error: Some(error.into()), retry: Retry::Backoff }
    }

    /// This wait, retried after exactly `delay` instead of the backoff.
    pub fn after(self, delay: Duration) -> Self {
        Wait { retry: Retry::After(delay), ..self }
    }
}

/// What the kit does with a reconcile's result: the queue's outcome, and
/// the notes filed for the object (what it waits for, its error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled<'a> {
    /// The queue's next step for the key.
    pub outcome: Outcome,
    /// Filed as the entry's `waiting_for`.
    pub waiting_for: Option<WaitingFor>,
    /// Filed as the entry's last error.
    pub error: Option<&'a str>,
}

/// The error policy (pure).
pub fn settle(result: &Reconciled) -> Settled<'_> {
    match result {
        Ok(Done::Finished) => Settled { outcome: Outcome::Done, waiting_for: None, error: None },
        Ok(Done::Parked(w)) => Settled { outcome: Outcome::Done, waiting_for: Some(*w), error: None },
        Err(wait) => Settled {
            outcome: match wait.retry {
                Retry::Backoff => Outcome::Retry,
                Retry::After(d) => Outcome::RetryAfter(d),
            },
            waiting_for: Some(wait.waiting_for),
            error: wait.error.as_deref(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Done, Settled, Wait, settle};
    use crate::{debug::WaitingFor, k8s::queue::Outcome};

    #[test]
    fn each_result_settles_to_one_queue_step_and_its_notes() {
        let table: Vec<(super::Reconciled, Settled<'static>)> = vec![
            (Ok(Done::Finished), Settled { outcome: Outcome::Done, waiting_for: None, error: None }),
            (
                Ok(Done::Parked(WaitingFor::Dependent)),
                Settled { outcome: Outcome::Done, waiting_for: Some(WaitingFor::Dependent), error: None },
            ),
            (
                Err(Wait::on(WaitingFor::Node)),
                Settled { outcome: Outcome::Retry, waiting_for: Some(WaitingFor::Node), error: None },
            ),
            (
                Err(Wait::failed(WaitingFor::Driver, "rpc error: code = Internal desc = boom")),
                Settled {
                    outcome: Outcome::Retry,
                    waiting_for: Some(WaitingFor::Driver),
                    error: Some("rpc error: code = Internal desc = boom"),
                },
            ),
            (
                Err(Wait::on(WaitingFor::ApiServer).after(Duration::from_secs(3))),
                Settled {
                    outcome: Outcome::RetryAfter(Duration::from_secs(3)),
                    waiting_for: Some(WaitingFor::ApiServer),
                    error: None,
                },
            ),
        ];
        for (result, want) in &table {
            assert_eq!(&settle(result), want, "{result:?}");
        }
    }
}
