//! external-snapshot-metadata's names and answers (the Kubernetes
//! SnapshotMetadata API it serves): what a backup client reads back in a
//! refusal's status message, spelled as upstream does.

/// `--port` default.
pub const DEFAULT_PORT: u16 = 50051;
/// `--max-streaming-duration-min` default, in minutes.
pub const DEFAULT_MAX_STREAMING_MINUTES: u64 = 10;
/// The operation names of its CSI call metrics.
pub const OPERATION_ALLOCATED: &str = "MetadataAllocated";
/// See [`OPERATION_ALLOCATED`].
pub const OPERATION_DELTA: &str = "MetadataDelta";

/// An empty `security_token`.
pub const NO_TOKEN: &str = "securityToken is missing";
/// An empty `namespace`.
pub const NO_NAMESPACE: &str = "namespace parameter cannot be empty";
/// An empty `snapshot_name` (allocated).
pub const NO_SNAPSHOT: &str = "snapshotName cannot be empty";
/// An empty `base_snapshot_id` (delta).
pub const NO_BASE: &str = "baseSnapshotId cannot be empty";
/// An empty `target_snapshot_name` (delta).
pub const NO_TARGET: &str = "targetSnapshotName cannot be empty";
/// A token the TokenReview did not authenticate for the audience.
pub const UNAUTHENTICATED: &str = "unauthenticated user";
/// The driver not validated yet.
pub const DRIVER_NOT_READY: &str = "the CSI driver is not yet ready";
/// The HTTP health path of external-snapshot-metadata.
pub const HEALTH_PATH: &str = "/health";

/// `/health`'s body while the gRPC side does not serve (503).
pub const NOT_READY_BODY: &str = "not ready";

/// The TokenReview itself failed.
pub fn authentication_failed(error: &str) -> String {
    format!("failed to authenticate user: {error}")
}

/// The SubjectAccessReview itself failed.
pub fn authorization_failed(error: &str) -> String {
    format!("failed to authorize the user: {error}")
}

/// The SubjectAccessReview denied `get volumesnapshots`.
pub fn permission_denied(reason: &str) -> String {
    format!("user does not have permissions to perform the operation: {reason}")
}

/// Reading the VolumeSnapshot failed.
pub fn snapshot_unreadable(namespace: &str, name: &str, error: &str) -> String {
    format!("failed to get VolumeSnapshot '{namespace}/{name}': {error}")
}

/// The VolumeSnapshot is not ready to use.
pub fn snapshot_not_ready(name: &str) -> String {
    format!("the VolumeSnapshot is not yet ready, name: {name}")
}

/// The ready VolumeSnapshot names no content.
pub fn no_bound_content(name: &str) -> String {
    format!("boundVolumeSnapshotContentName is not set in VolumeSnapshot status, name: {name}")
}

/// Reading the VolumeSnapshotContent `name` failed.
pub fn content_unreadable(name: &str, error: &str) -> String {
    format!("failed to get VolumeSnapshotContent '{name}': {error}")
}

/// The content is not ready to use.
pub fn content_not_ready(name: &str) -> String {
    format!("the VolumeSnapshotContent is not yet ready, name: {name}")
}

/// The ready content has no snapshot handle.
pub fn no_handle(name: &str) -> String {
    format!("snapshotHandle is not set in VolumeSnapshotContent status, name: {name}")
}

/// The audience could not be read from the driver's SnapshotMetadataService
/// (Internal).
pub fn no_service_resource(driver: &str, error: &str) -> String {
    format!("failed to find the SnapshotMetadataService CR for driver '{driver}': {error}")
}

/// The snapshot's VolumeSnapshotClass could not be read (Unavailable).
pub fn class_unreadable(class: &str, error: &str) -> String {
    format!("failed to get VolumeSnapshotClass '{class}': {error}")
}

/// The snapshot names no class and the driver has several default classes
/// (Unavailable).
pub fn several_default_classes(driver: &str) -> String {
    format!("multiple default VolumeSnapshotClasses are set for the CSI driver '{driver}'")
}

/// The snapshot names no class and the driver has no default class
/// (Unavailable).
pub fn no_default_class(driver: &str) -> String {
    format!("no default VolumeSnapshotClass is set for the CSI driver '{driver}'")
}

/// The class's snapshotter secret parameters are invalid (Unavailable).
pub fn invalid_class_secret(error: &str) -> String {
    format!("invalid snapshotter secret parameters in VolumeSnapshotClass: {error}")
}

/// The snapshotter secret could not be read (Unavailable).
pub fn credentials_unreadable(error: &str) -> String {
    format!("failed to get credentials: {error}")
}

/// The snapshot's content is another driver's.
pub fn other_driver(name: &str, driver: &str) -> String {
    format!("VolumeSnapshot '{name}' does not belong to the CSI driver '{driver}'")
}

/// A driver error that is not a gRPC status.
pub fn driver_failed(error: &str) -> String {
    format!("failed to get response from CSI driver: {error}")
}

/// The driver lacks the capability (start-up exits 1 with this).
pub fn unsupported(driver: &str) -> String {
    format!("CSI driver {driver} does not support the SNAPSHOT_METADATA_SERVICE")
}

/// `--tls-min-version` values (Go's `crypto/tls` constant names): TLS 1.2
/// and TLS 1.3.
pub const TLS_VERSIONS: [&str; 2] = ["VersionTLS12", "VersionTLS13"];

/// Go's names of the TLS 1.2 cipher suites `--tls-cipher-suites` may name,
/// each with its IANA name (Go's current names are the IANA ones; the
/// ChaCha20 suites also have a shorter legacy name).
pub const CIPHER_SUITE_NAMES: &[(&str, &str)] = &[
    ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
];

/// Go's names of the key exchange groups `--tls-curve-preferences` may
/// name, each with its IANA name.
pub const CURVE_NAMES: &[(&str, &str)] = &[
    ("CurveP256", "secp256r1"),
    ("CurveP384", "secp384r1"),
    ("CurveP521", "secp521r1"),
    ("X25519", "X25519"),
    ("X25519MLKEM768", "X25519MLKEM768"),
];
