//! What the process's own role allows, asked of the apiserver
//! (SelfSubjectAccessReview, which every authenticated user may create), so
//! an optional part can be left off with one clear line instead of a watch
//! refused and retried forever.

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::{Api, Client, api::PostParams};

/// Whether the role may `verb` `resource` of `group` in every namespace.
pub async fn may_cluster_wide(client: &Client, group: &str, resource: &str, verb: &str) -> Result<bool, kube::Error> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                verb: Some(verb.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone()).create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}
