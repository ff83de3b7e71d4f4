//! One Lease for all modules of the process (`--leader-election-shared-lease`).
//!
//! One elector runs for the whole process; every led module joins it
//! ([`SharedLease::join`]), waits for it to lead and runs under the token it
//! leads with. Losing the Lease cancels that token for every module at once:
//! each drains its work in hand and is restarted by the host, while the
//! elector campaigns again (the process does not exit). A shutdown cancels
//! the token but keeps renewing the Lease until every module that joined
//! has left, that is until all their workers returned, and only then
//! releases it once: a standby must not start CSI calls while ours are
//! still in flight.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::leader::{LeaderElector, LeaderError};

/// Where the shared election is.
#[derive(Clone, Debug)]
pub enum LeaseState {
    /// Not leading (yet, or again after a loss).
    Waiting,
    /// Leading; the token is cancelled when this term ends.
    Leading(CancellationToken),
    /// The elector stopped (shutdown, after the release) or failed to start
    /// leading.
    Ended(Option<String>),
}

/// A handle on the process-wide election. The handle [`SharedLease::start`]
/// returns only observes; each handle from [`SharedLease::join`] is one led
/// module, which holds the Lease on shutdown until it is dropped or calls
/// [`SharedLease::outcome`].
pub struct SharedLease {
    state: watch::Receiver<LeaseState>,
    /// How many modules have joined and not left yet.
    members: std::sync::Arc<watch::Sender<usize>>,
    /// Whether this handle is counted in `members`.
    member: bool,
    /// The election (for what `/debug/objects` shows of it).
    elector: LeaderElector,
    /// The process's shutdown.
    shutdown: CancellationToken,
}

impl SharedLease {
    /// Starts the election task; it campaigns again after each loss, and
    /// stops when `shutdown` fires and every member has left.
    pub fn start(elector: LeaderElector, shutdown: CancellationToken) -> SharedLease {
        let (tx, rx) = watch::channel(LeaseState::Waiting);
        let observed = elector.clone();
        let members = std::sync::Arc::new(watch::channel(0usize).0);
        let remaining = members.subscribe();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let end = loop {
                let leading = {
                    let (tx, mut remaining, shutdown) = (tx.clone(), remaining.clone(), shutdown.clone());
                    move |token: CancellationToken| async move {
                        tx.send_replace(LeaseState::Leading(token.clone()));
                        token.cancelled().await;
                        // Shutdown: renew (the elector keeps doing that while
                        // this runs) until every module's workers have
                        // returned. The sender lives in every handle, so this
                        // cannot fail while one exists; if none does, nobody
                        // is left to wait for. A loss: each module drains its
                        // own work (the Lease is no longer ours to renew).
                        if shutdown.is_cancelled() {
                            let _ = remaining.wait_for(|n| *n == 0).await;
                        }
                    }
                };
                match elector.run(shutdown.clone(), std::time::Duration::ZERO, leading).await {
                    Ok(()) => break LeaseState::Ended(None),
                    Err(LeaderError::Lost { .. }) => {
                        tx.send_replace(LeaseState::Waiting);
                    }
                    Err(e) => break LeaseState::Ended(Some(e.to_string())),
                }
            };
            tx.send_replace(end);
        });
        SharedLease { state: rx, members, member: false, elector: observed, shutdown: stop }
    }

    /// The election behind this handle.
    pub fn elector(&self) -> &LeaderElector {
        &self.elector
    }

    /// A handle for one led module: until it is dropped (or
    /// [`outcome`](Self::outcome) is called), a shutdown does not release
    /// the Lease.
    pub fn join(&self) -> SharedLease {
        self.members.send_modify(|n| *n += 1);
        SharedLease {
            state: self.state.clone(),
            members: self.members.clone(),
            member: true,
            elector: self.elector.clone(),
            shutdown: self.shutdown.clone(),
        }
    }

    /// Waits until the process leads (a term not yet over):
    /// `Ok(Some(token))` then, `Ok(None)` if the process shuts down or the
    /// election ended first, `Err` if it failed.
    pub async fn leading(&self) -> Result<Option<CancellationToken>, String> {
        let mut rx = self.state.clone();
        let current = |s: &LeaseState| match s {
            LeaseState::Waiting => false,
            LeaseState::Leading(t) => !t.is_cancelled(),
            LeaseState::Ended(_) => true,
        };
        let state = tokio::select! {
            () = self.shutdown.cancelled() => return Ok(None),
            s = rx.wait_for(current) => s.map(|s| s.clone()),
        };
        match state {
            Ok(LeaseState::Leading(t)) => Ok(Some(t)),
            Ok(LeaseState::Ended(Some(e))) => Err(e),
            _ => Ok(None),
        }
    }

    /// After this module's leading ended on shutdown (its workers
    /// returned): leaves the election, then waits until the elector stopped,
    /// that is after the last module left and the Lease was released; `Err`
    /// if the election failed.
    pub async fn outcome(mut self) -> Result<(), String> {
        self.leave();
        let mut rx = self.state.clone();
        let state = rx.wait_for(|s| matches!(s, LeaseState::Ended(_))).await.map(|s| s.clone());
        match state {
            Ok(LeaseState::Ended(Some(e))) => Err(e),
            _ => Ok(()),
        }
    }

    /// Stops counting this handle as a led module.
    fn leave(&mut self) {
        if std::mem::take(&mut self.member) {
            self.members.send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}

impl Drop for SharedLease {
    fn drop(&mut self) {
        self.leave();
    }
}
