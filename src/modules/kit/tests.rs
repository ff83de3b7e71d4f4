//! The crew's workers: a panicking sync stays in its sync.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::storage::v1::VolumeAttachment;
use tokio_util::sync::CancellationToken;

use super::{Crew, Done, Reconciled};
use crate::{
    debug::{Registry, WaitingFor},
    k8s::{
        key::ObjectKey,
        queue::{Backoff, WorkQueue},
    },
};

/// A sync that panics on its first attempt is retried after its backoff
/// and finishes; the other keys are served meanwhile; the ledger files
/// the panic as the object's last error while it is owed.
#[tokio::test]
async fn a_panicking_sync_is_retried_and_the_other_keys_are_served() {
    let ledger = Registry::default().ledger("test");
    let backoff = Backoff { start: Duration::from_millis(20), max: Duration::from_millis(20) };
    let queue: WorkQueue<ObjectKey<VolumeAttachment>> =
        WorkQueue::new("test-panics", backoff).tracked(&ledger, "VolumeAttachment");
    let attempts = Arc::new(AtomicUsize::new(0));
    let others = Arc::new(AtomicUsize::new(0));
    let token = CancellationToken::new();
    let mut crew = Crew::new("test", token.clone());
    let counters = Arc::new((attempts.clone(), others.clone()));
    crew.serve(&queue, 2, &counters, |c, key: ObjectKey<VolumeAttachment>| async move {
        if key.name() == "bad" {
            if c.0.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("boom in {key}");
            }
        } else {
            c.1.fetch_add(1, Ordering::SeqCst);
        }
        Reconciled::Ok(Done::Finished)
    });
    queue.add(ObjectKey::named("bad"));
    queue.add(ObjectKey::named("good"));
    let run = tokio::spawn(crew.run());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut filed = None;
    while attempts.load(Ordering::SeqCst) < 2 && tokio::time::Instant::now() < deadline {
        if filed.is_none() {
            filed = ledger.entries().into_iter().find(|((_, k), _)| k == "bad").map(|(_, e)| e);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "retried after the panic");
    assert_eq!(others.load(Ordering::SeqCst), 1, "the other key was served");
    let filed = filed.expect("the panicked object was filed while owed");
    assert_eq!(filed.waiting_for, WaitingFor::Retry);
    assert_eq!(filed.last_error.as_deref(), Some("panicked: boom in bad"));
    let done = async {
        while !ledger.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), done).await.expect("done once the retry succeeded");
    token.cancel();
    run.await.expect("the crew stops");
}
