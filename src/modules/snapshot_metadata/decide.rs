//! The snapshot-metadata module's decisions, pure: each request's checks in
//! upstream's order, every refusal with upstream's gRPC code and message
//! (`compat::snapshot_metadata`). `request.rs` runs them around its
//! TokenReview, SubjectAccessReview and cache reads.

use tonic::Code;

use crate::compat::snapshot_metadata as upstream;

/// What a client asked: the fields the checks read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked<'a> {
    /// `GetMetadataAllocated`.
    Allocated {
        /// `security_token`.
        token: &'a str,
        /// `namespace`.
        namespace: &'a str,
        /// `snapshot_name`.
        snapshot: &'a str,
    },
    /// `GetMetadataDelta`.
    Delta {
        /// `security_token`.
        token: &'a str,
        /// `namespace`.
        namespace: &'a str,
        /// `base_snapshot_id`: a CSI snapshot handle.
        base_id: &'a str,
        /// `target_snapshot_name`: a VolumeSnapshot name.
        target: &'a str,
    },
}

/// A refused request: the status its client gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The gRPC code.
    pub code: Code,
    /// The status message.
    pub message: String,
}

impl Refusal {
    fn new(code: Code, message: impl Into<String>) -> Refusal {
        Refusal { code, message: message.into() }
    }
}

/// Step 1: every field the request needs is there, checked in upstream's
/// order (token, namespace, then the snapshot names).
pub fn validate(asked: &Asked<'_>) -> Result<(), Refusal> {
    let (token, namespace, names): (&str, &str, &[(&str, &str)]) = match asked {
        Asked::Allocated { token, namespace, snapshot } => (token, namespace, &[(snapshot, upstream::NO_SNAPSHOT)]),
        Asked::Delta { token, namespace, base_id, target } => {
            (token, namespace, &[(base_id, upstream::NO_BASE), (target, upstream::NO_TARGET)])
        }
    };
    let missing = [(token, upstream::NO_TOKEN), (namespace, upstream::NO_NAMESPACE)]
        .into_iter()
        .chain(names.iter().copied())
        .find(|(value, _)| value.is_empty());
    match missing {
        Some((_, message)) => Err(Refusal::new(Code::InvalidArgument, message)),
        None => Ok(()),
    }
}

/// What the TokenReview answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reviewed<'a> {
    /// Its status: authenticated, and the audiences the token is valid for.
    Status {
        /// `status.authenticated`.
        authenticated: bool,
        /// `status.audiences`.
        audiences: &'a [String],
    },
    /// The review could not be made (its error).
    Failed(&'a str),
}

/// Step 2: the token authenticates a user for `audience`.
pub fn authenticated(review: &Reviewed<'_>, audience: &str) -> Result<(), Refusal> {
    match review {
        Reviewed::Failed(e) => Err(Refusal::new(Code::Internal, upstream::authentication_failed(e))),
        Reviewed::Status { authenticated: true, audiences } if audiences.iter().any(|a| a == audience) => Ok(()),
        Reviewed::Status { .. } => Err(Refusal::new(Code::Unauthenticated, upstream::UNAUTHENTICATED)),
    }
}

/// Step 3: the SubjectAccessReview of `get volumesnapshots` in the
/// request's namespace: `Ok(allowed, reason)`, or its error.
pub fn authorized(review: Result<(bool, &str), &str>) -> Result<(), Refusal> {
    match review {
        Ok((true, _)) => Ok(()),
        Ok((false, reason)) => Err(Refusal::new(Code::PermissionDenied, upstream::permission_denied(reason))),
        Err(e) => Err(Refusal::new(Code::Internal, upstream::authorization_failed(e))),
    }
}

/// A VolumeSnapshot as step 5 reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotSeen<'a> {
    /// `status.readyToUse`.
    pub ready: bool,
    /// `status.boundVolumeSnapshotContentName`.
    pub content: Option<&'a str>,
}

/// A VolumeSnapshotContent as step 5 reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentSeen<'a> {
    /// `status.readyToUse`.
    pub ready: bool,
    /// `status.snapshotHandle`.
    pub handle: Option<&'a str>,
    /// `spec.driver`.
    pub driver: &'a str,
}

/// Step 5, the snapshot: ready and bound, else the content to read next.
pub fn bound_content<'a>(
    namespace: &str,
    name: &str,
    snapshot: Result<SnapshotSeen<'a>, &str>,
) -> Result<&'a str, Refusal> {
    let unavailable = |m: String| Refusal::new(Code::Unavailable, m);
    let seen = snapshot.map_err(|e| unavailable(upstream::snapshot_unreadable(namespace, name, e)))?;
    if !seen.ready {
        return Err(unavailable(upstream::snapshot_not_ready(name)));
    }
    seen.content.filter(|c| !c.is_empty()).ok_or_else(|| unavailable(upstream::no_bound_content(name)))
}

/// Step 5, the content `name` of VolumeSnapshot `snapshot`: ready, with a
/// handle, of this driver; the handle.
pub fn snapshot_handle<'a>(
    snapshot: &str,
    name: &str,
    content: Result<ContentSeen<'a>, &str>,
    driver: &str,
) -> Result<&'a str, Refusal> {
    let unavailable = |m: String| Refusal::new(Code::Unavailable, m);
    let seen = content.map_err(|e| unavailable(upstream::content_unreadable(name, e)))?;
    if !seen.ready {
        return Err(unavailable(upstream::content_not_ready(name)));
    }
    let handle = seen.handle.filter(|h| !h.is_empty()).ok_or_else(|| unavailable(upstream::no_handle(name)))?;
    if seen.driver != driver {
        return Err(Refusal::new(Code::InvalidArgument, upstream::other_driver(snapshot, driver)));
    }
    Ok(handle)
}

/// A VolumeSnapshotClass as step 6 reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassSeen<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `driver`.
    pub driver: &'a str,
    /// The default-class annotation is `"true"`.
    pub default: bool,
}

/// Step 6, a snapshot without a class: the driver's one default class.
pub fn default_class<'a>(classes: &[ClassSeen<'a>], driver: &str) -> Result<&'a str, Refusal> {
    let mut defaults = classes.iter().filter(|c| c.driver == driver && c.default);
    let unavailable = |m: String| Refusal::new(Code::Unavailable, m);
    match (defaults.next(), defaults.next()) {
        (Some(one), None) => Ok(one.name),
        (Some(_), Some(_)) => Err(unavailable(upstream::several_default_classes(driver))),
        (None, _) => Err(unavailable(upstream::no_default_class(driver))),
    }
}

#[cfg(test)]
mod tests;
