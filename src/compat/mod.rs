//! Every name and text that upstream kubernetes-csi sidecars define and that
//! users, dashboards or the kubelet depend on, spelled exactly once.
//!
//! Drop-in compatibility is read and tested here: change a value only when
//! upstream changes it.

use std::time::Duration;

/// `--csi-address` default of every upstream sidecar.
pub const DEFAULT_CSI_ADDRESS: &str = "/run/csi/socket";
/// The multicall program's own name (its subcommand form, the shared
/// watches' field manager).
pub const PROGRAM: &str = "csi-sidecar";
/// `--metrics-path` default.
pub const DEFAULT_METRICS_PATH: &str = "/metrics";

pub mod api;
pub mod snapshot_metadata;
pub mod storage_class;
pub mod translation;

/// CSI call metrics (csi-lib-utils `metrics`).
pub mod metrics {
    /// Histogram of every CSI call.
    pub const OPERATIONS_SECONDS: &str = "csi_sidecar_operations_seconds";
    /// HELP text of [`OPERATIONS_SECONDS`].
    pub const OPERATIONS_SECONDS_HELP: &str =
        "[ALPHA] Container Storage Interface operation duration with gRPC error code status total";
    /// Buckets of [`OPERATIONS_SECONDS`].
    pub const OPERATIONS_SECONDS_BUCKETS: &[f64] =
        &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0];
    /// Label: the driver name.
    pub const LABEL_DRIVER_NAME: &str = "driver_name";
    /// Label: the full gRPC method, e.g. `/csi.v1.Identity/Probe`.
    pub const LABEL_METHOD_NAME: &str = "method_name";
    /// Label: the gRPC status code name.
    pub const LABEL_GRPC_STATUS_CODE: &str = "grpc_status_code";
    /// Label of a CSI migration target's samples: "true" for a call about a
    /// migrated in-tree volume, else "false".
    pub const LABEL_MIGRATED: &str = "migrated";
    /// `driver_name` before the driver told its name.
    pub const UNKNOWN_DRIVER: &str = "unknown-driver";
    /// `grpc_status_code` of a failure that carried no gRPC status.
    pub const UNKNOWN_NON_GRPC: &str = "unknown-non-grpc";
}

/// Work queue metric names (client-go's workqueue names, plus one of ours).
pub mod workqueue {
    /// Keys waiting.
    pub const DEPTH: &str = "workqueue_depth";
    /// Keys added.
    pub const ADDS: &str = "workqueue_adds_total";
    /// Keys re-added after a failure.
    pub const RETRIES: &str = "workqueue_retries_total";
    /// Time a key waited before a worker took it.
    pub const QUEUE_DURATION: &str = "workqueue_queue_duration_seconds";
    /// Time a worker spent on a key.
    pub const WORK_DURATION: &str = "workqueue_work_duration_seconds";
    /// Seconds of work in progress that has not finished (summed over the
    /// keys in workers' hands), as client-go's.
    pub const UNFINISHED_WORK: &str = "workqueue_unfinished_work_seconds";
    /// Seconds the longest-running worker has held its key, as client-go's.
    pub const LONGEST_RUNNING: &str = "workqueue_longest_running_processor_seconds";
    /// Age of the oldest key waiting (csi-sidecar addition).
    pub const OLDEST_ITEM_AGE: &str = "csi_sidecar_workqueue_oldest_item_age_seconds";
    /// Buckets of the duration histograms: client-go's 10ns × 10^k, k = 0..9.
    pub const DURATION_BUCKETS: &[f64] = &[1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0];
}

/// gRPC status code names as Go's `codes.Code.String()` prints them (note
/// Go's spelling `Canceled`), used in metric labels and error texts.
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The text Go's gRPC status error prints: `rpc error: code = X desc = Y`.
pub fn grpc_error_text(status: &tonic::Status) -> String {
    format!("rpc error: code = {} desc = {}", grpc_code_name(status.code()), status.message())
}

/// The message of a call that ran out of its deadline, as Go's context says it.
pub const DEADLINE_EXCEEDED_MESSAGE: &str = "context deadline exceeded";

/// livenessprobe (`cmd/livenessprobe`).
pub mod prober {
    use super::Duration;
    /// `--probe-timeout` default.
    pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(3);
    /// `--health-port` default: livenessprobe listens on `0.0.0.0:9808` when
    /// `--http-endpoint` is not set.
    pub const DEFAULT_HEALTH_PORT: &str = "9808";
    /// Health path.
    pub const HEALTHZ_PATH: &str = "/healthz";
    /// Body of a healthy answer (200).
    pub const BODY_OK: &str = "ok";
    /// Body when `Probe` answered `ready: false` (500).
    pub const BODY_NOT_READY: &str = "driver responded but is not ready";
}

/// node-driver-registrar (`cmd/csi-node-driver-registrar`).
pub mod registrar {
    use super::Duration;
    /// `--plugin-registration-path` default.
    pub const DEFAULT_PLUGIN_REGISTRATION_PATH: &str = "/registration";
    /// `--timeout` default.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
    /// The only `--mode` upstream still knows; it exits 0 at once.
    pub const MODE_REGISTRATION_PROBE: &str = "kubelet-registration-probe";
    /// Registration socket file name for a driver.
    pub fn socket_file_name(driver: &str) -> String {
        format!("{driver}-reg.sock")
    }
    /// `PluginInfo.type` for CSI plugins.
    pub const PLUGIN_TYPE_CSI: &str = "CSIPlugin";
    /// `PluginInfo.supported_versions`.
    pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];
    /// `/healthz` body when the registration socket is missing (404).
    pub const BODY_SOCKET_MISSING: &str = "registration socket does not exist";
    /// `/healthz` body prefix when `GetInfo` on the own socket failed (500).
    pub fn body_get_info_failed(err: &str) -> String {
        format!("error getting info from node-registrar socket: {err}")
    }
    /// `/healthz` body when the own socket answers with another name (500).
    pub fn body_wrong_name(name: &str) -> String {
        format!("invalid driver name {name}")
    }
}

/// Flags that upstream still accepts but calls deprecated, with what
/// csi-sidecar does with them.
pub const DEPRECATED_FLAGS: &[(&str, &str)] = &[
    ("health-port", "use --http-endpoint"),
    ("metrics-address", "use --http-endpoint"),
    ("connection-timeout", "ignored: csi-sidecar waits for the driver for as long as it takes"),
    ("mode", "ignored except kubelet-registration-probe, which exits 0"),
];

/// Upstream's `sanitizeName`, applied to Lease names, leader identities and
/// the attacher's finalizer: every character outside `[a-zA-Z0-9-]` becomes
/// `-`, and a trailing `-` gets an `X` appended.
pub fn sanitize_lease_name(s: &str) -> String {
    let mut out: String = s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
    if out.ends_with('-') {
        out.push('X');
    }
    out
}

/// Leader election (csi-lib-utils `leaderelection` on client-go's
/// `tools/leaderelection`).
pub mod leader_election {
    use super::Duration;
    /// `--leader-election-lease-duration` default.
    pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
    /// `--leader-election-renew-deadline` default.
    pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
    /// `--leader-election-retry-period` default.
    pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(5);
    /// client-go's jitter factor of acquisition retries: a candidate retries
    /// after `retry_period * (1 + 1.2 * rand[0,1))`, and the renew deadline must
    /// exceed `retry_period * 1.2`.
    pub const JITTER_FACTOR: f64 = 1.2;
    /// How long past the lease duration a leader may go without renewing
    /// before `/healthz/leader-election` fails (csi-lib-utils
    /// `DefaultHealthCheckTimeout`).
    pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(20);
    /// Name of the health check, served at `/healthz/leader-election`.
    pub const HEALTH_CHECK_NAME: &str = "leader-election";
    /// client-go's error text of the check.
    pub fn error_renew_failed(lease: &str) -> String {
        format!("failed election to renew leadership on lease {lease}")
    }
    /// The 500 body: csi-lib-utils' handler prefixes the error.
    pub fn body_renew_failed(lease: &str) -> String {
        format!("internal server error: {}", error_renew_failed(lease))
    }
    /// Environment variable naming the namespace when the flag is not set.
    pub const NAMESPACE_ENV: &str = "POD_NAMESPACE";
    /// The service account's namespace file, read when the variable is unset.
    pub const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
    /// The namespace when nothing else says.
    pub const DEFAULT_NAMESPACE: &str = "default";
    /// `leaseDurationSeconds` written when releasing a lease (client-go `ReleaseOnCancel`).
    pub const RELEASED_LEASE_DURATION_SECONDS: i32 = 1;
    /// Gauge: 1 while this process holds the lease, else 0.
    pub const METRIC_MASTER_STATUS: &str = "leader_election_master_status";
    /// HELP of [`METRIC_MASTER_STATUS`].
    pub const METRIC_MASTER_STATUS_HELP: &str = "[ALPHA] Gauge of if the reporting system is master of the relevant \
        lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make \
        sure to group by name.";
    /// Counter: renewals that could not update the cached lease and had to read it first.
    pub const METRIC_SLOWPATH_TOTAL: &str = "leader_election_slowpath_total";
    /// HELP of [`METRIC_SLOWPATH_TOTAL`].
    pub const METRIC_SLOWPATH_TOTAL_HELP: &str = "[ALPHA] Total number of slow path exercised in renewing leader \
        leases. 'name' is the string used to identify the lease. Please make sure to group by name.";
    /// Label of both metrics: the lease name.
    pub const LABEL_NAME: &str = "name";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_spells_grpc_codes_its_own_way() {
        assert_eq!(grpc_code_name(tonic::Code::Cancelled), "Canceled");
        assert_eq!(grpc_code_name(tonic::Code::Ok), "OK");
        assert_eq!(grpc_code_name(tonic::Code::DeadlineExceeded), "DeadlineExceeded");
    }

    #[test]
    fn grpc_error_text_matches_go() {
        let s = tonic::Status::deadline_exceeded(DEADLINE_EXCEEDED_MESSAGE);
        assert_eq!(grpc_error_text(&s), "rpc error: code = DeadlineExceeded desc = context deadline exceeded");
    }

    #[test]
    fn lease_names_are_sanitized_like_upstream() {
        let cases = [
            ("hostpath.csi.k8s.io", "hostpath-csi-k8s-io"),
            ("external-attacher-leader-hostpath.csi.k8s.io", "external-attacher-leader-hostpath-csi-k8s-io"),
            ("a/b-", "a-b-X"),
            ("a.", "a-X"),
            ("Node_1", "Node-1"),
            ("plain-name", "plain-name"),
            ("ü", "-X"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(sanitize_lease_name(input), want, "{input:?}");
        }
    }

    #[test]
    fn registration_socket_name_is_driver_name_verbatim() {
        assert_eq!(registrar::socket_file_name("hostpath.csi.k8s.io"), "hostpath.csi.k8s.io-reg.sock");
    }
}

/// external-provisioner and sig-storage-lib-external-provisioner.
pub mod provisioner {
    /// StorageClass parameter: the volume's filesystem (also written by CSI
    /// migration's class translation).
    pub const PARAM_FSTYPE: &str = "csi.storage.k8s.io/fstype";
    /// PVC: the provisioner the PV binder chose (the driver name).
    pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
    /// PVC: the same, beta spelling.
    pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
    /// PVC/PV: CSI migration target.
    pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
    /// PVC: the node the scheduler picked (WaitForFirstConsumer).
    pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
    /// PV: who provisioned it.
    pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
    /// PV: the provisioner secret to use for DeleteVolume.
    pub const ANN_DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
    /// See [`ANN_DELETION_SECRET_NAME`].
    pub const ANN_DELETION_SECRET_NAMESPACE: &str = "volume.kubernetes.io/provisioner-deletion-secret-namespace";
    /// PV: the secret for ControllerModifyVolume (resizer).
    pub const ANN_MODIFY_SECRET_NAME: &str = "volume.kubernetes.io/controller-modify-secret-name";
    /// See [`ANN_MODIFY_SECRET_NAME`].
    pub const ANN_MODIFY_SECRET_NAMESPACE: &str = "volume.kubernetes.io/controller-modify-secret-namespace";
    /// PV finalizer that protects the backend volume.
    pub const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
    /// `spec.csi.volumeAttributes` key with the provisioner identity.
    pub const IDENTITY_KEY: &str = "storage.kubernetes.io/csiProvisionerIdentity";
    /// Event source component of the provisioner's own events (the
    /// external-populator notice).
    pub const EVENT_COMPONENT: &str = "external-provisioner";
    /// Event source component of the provisioning library's events
    /// (`Provisioning`, `ProvisioningSucceeded`, `ProvisioningFailed`,
    /// `VolumeFailedDelete`, ...): `<driver>_<host>_<uuid>`.
    pub fn library_event_component(driver: &str, host: &str, uuid: &str) -> String {
        format!("{driver}_{host}_{uuid}")
    }
    /// Event reasons.
    pub const REASON_PROVISIONING: &str = "Provisioning";
    /// See [`REASON_PROVISIONING`].
    pub const REASON_PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
    /// See [`REASON_PROVISIONING`].
    pub const REASON_PROVISIONING_FAILED: &str = "ProvisioningFailed";
    /// See [`REASON_PROVISIONING`].
    pub const REASON_VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";
    /// Finalizer on a PVC that is the source of a clone in progress.
    pub const CLONE_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";
    /// Finalizer on a VolumeSnapshot a volume is being restored from (the
    /// provisioner's own, distinct from the snapshot-controller's
    /// `snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection`).
    pub const SNAPSHOT_SOURCE_FINALIZER: &str = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
    /// VolumeSnapshotContent annotation allowing a restore to another volume mode.
    pub const ANN_ALLOW_VOLUME_MODE_CHANGE: &str = "snapshot.storage.kubernetes.io/allow-volume-mode-change";
    /// Data source kinds the provisioner handles itself.
    pub const KIND_PVC: &str = "PersistentVolumeClaim";
    /// See [`KIND_PVC`].
    pub const KIND_SNAPSHOT: &str = "VolumeSnapshot";
    /// The feature gate for `dataSourceRef.namespace`.
    pub const GATE_CROSS_NAMESPACE: &str = "CrossNamespaceVolumeDataSource";
    /// The ReferenceGrant API (Gateway API) consulted for cross-namespace sources.
    pub const REFERENCE_GRANT_GROUP: &str = "gateway.networking.k8s.io";
    /// See [`REFERENCE_GRANT_GROUP`].
    pub const REFERENCE_GRANT_VERSION: &str = "v1beta1";
    /// Work queue names (metrics label).
    pub const QUEUE_CLAIMS: &str = "claims";
    /// The cloning-protection controller's queue. Upstream names it
    /// `claims` as well (its metrics collide with the provisioning queue's).
    pub const QUEUE_CLONING_PROTECTION: &str = "cloning-protection";
    /// See [`QUEUE_CLAIMS`].
    pub const QUEUE_VOLUMES: &str = "volumes";
    /// Resync period of the claim and volume handlers (fixed upstream: the
    /// provisioner library's 15 minutes; there is no flag).
    pub const RESYNC: std::time::Duration = std::time::Duration::from_secs(15 * 60);
    /// `--node-deployment`: the node's name (env var) and upstream's text
    /// without it; the snapshotter's, spelled once.
    pub use super::snapshotter::{NODE_NAME_ENV, TEXT_NODE_NAME_MISSING};
}

/// external-provisioner's storage capacity tracking (`pkg/capacity`).
pub mod capacity {
    /// CSIStorageCapacity label: the driver.
    pub const LABEL_DRIVER_NAME: &str = "csi.storage.k8s.io/drivername";
    /// CSIStorageCapacity label: the managing instance.
    pub const LABEL_MANAGED_BY: &str = "csi.storage.k8s.io/managed-by";
    /// Value of [`LABEL_MANAGED_BY`] of a central provisioner.
    pub const MANAGED_BY: &str = "external-provisioner";
    /// `metadata.generateName` of the objects.
    pub const GENERATE_NAME: &str = "csisc-";
    /// The namespace of the objects (required).
    pub const ENV_NAMESPACE: &str = "NAMESPACE";
    /// The pod the owner walk starts from (with an owner level >= 0).
    pub const ENV_POD_NAME: &str = "POD_NAME";
    /// Work queue of the objects (upstream's name).
    pub const QUEUE: &str = "csistoragecapacity";
    /// Work queue of the topology segments (upstream's name).
    pub const QUEUE_TOPOLOGY: &str = "csitopology";
    /// Gauge: objects that are supposed to exist.
    pub const METRIC_GOAL: &str = "csistoragecapacities_desired_goal";
    /// Help of [`METRIC_GOAL`].
    pub const METRIC_GOAL_HELP: &str =
        "[ALPHA] Number of CSIStorageCapacity objects that are supposed to be managed automatically.";
    /// Gauge: objects that exist and are supposed to.
    pub const METRIC_CURRENT: &str = "csistoragecapacities_desired_current";
    /// Help of [`METRIC_CURRENT`].
    pub const METRIC_CURRENT_HELP: &str =
        "[ALPHA] Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically.";
    /// Gauge: objects that exist and will be deleted.
    pub const METRIC_OBSOLETE: &str = "csistoragecapacities_obsolete";
    /// Help of [`METRIC_OBSOLETE`].
    pub const METRIC_OBSOLETE_HELP: &str = "[ALPHA] Number of CSIStorageCapacity objects that exist and will be deleted automatically. Objects that exist and may need an update are not considered obsolete and therefore not included in this value.";
}

/// external-attacher.
pub mod attacher {
    /// VolumeAttachment annotation with the node ID used for attach.
    pub const ANN_NODE_ID: &str = "csi.alpha.kubernetes.io/node-id";
    /// Finalizer on VolumeAttachments and PVs: `external-attacher/<sanitised driver>`.
    pub fn finalizer(driver: &str) -> String {
        format!("external-attacher/{}", super::sanitize_lease_name(driver))
    }
    /// Lease name before sanitising.
    pub fn lease_lock_name(driver: &str) -> String {
        format!("external-attacher-leader-{driver}")
    }
    /// Work queue names: attaches keep upstream's name, detaches get their own.
    pub const QUEUE_ATTACH: &str = "csi-attacher-va";
    /// See [`QUEUE_ATTACH`].
    pub const QUEUE_DETACH: &str = "csi-attacher-va-detach";
    /// PV finalizer queue.
    pub const QUEUE_PV: &str = "csi-attacher-pv";
}

/// external-resizer.
pub mod health_monitor {
    /// Lease name before sanitising: `external-health-monitor-leader-<driver>`.
    pub fn lease_lock_name(driver: &str) -> String {
        format!("external-health-monitor-leader-{}", super::sanitize_lease_name(driver))
    }
    /// Event source component: `csi-pv-monitor-controller-<driver>`.
    pub fn event_component(driver: &str) -> String {
        format!("csi-pv-monitor-controller-{driver}")
    }
    /// Warning on the claim: the driver reports the volume abnormal.
    pub const REASON_ABNORMAL: &str = "VolumeConditionAbnormal";
    /// Normal on the claim: the volume is healthy again.
    pub const REASON_NORMAL: &str = "VolumeConditionNormal";
    /// The message of [`REASON_NORMAL`].
    pub const MESSAGE_NORMAL: &str = "The Volume returns to the healthy state";
    /// Warning on the claim: a node its pods run on failed.
    pub const REASON_NODE_FAILED: &str = "NodeFailed";
    /// Warning (upstream's type) on the claim: that node is back.
    pub const REASON_NODE_RECOVERED: &str = "NodeRecovered";
    /// The message of [`REASON_NODE_FAILED`].
    pub fn message_node_failed(pods: &[String], claim: &str, namespace: &str, node: &str) -> String {
        format!(
            "Pods: [ {} ] consuming PVC: {claim} in namespace: {namespace} are now on a failed node: {node}",
            pods.join(" ")
        )
    }
    /// The message of [`REASON_NODE_RECOVERED`].
    pub fn message_node_recovered(node: &str) -> String {
        format!("Node: {node} recovered")
    }
    /// How long a node stays NotReady before its claims get `NodeFailed`.
    pub const NODE_NOT_READY_GRACE: std::time::Duration = std::time::Duration::from_secs(300);
    /// Field manager of the `status.healthStatus` patch (upstream's redesign).
    pub const FIELD_MANAGER: &str = "csi-external-health-monitor-controller";
    /// `status.healthStatus.healthConditions[].status` values.
    pub const STATUS_DEGRADED: &str = "Degraded";
    /// See [`STATUS_DEGRADED`].
    pub const STATUS_INACCESSIBLE: &str = "Inaccessible";
    /// See [`STATUS_DEGRADED`].
    pub const STATUS_DATA_LOSS: &str = "DataLoss";
    /// At most this many conditions in `healthConditions` (API validation).
    pub const MAX_HEALTH_CONDITIONS: usize = 16;
    /// Start-up: the driver has no controller service.
    pub const ERR_NO_CONTROLLER_SERVICE: &str = "CSI driver does not support Controller Service";
    /// Start-up: `--worker-threads 0`.
    pub const ERR_WORKER_THREADS: &str = "Option -worker-threads must be greater than zero";
}

pub mod resizer {
    /// Lease name before sanitising: `external-resizer-<driver>` (one Lease
    /// for the resize and modify controllers).
    pub fn lease_lock_name(driver: &str) -> String {
        format!("external-resizer-{}", super::sanitize_lease_name(driver))
    }
    /// Event source component: `external-resizer <driver>`.
    pub fn event_component(driver: &str) -> String {
        format!("external-resizer {driver}")
    }
    /// Resize work queue: upstream's name `<driver>-pvc`.
    pub fn queue_resize(driver: &str) -> String {
        format!("{driver}-pvc")
    }
    /// Modify work queue: `<driver>-pvc-modify` (upstream reuses `<driver>-pvc`,
    /// so the two queues' metrics collide there).
    pub fn queue_modify(driver: &str) -> String {
        format!("{driver}-pvc-modify")
    }
    /// PVC: the resizer of a migrated in-tree volume.
    pub const ANN_STORAGE_RESIZER: &str = "volume.kubernetes.io/storage-resizer";
    /// PV: the claim's capacity before a resize that needs the node (`AnnotateFsResize`).
    pub const ANN_PRE_RESIZE_CAPACITY: &str = "volume.alpha.kubernetes.io/pre-resize-capacity";
    /// PVC: `"true"` once a resize finished without the node.
    pub const ANN_NODE_EXPANSION_NOT_REQUIRED: &str = "volume.kubernetes.io/node-expansion-not-required";
    /// PVC condition types of a resize.
    pub const COND_RESIZING: &str = "Resizing";
    /// See [`COND_RESIZING`].
    pub const COND_FS_RESIZE_PENDING: &str = "FileSystemResizePending";
    /// See [`COND_RESIZING`].
    pub const COND_CONTROLLER_RESIZE_ERROR: &str = "ControllerResizeError";
    /// See [`COND_RESIZING`].
    pub const COND_NODE_RESIZE_ERROR: &str = "NodeResizeError";
    /// PVC condition types of a modification.
    pub const COND_MODIFYING_VOLUME: &str = "ModifyingVolume";
    /// See [`COND_MODIFYING_VOLUME`].
    pub const COND_MODIFY_VOLUME_ERROR: &str = "ModifyVolumeError";
    /// `status.allocatedResourceStatuses.storage` values.
    pub const CONTROLLER_RESIZE_IN_PROGRESS: &str = "ControllerResizeInProgress";
    /// See [`CONTROLLER_RESIZE_IN_PROGRESS`].
    pub const CONTROLLER_RESIZE_INFEASIBLE: &str = "ControllerResizeInfeasible";
    /// See [`CONTROLLER_RESIZE_IN_PROGRESS`].
    pub const NODE_RESIZE_PENDING: &str = "NodeResizePending";
    /// See [`CONTROLLER_RESIZE_IN_PROGRESS`].
    pub const NODE_RESIZE_IN_PROGRESS: &str = "NodeResizeInProgress";
    /// See [`CONTROLLER_RESIZE_IN_PROGRESS`].
    pub const NODE_RESIZE_INFEASIBLE: &str = "NodeResizeInfeasible";
    /// Event reasons.
    pub const REASON_RESIZING: &str = "Resizing";
    /// See [`REASON_RESIZING`].
    pub const REASON_RESIZE_FAILED: &str = "VolumeResizeFailed";
    /// See [`REASON_RESIZING`].
    pub const REASON_RESIZE_SUCCESSFUL: &str = "VolumeResizeSuccessful";
    /// See [`REASON_RESIZING`].
    pub const REASON_FS_RESIZE_REQUIRED: &str = "FileSystemResizeRequired";
    /// Event text of [`REASON_RESIZING`].
    pub fn text_resizing(pv: &str) -> String {
        format!("External resizer is resizing volume {pv}")
    }
    /// Event text of [`REASON_RESIZE_SUCCESSFUL`].
    pub const TEXT_RESIZE_SUCCESSFUL: &str = "Resize volume succeeded";
    /// Event text of [`REASON_FS_RESIZE_REQUIRED`].
    pub const TEXT_FS_RESIZE_REQUIRED: &str = "Require file system resize of volume on node";
    /// Message of the `FileSystemResizePending` condition.
    pub const TEXT_FS_RESIZE_PENDING: &str =
        "Waiting for user to (re-)start a pod to finish file system resize of volume on node.";
    /// The error (and event) text of a failed `ControllerExpandVolume`.
    pub fn text_resize_failed(pv: &str, driver: &str, err: &str) -> String {
        format!("resize volume \"{pv}\" by resizer \"{driver}\" failed: {err}")
    }
    /// Message of the `ControllerResizeError` condition.
    pub fn text_controller_resize_error(err: &str) -> String {
        format!("failed to expand pvc with {err}")
    }
    /// Event text while an offline-only driver's volume is in use.
    pub fn text_in_use(key: &str, driver: &str) -> String {
        format!(
            "Unable to expand {key} because CSI driver {driver} only supports offline expansion and volume is currently in-use"
        )
    }
    /// Error text while an infeasible size is held back.
    pub fn text_infeasible_skipped(key: &str) -> String {
        format!("skipping volume expansion for pvc {key}, because expansion previously failed with infeasible error")
    }
}

/// external-resizer's modify controller (VolumeAttributesClass).
pub mod modifier {
    /// `status.modifyVolumeStatus.status` values.
    pub const PENDING: &str = "Pending";
    /// See [`PENDING`].
    pub const IN_PROGRESS: &str = "InProgress";
    /// See [`PENDING`].
    pub const INFEASIBLE: &str = "Infeasible";
    /// Event reasons.
    pub const REASON_MODIFY: &str = "VolumeModify";
    /// See [`REASON_MODIFY`].
    pub const REASON_MODIFY_FAILED: &str = "VolumeModifyFailed";
    /// See [`REASON_MODIFY`].
    pub const REASON_MODIFY_SUCCESSFUL: &str = "VolumeModifySuccessful";
    /// See [`REASON_MODIFY`].
    pub const REASON_MODIFY_CANCELED: &str = "VolumeModifyCanceled";
    /// Event text of [`REASON_MODIFY_CANCELED`].
    pub const TEXT_CANCELED: &str = "Cancelled modify.";
    /// Event text of [`REASON_MODIFY`].
    pub fn text_modifying(pvc: &str, vac: &str) -> String {
        format!("external resizer is modifying volume {pvc} with vac {vac}")
    }
    /// Event text of [`REASON_MODIFY_SUCCESSFUL`].
    pub fn text_modified(pvc: &str, vac: &str) -> String {
        format!("external resizer modified volume {pvc} with vac {vac} successfully")
    }
    /// Event text when the class is not there.
    pub fn text_vac_missing(vac: &str) -> String {
        format!("VAC \"{vac}\" does not exist.")
    }
    /// Suffix of a non-final failure's event text.
    pub fn text_still_modifying(vac: &str) -> String {
        format!(". Still modifying to VAC {vac}")
    }
    /// Message of the `ModifyingVolume` condition while in progress.
    pub fn text_in_progress(vac: &str) -> String {
        format!("Modifying volume to \"{vac}\" is in progress.")
    }
    /// Message of the `ModifyingVolume` condition after a final failure.
    pub fn text_failed_waiting(vac: &str) -> String {
        format!("Modifying volume to \"{vac}\" failed. Waiting for retry.")
    }
    /// Message of the `ModifyingVolume` condition after a non-final failure.
    pub fn text_still_in_progress(vac: &str) -> String {
        format!("Modifying volume to \"{vac}\" is still in progress.")
    }
    /// Error text while an infeasible class is held back.
    pub fn text_infeasible_skipped(key: &str) -> String {
        format!(
            "skipping volume modification for pvc {key}, because modification previously failed with infeasible error"
        )
    }
    /// `--extra-modify-metadata` parameter keys.
    pub use super::storage_class::{
        PV_NAME as PARAM_PV_NAME, PVC_NAME as PARAM_PVC_NAME, PVC_NAMESPACE as PARAM_PVC_NAMESPACE,
    };
}

/// csi-snapshotter (external-snapshotter's sidecar) and the names it shares
/// with snapshot-controller.
pub mod snapshotter {
    /// Lease name: `external-snapshotter-leader-<driver>` with `/` → `-`,
    /// then sanitised.
    pub fn lease_lock_name(driver: &str) -> String {
        super::sanitize_lease_name(&format!("external-snapshotter-leader-{}", driver.replace('/', "-")))
    }
    /// Event source component: `csi-snapshotter <driver>`.
    pub fn event_component(driver: &str) -> String {
        format!("csi-snapshotter {driver}")
    }
    /// Content work queue.
    pub const QUEUE_CONTENT: &str = "csi-snapshotter-content";
    /// Group content work queue.
    pub const QUEUE_GROUP_CONTENT: &str = "csi-snapshotter-groupsnapshotcontent";
    /// Content finalizer (added by snapshot-controller, removed by the sidecar).
    pub const CONTENT_FINALIZER: &str = "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
    /// Content annotation: a CreateSnapshot may be in flight.
    pub const ANN_BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";
    /// Content annotation (snapshot-controller): the VolumeSnapshot is being deleted.
    pub const ANN_BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
    /// Content annotation (snapshot-controller): the create/delete secret's name.
    pub const ANN_DELETION_SECRET_NAME: &str = "snapshot.storage.kubernetes.io/deletion-secret-name";
    /// Content annotation (snapshot-controller): the create/delete secret's namespace.
    pub const ANN_DELETION_SECRET_NAMESPACE: &str = "snapshot.storage.kubernetes.io/deletion-secret-namespace";
    /// Content annotation: a member of a dynamically created group snapshot.
    pub const ANN_GROUP_SNAPSHOT_HANDLE: &str = "groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle";
    /// Content label of `--node-deployment`: the node managing the content.
    pub const LABEL_MANAGED_BY: &str = "snapshot.storage.kubernetes.io/managed-by";
    /// Env var naming the node with `--node-deployment`.
    pub const NODE_NAME_ENV: &str = "NODE_NAME";
    /// The reserved prefix of class parameters.
    pub use super::storage_class::PREFIX as PARAM_PREFIX;
    /// Class parameter: the create/delete secret's name (template).
    pub const PARAM_SECRET_NAME: &str = "csi.storage.k8s.io/snapshotter-secret-name";
    /// Class parameter: the create/delete secret's namespace (template).
    pub const PARAM_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/snapshotter-secret-namespace";
    /// Class parameter: the ListSnapshots secret's name (template).
    pub const PARAM_LIST_SECRET_NAME: &str = "csi.storage.k8s.io/snapshotter-list-secret-name";
    /// Class parameter: the ListSnapshots secret's namespace (template).
    pub const PARAM_LIST_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/snapshotter-list-secret-namespace";
    /// The eight reserved secret parameters dropped from CreateSnapshot's
    /// parameters (any other `csi.storage.k8s.io/` key is an error).
    pub const RESERVED_SECRET_PARAMS: [&str; 8] = [
        PARAM_SECRET_NAME,
        PARAM_SECRET_NAMESPACE,
        PARAM_LIST_SECRET_NAME,
        PARAM_LIST_SECRET_NAMESPACE,
        "csi.storage.k8s.io/group-snapshotter-secret-name",
        "csi.storage.k8s.io/group-snapshotter-secret-namespace",
        "csi.storage.k8s.io/group-snapshotter-get-secret-name",
        "csi.storage.k8s.io/group-snapshotter-get-secret-namespace",
    ];
    /// Extra create metadata: the VolumeSnapshot's name.
    pub const PARAM_SNAPSHOT_NAME: &str = "csi.storage.k8s.io/volumesnapshot/name";
    /// Extra create metadata: the VolumeSnapshot's namespace.
    pub const PARAM_SNAPSHOT_NAMESPACE: &str = "csi.storage.k8s.io/volumesnapshot/namespace";
    /// Extra create metadata: the content's name.
    pub const PARAM_CONTENT_NAME: &str = "csi.storage.k8s.io/volumesnapshotcontent/name";
    /// Template token of secret parameters: the content's name.
    pub const TOKEN_CONTENT_NAME: &str = "volumesnapshotcontent.name";
    /// Template token of secret parameters: the VolumeSnapshot's name.
    pub const TOKEN_SNAPSHOT_NAME: &str = "volumesnapshot.name";
    /// Template token of secret parameters: the VolumeSnapshot's namespace.
    pub const TOKEN_SNAPSHOT_NAMESPACE: &str = "volumesnapshot.namespace";
    /// The annotation of the default VolumeSnapshotClass of a driver.
    pub const ANN_DEFAULT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";
    /// `spec.deletionPolicy` that deletes the backend snapshot.
    pub const POLICY_DELETE: &str = "Delete";
    /// Event: the first CreateSnapshot attempt failed.
    pub const REASON_CREATION_FAILED: &str = "SnapshotCreationFailed";
    /// Event: a later attempt (or a ListSnapshots check) failed.
    pub const REASON_CHECK_FAILED: &str = "SnapshotContentCheckandUpdateFailed";
    /// Event: deletion failed.
    pub const REASON_DELETE_ERROR: &str = "SnapshotDeleteError";
    /// `SnapshotCreationFailed` text.
    pub fn text_creation_failed(err: &str) -> String {
        format!("Failed to create snapshot: {err}")
    }
    /// `SnapshotContentCheckandUpdateFailed` text.
    pub fn text_check_failed(err: &str) -> String {
        format!("Failed to check and update snapshot content: {err}")
    }
    /// `SnapshotDeleteError` texts.
    pub const TEXT_DELETE_CREDENTIALS: &str = "Failed to get snapshot credentials";
    /// `SnapshotDeleteError`: DeleteSnapshot failed.
    pub const TEXT_DELETE_FAILED: &str = "Failed to delete snapshot";
    /// `SnapshotDeleteError`: the status could not be cleared.
    pub const TEXT_DELETE_CLEAR_STATUS: &str = "Failed to clear content status";
    /// Start-up: `--snapshot-name-prefix` empty.
    pub const TEXT_EMPTY_PREFIX: &str = "Snapshot name prefix cannot be of length 0";
    /// Start-up: the driver cannot create snapshots.
    pub fn text_no_create_capability(driver: &str) -> String {
        format!("CSI driver {driver} does not support ControllerCreateSnapshot")
    }
    /// Start-up: `--node-deployment` without `$NODE_NAME`.
    pub const TEXT_NODE_NAME_MISSING: &str =
        "The NODE_NAME environment variable must be set when using --enable-node-deployment.";
    /// Start-up: `--node-deployment` with `--leader-election`.
    pub const TEXT_NODE_DEPLOYMENT_LEADER: &str = "Leader election cannot happen when node-deployment is set to true";
    /// Group content finalizer (added by snapshot-controller, removed by the sidecar).
    pub const GROUP_CONTENT_FINALIZER: &str =
        "groupsnapshot.storage.kubernetes.io/volumegroupsnapshotcontent-bound-protection";
    /// Group content annotation: a CreateVolumeGroupSnapshot may be in flight.
    pub const ANN_GROUP_BEING_CREATED: &str = "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-being-created";
    /// Group content annotation (snapshot-controller): the group snapshot is being deleted.
    pub const ANN_GROUP_BEING_DELETED: &str = "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-being-deleted";
    /// Group content annotation (snapshot-controller): the create/delete secret's name.
    pub const ANN_GROUP_DELETION_SECRET_NAME: &str = "groupsnapshot.storage.kubernetes.io/deletion-secret-name";
    /// Group content annotation (snapshot-controller): the create/delete secret's namespace.
    pub const ANN_GROUP_DELETION_SECRET_NAMESPACE: &str =
        "groupsnapshot.storage.kubernetes.io/deletion-secret-namespace";
    /// Group class parameter: the GetVolumeGroupSnapshot secret's name (template).
    pub const PARAM_GROUP_GET_SECRET_NAME: &str = "csi.storage.k8s.io/group-snapshotter-get-secret-name";
    /// Group class parameter: the GetVolumeGroupSnapshot secret's namespace (template).
    pub const PARAM_GROUP_GET_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/group-snapshotter-get-secret-namespace";
    /// Extra create metadata: the VolumeGroupSnapshot's name.
    pub const PARAM_GROUP_SNAPSHOT_NAME: &str = "csi.storage.k8s.io/volumegroupsnapshot/name";
    /// Extra create metadata: the VolumeGroupSnapshot's namespace.
    pub const PARAM_GROUP_SNAPSHOT_NAMESPACE: &str = "csi.storage.k8s.io/volumegroupsnapshot/namespace";
    /// Extra create metadata: the group content's name.
    pub const PARAM_GROUP_CONTENT_NAME: &str = "csi.storage.k8s.io/volumegroupsnapshotcontent/name";
    /// Template token of group secret parameters: the group content's name.
    pub const TOKEN_GROUP_CONTENT_NAME: &str = "volumegroupsnapshotcontent.name";
    /// Event: the first CreateVolumeGroupSnapshot attempt failed.
    pub const REASON_GROUP_CREATION_FAILED: &str = "GroupSnapshotCreationFailed";
    /// Event: a later attempt (or a GetVolumeGroupSnapshot check) failed.
    pub const REASON_GROUP_CHECK_FAILED: &str = "GroupSnapshotContentCheckandUpdateFailed";
    /// Event: the group deletion failed.
    pub const REASON_GROUP_DELETE_ERROR: &str = "GroupSnapshotDeleteError";
    /// `GroupSnapshotCreationFailed` text.
    pub fn text_group_creation_failed(err: &str) -> String {
        format!("Failed to create group snapshot: {err}")
    }
    /// `GroupSnapshotContentCheckandUpdateFailed` text.
    pub fn text_group_check_failed(err: &str) -> String {
        format!("Failed to check and update group snapshot content: {err}")
    }
    /// `GroupSnapshotDeleteError`: DeleteVolumeGroupSnapshot failed.
    pub const TEXT_GROUP_DELETE_FAILED: &str = "Failed to delete group snapshot";
    /// Start-up: `--groupsnapshot-name-prefix` empty (with the gate on).
    pub const TEXT_EMPTY_GROUP_PREFIX: &str = "group snapshot name prefix cannot be of length 0";
    /// Start-up warning: the driver cannot create group snapshots.
    pub fn text_no_group_capability(driver: &str) -> String {
        format!(
            "CSI driver {driver} does not support GroupControllerCreateVolumeGroupSnapshot when the --feature-gates=CSIVolumeGroupSnapshot=true flag is set"
        )
    }
}
