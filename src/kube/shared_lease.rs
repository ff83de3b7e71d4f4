//! One Lease for all modules of the process (`--leader-election-shared-lease`).
//!
//! One elector runs for the whole process; every led module waits for it to
//! lead and runs under the token it leads with. Losing the Lease stops every
//! module (each reports the loss, as with its own Lease); a shutdown releases
//! it once.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::leader::{LeaderElector, LeaderError};

/// Where the shared election is.
#[derive(Clone, Debug)]
pub enum LeaseState {
    /// Not leading yet.
    Waiting,
    /// Leading; the token is cancelled when leading ends.
    Leading(CancellationToken),
    /// The Lease was lost (the message says why).
    Lost(String),
    /// The elector stopped (shutdown) or failed to start leading.
    Ended(Option<String>),
}

/// A handle on the process-wide election.
#[derive(Clone)]
pub struct SharedLease {
    state: watch::Receiver<LeaseState>,
}

impl SharedLease {
    /// Starts the election task.
    pub fn start(elector: LeaderElector, shutdown: CancellationToken) -> SharedLease {
        let (tx, rx) = watch::channel(LeaseState::Waiting);
        tokio::spawn(async move {
            let leading = {
                let tx = tx.clone();
                move |token: CancellationToken| async move {
                    tx.send_replace(LeaseState::Leading(token.clone()));
                    token.cancelled().await;
                }
            };
            let end = match elector.run(shutdown, leading).await {
                Ok(()) => LeaseState::Ended(None),
                Err(e @ LeaderError::Lost { .. }) => LeaseState::Lost(e.to_string()),
                Err(e) => LeaseState::Ended(Some(e.to_string())),
            };
            tx.send_replace(end);
        });
        SharedLease { state: rx }
    }

    /// Waits until the process leads: `Ok(Some(token))` then, `Ok(None)` if
    /// the election ended first (shutdown), `Err` if it failed.
    pub async fn leading(&self) -> Result<Option<CancellationToken>, String> {
        let mut rx = self.state.clone();
        let state = rx.wait_for(|s| !matches!(s, LeaseState::Waiting)).await.map(|s| s.clone());
        match state {
            Ok(LeaseState::Leading(t)) => Ok(Some(t)),
            Ok(LeaseState::Lost(e)) | Ok(LeaseState::Ended(Some(e))) => Err(e),
            _ => Ok(None),
        }
    }

    /// After leading ended: `Err` with the reason if the Lease was lost.
    pub async fn outcome(&self) -> Result<(), String> {
        let mut rx = self.state.clone();
        let state = rx.wait_for(|s| matches!(s, LeaseState::Lost(_) | LeaseState::Ended(_))).await.map(|s| s.clone());
        match state {
            Ok(LeaseState::Lost(e)) | Ok(LeaseState::Ended(Some(e))) => Err(e),
            _ => Ok(()),
        }
    }
}
