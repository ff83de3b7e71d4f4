//! What a VolumeAttachment or PersistentVolume of the attacher waits for
//! (pure): the `waiting_for` of `/debug/objects`, from the step where an
//! attach or detach stopped and from the PV finalizer decision.

use k8s_openapi::api::core::v1::PersistentVolume;

use super::decide;
use crate::debug::WaitingFor;

/// The step where an attach or detach of a VolumeAttachment stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The attachment's own source is invalid (both or neither of a PV
    /// name and an inline spec, an inline spec without CSI, the inline
    /// spec gone): nothing but a retry (or a new attachment) helps.
    Source,
    /// Its PersistentVolume: missing, being deleted, gone before the
    /// detach, not a CSI volume (or not translatable), or with access modes
    /// CSI cannot express.
    Volume,
    /// The node's CSINode is missing or has no node ID of the driver (and,
    /// for a detach, the attachment has no saved node ID either).
    Node,
    /// The controller-publish secret the PV names cannot be read.
    Secret,
    /// `ControllerPublishVolume` or `ControllerUnpublishVolume` failed.
    Driver,
    /// A write to the apiserver failed: a finalizer, the node-ID
    /// annotation, the status.
    Api,
}

impl Stop {
    /// What an attachment that stopped here waits for.
    pub fn waiting_for(self) -> WaitingFor {
        match self {
            Stop::Source => WaitingFor::Retry,
            Stop::Volume => WaitingFor::Dependent,
            Stop::Node => WaitingFor::Node,
            Stop::Secret => WaitingFor::Secret,
            Stop::Driver => WaitingFor::Driver,
            Stop::Api => WaitingFor::ApiServer,
        }
    }
}

/// What a PV carrying the attacher's finalizer waits for after a sync that
/// kept the finalizer: the attachments still referencing it
/// ([`WaitingFor::Dependent`]) when only they hold it (the PV is being
/// deleted, or handed back to the in-tree plugin); `None` when the
/// finalizer stays because the PV is simply in use, or can go now.
pub fn pv_waiting(pv: &PersistentVolume, referenced: bool, finalizer: &str, driver: &str) -> Option<WaitingFor> {
    (referenced && decide::pv_finalizer_removable(pv, false, finalizer, driver)).then_some(WaitingFor::Dependent)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
        jiff::Timestamp,
    };

    use super::*;

    #[test]
    fn each_stop_names_what_the_attachment_waits_for() {
        let table = [
            (Stop::Source, WaitingFor::Retry),
            (Stop::Volume, WaitingFor::Dependent),
            (Stop::Node, WaitingFor::Node),
            (Stop::Secret, WaitingFor::Secret),
            (Stop::Driver, WaitingFor::Driver),
            (Stop::Api, WaitingFor::ApiServer),
        ];
        for (stop, want) in table {
            assert_eq!(stop.waiting_for(), want, "{stop:?}");
        }
    }

    const FIN: &str = "external-attacher/driver";

    fn pv(deleting: bool, finalizer: bool) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv-1".into()),
                deletion_timestamp: deleting.then_some(Time(Timestamp::UNIX_EPOCH)),
                finalizers: finalizer.then(|| vec![FIN.to_string()]),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource { driver: "driver".into(), ..Default::default() }),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn a_pv_waits_only_for_the_attachments_holding_its_finalizer() {
        let table = [
            // (deleting, has the finalizer, referenced, want)
            (true, true, true, Some(WaitingFor::Dependent)),
            (true, true, false, None),
            (false, true, true, None),
            (false, true, false, None),
            (true, false, true, None),
        ];
        for (deleting, finalizer, referenced, want) in table {
            assert_eq!(
                pv_waiting(&pv(deleting, finalizer), referenced, FIN, "driver"),
                want,
                "deleting {deleting}, finalizer {finalizer}, referenced {referenced}"
            );
        }
    }
}
