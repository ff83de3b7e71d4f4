//! Names of the Kubernetes API itself that the shared runtime relies on.

/// The path prefix of the `events.k8s.io` API group (Event writes there
/// are deferrable, like core/v1's).
pub const EVENTS_API_PREFIX: &str = "/apis/events.k8s.io/";
/// The group and version discovery is asked for VolumeAttributesClass.
pub const STORAGE_V1: &str = "storage.k8s.io/v1";
/// The annotation kubectl keeps a whole copy of the object in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
