//! What a change of a bound claim does to the resize queue and to what the
//! resizer keeps about the claim.

use parking_lot::Mutex;
use std::{collections::HashSet, sync::Arc};

use super::ClaimKey;
use super::decide;
use crate::k8s::{cached::CachedPvc, informers::Change, queue::WorkQueue};

/// Claims (by UID) whose expansion failed with FailedPrecondition while a
/// pod used them; shared by the workers and the claim handler.
pub(super) type InUseErrors = Arc<Mutex<HashSet<String>>>;

/// The resize queue's claim handler: a claim that needs a sync is queued;
/// a deleted one leaves the queue's backoff, `/debug/objects` and the
/// in-use errors.
pub(super) fn resize_claim_changed(
    change: &Change<'_, CachedPvc>,
    queue: &WorkQueue<ClaimKey>,
    recover: bool,
    in_use_errors: &InUseErrors,
) {
    let key = ClaimKey::of(&change.object().metadata);
    match change {
        Change::Deleted(c) => {
            queue.forget(&key);
            // Gone: this queue's ledger entry goes too.
            queue.untrack(&key);
            if let Some(uid) = &c.metadata.uid {
                in_use_errors.lock().remove(uid);
            }
        }
        Change::Updated { old, new } if !decide::update_needs_sync(old, new, recover) => {}
        _ => queue.add(key),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::k8s::queue::Backoff;

    fn claim(uid: &str) -> CachedPvc {
        let mut c = CachedPvc::default();
        c.metadata.namespace = Some("ns".into());
        c.metadata.name = Some("data".into());
        c.metadata.uid = Some(uid.into());
        c
    }

    /// A claim whose expansion met an in-use error and that is then deleted
    /// is forgotten: the set holds live claims only.
    #[tokio::test]
    async fn a_deleted_claim_leaves_the_in_use_errors() {
        let q =
            WorkQueue::new("test-resize", Backoff { start: Duration::from_millis(1), max: Duration::from_millis(9) });
        let in_use = InUseErrors::default();
        in_use.lock().extend(["uid-1".to_string(), "uid-2".to_string()]);
        let c = claim("uid-1");
        resize_claim_changed(&Change::Added(&c), &q, false, &in_use);
        assert_eq!(q.take_ready().await, vec![ClaimKey::namespaced("ns", "data")]);
        assert_eq!(in_use.lock().len(), 2, "a live claim keeps its entry");
        resize_claim_changed(&Change::Deleted(&c), &q, false, &in_use);
        assert!(q.take_ready().await.is_empty());
        assert_eq!(*in_use.lock(), HashSet::from(["uid-2".to_string()]), "only the deleted claim's UID goes");
    }

    /// A deleted claim loses the resize queue's entry in `/debug/objects`,
    /// whatever it was waiting for (an entry done but waiting would
    /// otherwise stay); the modify queue's is its own handler's to drop.
    #[tokio::test]
    async fn a_deleted_claim_leaves_the_ledger() {
        use crate::debug::{Finish, Registry, WaitingFor};
        let ledger = Registry::default().ledger("resizer");
        let backoff = Backoff { start: Duration::from_millis(1), max: Duration::from_millis(9) };
        let q = WorkQueue::new("test-resize", backoff).tracked(&ledger, "PersistentVolumeClaim");
        for (queue, w) in [("test-resize", WaitingFor::Driver), ("test-modify", WaitingFor::Class)] {
            let scope = ledger.scope(queue, "PersistentVolumeClaim", "ns/data".into());
            scope.run(async { crate::debug::waiting_for(w) }).await;
            scope.finish(Finish::Done);
        }
        assert_eq!(ledger.len(), 2);
        let c = claim("uid-1");
        resize_claim_changed(&Change::Resync(&c), &q, false, &InUseErrors::default());
        assert_eq!(ledger.len(), 2, "a live claim keeps its entries");
        resize_claim_changed(&Change::Deleted(&c), &q, false, &InUseErrors::default());
        let left: Vec<_> = ledger.entries().into_iter().map(|(_, e)| e.queue).collect();
        assert_eq!(left, ["test-modify"], "the modify queue's handler drops its own");
    }
}
