//! The ListVolumes reconciler: attachments whose `status.attached`
//! disagrees with the volumes the driver reports published are synced
//! again (forced) or detached again.

use std::collections::HashMap;

use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

use super::{Attacher, VaKey, decide};
use crate::{compat, csi::proto::csi::v1 as csi, k8s::queue::WorkQueue};

impl Attacher {
    /// The driver's answer to a whole ListVolumes pass: volume handle →
    /// published node IDs. `None` if the pass did not complete: an error,
    /// shutdown, or `--timeout` for the whole pass (as upstream's one
    /// context), so a driver that never stops returning `next_token` cannot
    /// hold the reconciler (or shutdown). A partial answer is never used:
    /// a volume missing from it would read as unpublished.
    async fn list_published(&self, shutdown: &CancellationToken) -> Option<HashMap<String, Vec<String>>> {
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let mut published: HashMap<String, Vec<String>> = HashMap::new();
        let mut token = String::new();
        let mut pages = 0u64;
        let out_of_time = |pages: u64| {
            tracing::warn!(pages, timeout = ?self.cfg.timeout, "ListVolumes pass did not finish within --timeout; reconcile skipped");
            None
        };
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return out_of_time(pages);
            }
            let req = csi::ListVolumesRequest { max_entries: self.cfg.max_entries, starting_token: token.clone() };
            let call = self.csi.list_volumes(left, req);
            let resp = tokio::select! {
                _ = shutdown.cancelled() => return None,
                r = call => r,
            };
            let resp = match resp {
                Ok(r) => r,
                // Each call's deadline is the pass's: the pass ran out.
                Err(s) if s.code() == tonic::Code::DeadlineExceeded => return out_of_time(pages),
                Err(s) => {
                    tracing::warn!(pages, error = %compat::grpc_error_text(&s), "ListVolumes failed; reconcile skipped");
                    return None;
                }
            };
            pages += 1;
            for e in resp.entries {
                if let Some(v) = e.volume {
                    published.insert(v.volume_id, e.status.map(|s| s.published_node_ids).unwrap_or_default());
                }
            }
            if resp.next_token.is_empty() {
                return Some(published);
            }
            token = resp.next_token;
        }
    }

    /// One ListVolumes pass: VAs whose `attached` disagrees with the driver's
    /// published nodes are synced again, forced; a VA whose sync has not
    /// settled before the driver answered waits for the next pass
    /// ([`super::settling`]).
    pub(super) async fn reconcile(
        &self,
        attach: &WorkQueue<VaKey>,
        detach: &WorkQueue<VaKey>,
        shutdown: &CancellationToken,
    ) {
        let asked = std::time::Instant::now();
        let Some(published) = self.list_published(shutdown).await else { return };
        for cached in self.vas.state() {
            if *cached.spec.attacher != *self.driver.name {
                continue;
            }
            let version = cached.metadata.resource_version.as_deref();
            if !self.settling.judge(cached.metadata.name.as_deref().unwrap_or_default(), asked, version) {
                continue;
            }
            let va = cached.to_full();
            let name = va.metadata.name.clone().unwrap_or_default();
            let pv = self.volume_of(&va).ok().and_then(|(pv, _)| pv);
            let Some(handle) = pv.and_then(|p| p.spec?.csi.map(|c| c.volume_handle)) else {
                continue;
            };
            let Ok(node_id) = decide::detach_node_id(
                &va,
                self.csinodes.get(&ObjectRef::new(&va.spec.node_name)).as_deref(),
                &self.driver.name,
            ) else {
                continue;
            };
            // A migrated volume's translated handle can lack what the driver
            // names it by (a GCE PD's project and zone): completed from the node.
            let handle = if self.is_migrated(&va) {
                match crate::migration::repair_volume_handle(&self.driver.name, &handle, &node_id) {
                    Ok(h) => h,
                    Err(e) => {
                        tracing::warn!(va = %name, error = %e, "Failed to repair the migrated volume handle {handle}");
                        continue;
                    }
                }
            } else {
                handle
            };
            let attached = va.status.as_ref().is_some_and(|s| s.attached);
            // A volume missing from the answer is published nowhere (upstream).
            let is_published = published.get(&handle).is_some_and(|nodes| nodes.contains(&node_id));
            match decide::reconcile(attached, va.metadata.deletion_timestamp.is_some(), is_published) {
                decide::Reconcile::InSync => {}
                decide::Reconcile::Resync => {
                    tracing::info!(va = %name, attached, is_published, "Driver disagrees; re-syncing");
                    self.forced.lock().insert(name.clone());
                    attach.add(VaKey::named(name));
                }
                decide::Reconcile::Detach => detach.add(VaKey::named(name)),
            }
        }
        self.settling.prune(asked);
    }
}
