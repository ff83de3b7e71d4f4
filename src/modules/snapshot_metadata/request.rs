//! One request's checks against the Kubernetes API and the shared cache,
//! in upstream's order (`decide` makes each decision): the audience, the
//! TokenReview, the SubjectAccessReview, the VolumeSnapshot and its
//! content, the class's snapshotter secret.
//!
//! API requests per call: the TokenReview and the SubjectAccessReview (2
//! creates), the GET of the VolumeSnapshot (the module does not watch
//! VolumeSnapshots: a cluster has many, and the request names one), a
//! delta's GET of its base when it is no handle the cache knows (a
//! VolumeSnapshot's name), and the GET of the secret when the class names
//! one. The
//! SnapshotMetadataService, the content and the class come from the shared
//! cache, synced before the first request is admitted; a content the cache
//! does not have ready yet (the snapshot became ready a moment ago, or it is
//! another driver's, which the driver's view leaves out) is read from the
//! API, so the cache never makes an answer staler than upstream's. The CR
//! and the class are older than any snapshot a request names, so the cache
//! alone answers for them (and the module needs no `get` of either).

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec, UserInfo},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};
use tonic::Code;

use super::{
    cr::SnapshotMetadataService,
    decide::{self, ClassSeen, ContentSeen, Refusal, Reviewed, SnapshotSeen},
};
use crate::{
    compat::{snapshot_metadata as upstream, snapshotter as snap},
    k8s::{
        error_text,
        informers::Informer,
        secret_templates::{SecretKeys, class_secret_ref},
        secrets::secret_data,
        snapshot_api::{self, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent},
    },
};

/// What the checks read from.
#[derive(Clone)]
pub struct Checks {
    /// The module's client (its own budget).
    pub client: Client,
    /// The driver's name.
    pub driver: Arc<str>,
    /// `--audience` (empty: the SnapshotMetadataService's).
    pub audience: String,
    /// The SnapshotMetadataServices, watched when `--audience` is not set.
    pub services: Option<Informer<SnapshotMetadataService>>,
    /// The driver's VolumeSnapshotContents (the snapshotter's view), when
    /// the snapshot API is installed.
    pub contents: Option<Informer<VolumeSnapshotContent>>,
    /// Every VolumeSnapshotClass, when the snapshot API is installed.
    pub classes: Option<Informer<VolumeSnapshotClass>>,
}

/// A resolved VolumeSnapshot: its content's snapshot handle.
pub struct Resolved {
    /// `status.snapshotHandle` of its content.
    pub handle: String,
    /// The snapshot as read.
    pub snapshot: VolumeSnapshot,
    /// Its content's name.
    pub content: String,
}

fn refused(code: Code, message: String) -> Refusal {
    Refusal { code, message }
}

impl Checks {
    /// Step 2's audience: the flag, else the driver's SnapshotMetadataService
    /// from the cache (synced before the first request is admitted; the
    /// deployment creates the CR before any backup asks).
    fn audience(&self) -> Result<String, Refusal> {
        if !self.audience.is_empty() {
            return Ok(self.audience.clone());
        }
        let Some(services) = self.services.as_ref() else {
            let error = format!("the server does not serve {}/{}", super::cr::GROUP, super::cr::VERSION);
            return Err(refused(Code::Internal, upstream::no_service_resource(&self.driver, &error)));
        };
        match services.store().get_named(None, &self.driver) {
            Some(cr) => Ok(cr.spec.audience.clone()),
            None => {
                let error = format!("{}.{} \"{}\" not found", super::cr::PLURAL, super::cr::GROUP, self.driver);
                Err(refused(Code::Internal, upstream::no_service_resource(&self.driver, &error)))
            }
        }
    }

    /// Steps 2 and 3: the token's user may `get volumesnapshots` in `namespace`.
    pub async fn authorize(&self, token: &str, namespace: &str) -> Result<(), Refusal> {
        let user = self.authenticate(token).await?;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.to_string()),
                    verb: Some("get".into()),
                    group: Some(snapshot_api::GROUP.into()),
                    version: Some(snapshot_api::VERSION.into()),
                    resource: Some("volumesnapshots".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let made = Api::<SubjectAccessReview>::all(self.client.clone()).create(&PostParams::default(), &review).await;
        match made {
            Ok(r) => {
                let status = r.status.unwrap_or_default();
                decide::authorized(Ok((status.allowed, status.reason.as_deref().unwrap_or_default())))
            }
            Err(e) => decide::authorized(Err(&error_text(&e))),
        }
    }

    async fn authenticate(&self, token: &str) -> Result<UserInfo, Refusal> {
        let audience = self.audience()?;
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), audiences: Some(vec![audience.clone()]) },
            ..Default::default()
        };
        let made = Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review).await;
        let status = match made {
            Ok(r) => r.status.unwrap_or_default(),
            Err(e) => {
                let text = error_text(&e);
                decide::authenticated(&Reviewed::Failed(&text), &audience)?;
                return Err(refused(Code::Internal, upstream::authentication_failed(&text)));
            }
        };
        let audiences = status.audiences.unwrap_or_default();
        let reviewed = Reviewed::Status { authenticated: status.authenticated.unwrap_or(false), audiences: &audiences };
        decide::authenticated(&reviewed, &audience)?;
        Ok(status.user.unwrap_or_default())
    }

    /// Step 5: VolumeSnapshot `namespace/name`, ready, bound to a ready
    /// content of this driver with a handle.
    pub async fn resolve(&self, namespace: &str, name: &str) -> Result<Resolved, Refusal> {
        let got = Api::<VolumeSnapshot>::namespaced(self.client.clone(), namespace).get(name).await;
        let (snapshot, text) = match got {
            Ok(s) => (Some(s), String::new()),
            Err(e) => (None, error_text(&e)),
        };
        let status = snapshot.as_ref().and_then(|s| s.status.as_ref());
        let seen = match &snapshot {
            Some(_) => Ok(SnapshotSeen {
                ready: status.and_then(|s| s.ready_to_use).unwrap_or(false),
                content: status.and_then(|s| s.bound_volume_snapshot_content_name.as_deref()),
            }),
            None => Err(text.as_str()),
        };
        let content = decide::bound_content(namespace, name, seen)?.to_string();
        let ready = |c: &VolumeSnapshotContent| c.status.as_ref().and_then(|s| s.ready_to_use).unwrap_or(false);
        let cached = self.contents.as_ref().and_then(|i| i.store().get_named(None, &content)).filter(|c| ready(c));
        let read = match cached {
            Some(c) => Ok(c),
            None => Api::<VolumeSnapshotContent>::all(self.client.clone()).get(&content).await.map(Arc::new),
        };
        let (read, text) = match read {
            Ok(c) => (Some(c), String::new()),
            Err(e) => (None, error_text(&e)),
        };
        let seen = match &read {
            Some(c) => Ok(ContentSeen {
                ready: ready(c),
                handle: c.status.as_ref().and_then(|s| s.snapshot_handle.as_deref()),
                driver: &c.spec.driver,
            }),
            None => Err(text.as_str()),
        };
        let handle = decide::snapshot_handle(name, &content, seen, &self.driver)?.to_string();
        let snapshot = snapshot.unwrap_or_default();
        Ok(Resolved { handle, snapshot, content })
    }

    /// A delta's base: a CSI snapshot handle (the API's), or a VolumeSnapshot
    /// of the namespace by name (older clients' form), resolved as the
    /// target is. A name that is no VolumeSnapshot is a handle.
    pub async fn base_handle(&self, namespace: &str, base: &str) -> Result<String, Refusal> {
        // A handle of one of the driver's contents needs no request.
        let handle_of =
            |c: &VolumeSnapshotContent| c.status.as_ref().and_then(|s| s.snapshot_handle.as_deref()) == Some(base);
        if self.contents.as_ref().is_some_and(|i| i.store().state().iter().any(|c| handle_of(c))) {
            return Ok(base.to_string());
        }
        match Api::<VolumeSnapshot>::namespaced(self.client.clone(), namespace).get_opt(base).await {
            Ok(Some(_)) => Ok(self.resolve(namespace, base).await?.handle),
            Ok(None) | Err(_) => Ok(base.to_string()),
        }
    }

    /// Step 6: the data of the snapshotter secret the snapshot's class (or
    /// the driver's default class) names; none when it names none.
    pub async fn secrets(&self, resolved: &Resolved) -> Result<HashMap<String, String>, Refusal> {
        let unavailable = |m: String| refused(Code::Unavailable, m);
        let class_name = match &resolved.snapshot.spec.volume_snapshot_class_name {
            Some(c) => c.clone(),
            None => {
                let all = self.classes.as_ref().map(|i| i.store().state()).unwrap_or_default();
                let seen: Vec<ClassSeen<'_>> = all
                    .iter()
                    .map(|c| ClassSeen {
                        name: c.metadata.name.as_deref().unwrap_or_default(),
                        driver: &c.driver,
                        default: c.metadata.annotations.as_ref().and_then(|a| a.get(snap::ANN_DEFAULT_CLASS))
                            == Some(&"true".to_string()),
                    })
                    .collect();
                decide::default_class(&seen, &self.driver)?.to_string()
            }
        };
        // From the cache: a class is made before any snapshot of it is.
        let class = self.classes.as_ref().and_then(|i| i.store().get_named(None, &class_name)).ok_or_else(|| {
            let error = format!("volumesnapshotclasses.{} \"{class_name}\" not found", snapshot_api::GROUP);
            unavailable(upstream::class_unreadable(&class_name, &error))
        })?;
        let keys =
            SecretKeys { label: "Snapshotter", name: snap::PARAM_SECRET_NAME, namespace: snap::PARAM_SECRET_NAMESPACE };
        let snapshot_ns = resolved.snapshot.metadata.namespace.as_deref().unwrap_or_default();
        let snapshot_name = resolved.snapshot.metadata.name.as_deref().unwrap_or_default();
        let namespace_tokens =
            [(snap::TOKEN_CONTENT_NAME, resolved.content.as_str()), (snap::TOKEN_SNAPSHOT_NAMESPACE, snapshot_ns)];
        let name_tokens = [
            (snap::TOKEN_CONTENT_NAME, resolved.content.as_str()),
            (snap::TOKEN_SNAPSHOT_NAMESPACE, snapshot_ns),
            (snap::TOKEN_SNAPSHOT_NAME, snapshot_name),
        ];
        let named = class_secret_ref(class.parameters.as_ref(), &keys, &namespace_tokens, &name_tokens)
            .map_err(|e| unavailable(upstream::invalid_class_secret(&e)))?;
        match named {
            None => Ok(HashMap::new()),
            Some((name, namespace)) => secret_data(&self.client, &name, &namespace)
                .await
                .map_err(|e| unavailable(upstream::credentials_unreadable(&e))),
        }
    }
}
