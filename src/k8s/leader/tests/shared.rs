//! The process's shared Lease ([`SharedLease`]) against [`FakeApi`], on
//! tokio's paused clock.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::fake_api::{FakeApi, elector, wait_for};
use crate::k8s::shared_lease::SharedLease;

/// The shared Lease lost: every module's token is cancelled at once, and
/// the election campaigns again (the process does not end): once the other
/// holder's Lease expired, each module waiting gets the new term's token.
/// On shutdown the Lease is released after every module left.
#[tokio::test(start_paused = true)]
async fn a_lost_shared_lease_ends_the_term_and_the_election_campaigns_again() {
    let api = Arc::new(FakeApi::default());
    let shutdown = CancellationToken::new();
    let shared = SharedLease::start(elector(&api, "me"), shutdown.clone());
    let (a, b) = (shared.join(), shared.join());
    let first_a = a.leading().await.expect("election").expect("leading");
    let first_b = b.leading().await.expect("election").expect("leading");
    api.write_as("intruder");
    wait_for("the term to end", Duration::from_secs(2), || first_a.is_cancelled() && first_b.is_cancelled()).await;
    // The intruder does not renew: its 2 s Lease expires and we lead again.
    let second = tokio::time::timeout(Duration::from_secs(10), a.leading())
        .await
        .expect("a new term")
        .expect("election")
        .expect("leading");
    assert!(!second.is_cancelled());
    assert_eq!(api.holder().as_deref(), Some("me"));
    shutdown.cancel();
    drop(b);
    assert_eq!(a.outcome().await, Ok(()));
    assert_eq!(api.holder().as_deref(), Some(""), "released once both modules left");
}
