//! What a change of a bound claim does to the resize queue and to what the
//! resizer keeps about the claim.

use parking_lot::Mutex;
use std::{collections::HashSet, sync::Arc};

use super::decide;
use crate::kube::{cached::CachedPvc, informers::Change, queue::WorkQueue};

/// Claims (by UID) whose expansion failed with FailedPrecondition while a
/// pod used them; shared by the workers and the claim handler.
pub(super) type InUseErrors = Arc<Mutex<HashSet<String>>>;

/// The resize queue's claim handler: a claim that needs a sync is queued;
/// a deleted one leaves the queue's backoff and the in-use errors.
pub(super) fn resize_claim_changed(
    change: &Change<'_, CachedPvc>,
    queue: &WorkQueue<String>,
    recover: bool,
    in_use_errors: &InUseErrors,
) {
    let key = decide::claim_key(&change.object().metadata);
    match change {
        Change::Deleted(c) => {
            queue.forget(&key);
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
    use crate::kube::queue::Backoff;

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
        assert_eq!(q.take_ready().await, vec!["ns/data".to_string()]);
        assert_eq!(in_use.lock().len(), 2, "a live claim keeps its entry");
        resize_claim_changed(&Change::Deleted(&c), &q, false, &in_use);
        assert!(q.take_ready().await.is_empty());
        assert_eq!(*in_use.lock(), HashSet::from(["uid-2".to_string()]), "only the deleted claim's UID goes");
    }
}
