//! The driver's script (what it answers, changeable while it runs) and its
//! transport.

use std::{collections::BTreeMap, time::Duration};

use tonic::Code;

use super::HealthForms;

/// What `Probe` answers.
#[derive(Clone, Debug, PartialEq)]
pub enum ProbeAnswer {
    /// `ready: true`.
    Ready,
    /// `ready: false`.
    NotReady,
    /// `ready` absent (means ready).
    Absent,
    /// A gRPC error.
    Fail(Code, String),
}

/// The driver's scripted behaviour; change it while it runs.
#[derive(Clone, Debug)]
pub struct Script {
    /// `GetPluginInfo.name` (may be empty to test validation).
    pub name: String,
    /// `Probe` answer.
    pub probe: ProbeAnswer,
    /// Delay before answering `Probe`.
    pub probe_delay: Duration,
    /// `GetPluginInfo` fails with this while set.
    pub plugin_info_error: Option<(Code, String)>,
    /// Delay before answering `GetPluginInfo` (a driver slow to start).
    pub plugin_info_delay: Duration,
    /// Advertise the controller service with CREATE_DELETE_VOLUME.
    pub controller: bool,
    /// Delay before `CreateVolume` creates the volume and answers (the
    /// volume is created even if the caller gave up meanwhile, like a real
    /// backend).
    pub create_delay: Duration,
    /// `CreateVolume` fails with this (before creating anything) while set.
    pub create_error: Option<(Code, String)>,
    /// `CreateVolume` answers `required_bytes` minus this (a volume smaller
    /// than asked: an answer the provisioner cannot use).
    pub create_shortfall: i64,
    /// `DeleteVolume` fails with this (deleting nothing) while set.
    pub delete_error: Option<(Code, String)>,
    /// Advertise PUBLISH_UNPUBLISH_VOLUME (with `controller`).
    pub publish: bool,
    /// Advertise VOLUME_ACCESSIBILITY_CONSTRAINTS (topology).
    pub topology: bool,
    /// Delay of `ControllerPublishVolume`.
    pub publish_delay: Duration,
    /// Delay of a successful `ControllerPublishVolume`'s answer, after the
    /// publication is recorded (a backend that attached but answers late).
    pub publish_answer_delay: Duration,
    /// Delay of `ControllerUnpublishVolume`.
    pub unpublish_delay: Duration,
    /// `ControllerUnpublishVolume` fails with this (after its delay) while set.
    pub unpublish_error: Option<(Code, String)>,
    /// Advertise PUBLISH_READONLY (with `publish`).
    pub publish_readonly: bool,
    /// `CreateVolume` and `DeleteVolume` fail with `Unauthenticated`
    /// unless their secrets hold this key and value (a backend that needs
    /// credentials for both).
    pub required_secret: Option<(String, String)>,
    /// `ControllerPublishVolume` fails with this (after its delay) while set.
    pub publish_error: Option<(Code, String)>,
    /// The publish context a successful `ControllerPublishVolume` answers
    /// (`None`: `device=/dev/fault`).
    pub publish_context: Option<BTreeMap<String, String>>,
    /// `ListVolumes` never ends: every page answers a new `next_token`.
    pub list_volumes_endless: bool,
    /// Delay of each `ListVolumes` page (a slow backend's listing).
    pub list_volumes_delay: Duration,
    /// Advertise SNAPSHOT_METADATA_SERVICE (the CSI SnapshotMetadata
    /// service answers either way).
    pub snapshot_metadata: bool,
    /// Answer block metadata as VARIABLE_LENGTH ranges (touching blocks
    /// merged) instead of FIXED_LENGTH 4 KiB blocks.
    pub metadata_variable_length: bool,
    /// Delay before each block metadata response (a slow stream).
    pub metadata_response_delay: Duration,
    /// The block metadata stream fails with `Internal` after this many
    /// responses.
    pub metadata_error_after: Option<usize>,
    /// Every snapshot's block metadata is this many consecutive 4 KiB
    /// blocks from offset 0, without backing files (a stream of any length
    /// for the benchmarks; the sidecar cannot tell).
    pub metadata_synthetic_blocks: Option<u64>,
    /// `NodeGetInfo` answers this node ID and accessible topology (the
    /// Node service's other calls answer `Unimplemented`); `None`: it
    /// answers `Unimplemented` too.
    pub node_info: Option<(String, BTreeMap<String, String>)>,
    /// The first this many `ControllerPublishVolume` calls of each
    /// (volume, node) fail with `Internal` (after the delay).
    pub publish_failures_per_pair: u32,
    /// Advertise EXPAND_VOLUME (with `controller`).
    pub expand: bool,
    /// Delay of `ControllerExpandVolume`.
    pub expand_delay: Duration,
    /// `ControllerExpandVolume` fails with this (after its delay) while set.
    pub expand_error: Option<(Code, String)>,
    /// `ControllerExpandVolume` above this many bytes fails with `OutOfRange`.
    pub expand_limit: Option<i64>,
    /// `ControllerExpandVolume` answers `required_bytes` minus this (a
    /// driver that gives less than asked).
    pub expand_shortfall: i64,
    /// `ControllerExpandVolume` answers `node_expansion_required`.
    pub node_expansion_required: bool,
    /// Advertise MODIFY_VOLUME (with `controller`).
    pub modify: bool,
    /// `ControllerModifyVolume` fails with this while set.
    pub modify_error: Option<(Code, String)>,
    /// `ControllerModifyVolume` does not answer while set (a slow backend
    /// the test releases).
    pub modify_hold: bool,
    /// Advertise CREATE_DELETE_SNAPSHOT (with `controller`).
    pub snapshots: bool,
    /// Advertise LIST_SNAPSHOTS (with `snapshots`).
    pub list_snapshots: bool,
    /// Delay of `CreateSnapshot` (the snapshot is made even if the caller
    /// gave up meanwhile).
    pub create_snapshot_delay: Duration,
    /// `CreateSnapshot` fails with this (before creating anything) while set.
    pub create_snapshot_error: Option<(Code, String)>,
    /// `CreateSnapshot` answers without a snapshot (nonsense) while set.
    pub create_snapshot_empty: bool,
    /// `CreateSnapshot` answers `ready_to_use: false` while set.
    pub snapshot_not_ready: bool,
    /// `DeleteSnapshot` fails with this while set.
    pub delete_snapshot_error: Option<(Code, String)>,
    /// `ListSnapshots` fails with this while set.
    pub list_snapshots_error: Option<(Code, String)>,
    /// Advertise CLONE_VOLUME (with `controller`); a created volume's
    /// answer echoes the request's `volume_content_source`.
    pub clone: bool,
    /// Advertise CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT and serve the
    /// group calls (else they answer `Unimplemented`).
    pub group_snapshots: bool,
    /// `CreateVolumeGroupSnapshot` fails with this while set.
    pub create_group_snapshot_error: Option<(Code, String)>,
    /// Advertise GET_CAPACITY (with `controller`). `GetCapacity` answers
    /// per segment ([`segment_key`] of `accessible_topology`): the
    /// segment's total from `capacity_segments`, else `capacity_total`,
    /// minus the bytes of the volumes created in it (`CreateVolume` puts a
    /// volume in the first preferred, else requisite, segment and answers
    /// it as the volume's accessible topology, with `topology`); a segment
    /// with neither fails with NotFound.
    pub capacity: bool,
    /// The total of a segment not in `capacity_segments`.
    pub capacity_total: Option<i64>,
    /// Totals by [`segment_key`].
    pub capacity_segments: BTreeMap<String, i64>,
    /// `maximum_volume_size` of every answer.
    pub capacity_maximum: Option<i64>,
    /// Garbage: `available_capacity` is this instead (e.g. negative).
    pub capacity_garbage: Option<i64>,
    /// The volume-health forms advertised and served (none by default).
    pub health: HealthForms,
}

/// A segment as `k=v,k2=v2`, keys sorted (`""`: no topology).
pub fn segment_key<'a>(segment: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    let sorted: BTreeMap<&String, &String> = segment.into_iter().collect();
    sorted.into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

impl Default for Script {
    fn default() -> Self {
        Script {
            name: "fault.csi.example.com".into(),
            probe: ProbeAnswer::Ready,
            probe_delay: Duration::ZERO,
            plugin_info_error: None,
            plugin_info_delay: Duration::ZERO,
            controller: false,
            create_delay: Duration::ZERO,
            create_error: None,
            create_shortfall: 0,
            delete_error: None,
            publish: false,
            topology: false,
            publish_delay: Duration::ZERO,
            publish_answer_delay: Duration::ZERO,
            unpublish_delay: Duration::ZERO,
            unpublish_error: None,
            list_volumes_endless: false,
            list_volumes_delay: Duration::ZERO,
            snapshot_metadata: false,
            metadata_variable_length: false,
            metadata_response_delay: Duration::ZERO,
            metadata_error_after: None,
            metadata_synthetic_blocks: None,
            node_info: None,
            publish_readonly: false,
            required_secret: None,
            publish_error: None,
            publish_context: None,
            publish_failures_per_pair: 0,
            expand: false,
            expand_delay: Duration::ZERO,
            expand_error: None,
            expand_limit: None,
            expand_shortfall: 0,
            node_expansion_required: false,
            modify: false,
            modify_error: None,
            modify_hold: false,
            snapshots: false,
            list_snapshots: true,
            create_snapshot_delay: Duration::ZERO,
            create_snapshot_error: None,
            create_snapshot_empty: false,
            snapshot_not_ready: false,
            delete_snapshot_error: None,
            list_snapshots_error: None,
            clone: false,
            group_snapshots: false,
            create_group_snapshot_error: None,
            capacity: false,
            capacity_total: None,
            capacity_segments: BTreeMap::new(),
            capacity_maximum: None,
            capacity_garbage: None,
            health: HealthForms::NONE,
        }
    }
}

/// How the socket behaves at the transport level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A proper gRPC server.
    Grpc,
    /// Accepts connections and never reads or answers.
    Silent,
    /// Writes garbage bytes on every connection and closes it.
    Garbage,
}
