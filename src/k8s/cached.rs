//! Compact cached forms of the kinds a CSI driver can have thousands of.
//!
//! k8s-openapi's `PersistentVolume` is 3.4 KB before any string is allocated
//! (every in-tree volume source is an inline `Option`), and a
//! `VolumeAttachment` embeds a whole `PersistentVolumeSpec` for inline
//! volumes. The watch decodes straight into these types, which keep only
//! the fields the modules read (unknown fields are skipped by serde), so a
//! cached CSI PV costs a few hundred bytes plus its strings. Modules turn a
//! cached object back into the k8s-openapi type with `to_full` where they
//! need one; the fields not kept are then `None`.

use std::{borrow::Cow, collections::BTreeMap};

use k8s_openapi::{
    api::{
        core::v1::{
            CSIPersistentVolumeSource, ModifyVolumeStatus, ObjectReference, PersistentVolume, PersistentVolumeClaim,
            PersistentVolumeClaimCondition, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
            PersistentVolumeSpec, PersistentVolumeStatus, Pod, SecretReference, TypedLocalObjectReference,
            TypedObjectReference, VolumeNodeAffinity, VolumeResourceRequirements,
        },
        storage::v1::{VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus},
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, ObjectMeta},
    },
};
use kube::Resource;
use serde::{Deserialize, Deserializer};

/// `ObjectMeta` as decoded for the cache: `managedFields` (often half of
/// an object's JSON) and `selfLink` are skipped by serde instead of being
/// allocated and dropped, so the initial list does not leave the heap
/// fragmented with their remains.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
    resource_version: Option<String>,
    uid: Option<String>,
}

pub(crate) fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m: Option<WireMeta> = Deserialize::deserialize(d)?;
    let Some(m) = m else { return Ok(ObjectMeta::default()) };
    Ok(ObjectMeta {
        annotations: m.annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        generate_name: m.generate_name,
        generation: m.generation,
        labels: m.labels,
        managed_fields: None,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        self_link: None,
        uid: m.uid,
    })
}

/// Values with few distinct spellings across a cluster (access modes,
/// volume modes, reclaim policies, class and driver names, fs types) are
/// interned: each cached object holds a pointer to one shared copy instead of
/// its own allocations.
///
/// Interning happens while a watch event is decoded, before the driver
/// filter sees the object, so values of rejected (or deleted) objects do
/// enter the tables; pruning is what bounds them: once a table has grown to
/// twice its size after the last prune (at least [`PRUNE_FLOOR`] entries),
/// the values only the interner still holds are dropped. A table thus stays
/// within twice the distinct values live objects hold, plus the floor.
pub type Shared = std::sync::Arc<str>;
/// An interned list of such values.
pub type SharedList = std::sync::Arc<[Shared]>;

/// The table size below which an interner does not prune.
const PRUNE_FLOOR: usize = 1024;

/// A set of shared values that forgets those nothing else holds any more.
struct Interner<T: ?Sized> {
    set: std::collections::HashSet<std::sync::Arc<T>>,
    prune_at: usize,
}

impl<T: ?Sized + std::hash::Hash + Eq> Interner<T> {
    fn new() -> Self {
        Interner { set: Default::default(), prune_at: PRUNE_FLOOR }
    }

    /// The shared copy of `value`.
    fn intern<Q>(&mut self, value: &Q) -> std::sync::Arc<T>
    where
        Q: ?Sized + std::hash::Hash + Eq,
        std::sync::Arc<T>: std::borrow::Borrow<Q> + for<'a> From<&'a Q>,
    {
        if let Some(v) = self.set.get(value) {
            return v.clone();
        }
        if self.set.len() >= self.prune_at {
            self.prune();
        }
        let v = std::sync::Arc::<T>::from(value);
        self.set.insert(v.clone());
        v
    }

    /// Drops the values only the interner holds.
    fn prune(&mut self) {
        self.set.retain(|v| std::sync::Arc::strong_count(v) > 1);
        self.prune_at = (2 * self.set.len()).max(PRUNE_FLOOR);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.set.len()
    }
}

type Table<T> = std::sync::LazyLock<parking_lot::Mutex<Interner<T>>>;
static STRINGS: Table<str> = std::sync::LazyLock::new(|| parking_lot::Mutex::new(Interner::new()));
static LISTS: Table<[Shared]> = std::sync::LazyLock::new(|| parking_lot::Mutex::new(Interner::new()));

fn lock<T: ?Sized>(table: &Table<T>) -> parking_lot::MutexGuard<'_, Interner<T>> {
    table.lock()
}

fn intern(s: &str) -> Shared {
    lock(&STRINGS).intern(s)
}

fn intern_list(items: Vec<String>) -> SharedList {
    let list: Vec<Shared> = items.iter().map(|s| intern(s)).collect();
    lock(&LISTS).intern(&list[..])
}

/// Prunes both interners now (lists first: that releases their strings).
#[cfg(test)]
fn prune_interned() -> (usize, usize) {
    let lists = {
        let mut l = lock(&LISTS);
        l.prune();
        l.len()
    };
    let mut s = lock(&STRINGS);
    s.prune();
    (s.len(), lists)
}

fn shared<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Shared>, D::Error> {
    let v: Option<String> = Deserialize::deserialize(d)?;
    Ok(v.map(|v| intern(&v)))
}

fn shared_required<'de, D: Deserializer<'de>>(d: D) -> Result<Shared, D::Error> {
    let v: Option<String> = Deserialize::deserialize(d)?;
    Ok(intern(v.as_deref().unwrap_or_default()))
}

fn shared_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SharedList>, D::Error> {
    let v: Option<Vec<String>> = Deserialize::deserialize(d)?;
    Ok(v.map(intern_list))
}

fn owned(v: &Option<Shared>) -> Option<String> {
    v.as_deref().map(str::to_string)
}

fn owned_list(v: &Option<SharedList>) -> Option<Vec<String>> {
    v.as_ref().map(|l| l.iter().map(|s| s.to_string()).collect())
}

/// A string map as a boxed slice: a `BTreeMap` node costs ~540 bytes even
/// for one entry.
pub type SmallMap = Box<[(String, String)]>;

fn small_map<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SmallMap>, D::Error> {
    let m: Option<BTreeMap<String, String>> = Deserialize::deserialize(d)?;
    Ok(m.map(|m| m.into_iter().collect()))
}

/// Only the `storage` entry of a resource list (all a CSI sidecar reads).
fn storage_of<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Quantity>, D::Error> {
    let m: Option<BTreeMap<String, Quantity>> = Deserialize::deserialize(d)?;
    Ok(m.and_then(|mut m| m.remove("storage")))
}

fn storage_map(q: &Option<Quantity>) -> Option<BTreeMap<String, Quantity>> {
    q.as_ref().map(|q| BTreeMap::from([("storage".to_string(), q.clone())]))
}

/// Implements [`Resource`] for a cached form by borrowing the real kind's
/// identity, so URLs, kinds and object references are the real ones.
macro_rules! resource_as {
    ($cached:ty, $real:ty) => {
        impl Resource for $cached {
            type DynamicType = ();
            type Scope = <$real as Resource>::Scope;

            fn kind(_: &()) -> Cow<'_, str> {
                <$real as Resource>::kind(&())
            }
            fn group(_: &()) -> Cow<'_, str> {
                <$real as Resource>::group(&())
            }
            fn version(_: &()) -> Cow<'_, str> {
                <$real as Resource>::version(&())
            }
            fn plural(_: &()) -> Cow<'_, str> {
                <$real as Resource>::plural(&())
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub(crate) use resource_as;

/// A PersistentVolume as cached: metadata, the CSI-relevant spec, status.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedPv {
    #[serde(default, deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    pub spec: Option<CachedPvSpec>,
    pub status: Option<PersistentVolumeStatus>,
}

/// The parts of a `PersistentVolumeSpec` a CSI sidecar reads. Of the
/// in-tree volume sources only those with a CSI migration target are kept
/// (boxed: one pointer each when absent), for the driver that serves them
/// (`crate::migration`); the attach-detach controller translates migrated
/// inline volumes to a CSI source before they reach a VolumeAttachment.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPvSpec {
    #[serde(default, deserialize_with = "shared_list")]
    pub access_modes: Option<SharedList>,
    /// `capacity.storage`.
    #[serde(rename = "capacity", default, deserialize_with = "storage_of")]
    pub capacity_storage: Option<Quantity>,
    pub claim_ref: Option<Box<ObjectReference>>,
    pub csi: Option<Box<CachedCsiSource>>,
    pub mount_options: Option<Vec<String>>,
    pub node_affinity: Option<Box<VolumeNodeAffinity>>,
    #[serde(default, deserialize_with = "shared")]
    pub persistent_volume_reclaim_policy: Option<Shared>,
    #[serde(default, deserialize_with = "shared")]
    pub storage_class_name: Option<Shared>,
    pub volume_attributes_class_name: Option<String>,
    #[serde(default, deserialize_with = "shared")]
    pub volume_mode: Option<Shared>,
    /// In-tree sources with a CSI migration target.
    pub aws_elastic_block_store: Option<Box<k8s_openapi::api::core::v1::AWSElasticBlockStoreVolumeSource>>,
    /// See `aws_elastic_block_store`.
    pub gce_persistent_disk: Option<Box<k8s_openapi::api::core::v1::GCEPersistentDiskVolumeSource>>,
    /// See `aws_elastic_block_store`.
    pub azure_disk: Option<Box<k8s_openapi::api::core::v1::AzureDiskVolumeSource>>,
    /// See `aws_elastic_block_store`.
    pub azure_file: Option<Box<k8s_openapi::api::core::v1::AzureFilePersistentVolumeSource>>,
    /// See `aws_elastic_block_store`.
    pub cinder: Option<Box<k8s_openapi::api::core::v1::CinderPersistentVolumeSource>>,
    /// See `aws_elastic_block_store`.
    pub vsphere_volume: Option<Box<k8s_openapi::api::core::v1::VsphereVirtualDiskVolumeSource>>,
    /// See `aws_elastic_block_store`.
    pub portworx_volume: Option<Box<k8s_openapi::api::core::v1::PortworxVolumeSource>>,
}

resource_as!(CachedPv, PersistentVolume);

/// `CSIPersistentVolumeSource` with its attributes in a [`SmallMap`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedCsiSource {
    #[serde(default, deserialize_with = "shared_required")]
    pub driver: Shared,
    #[serde(default)]
    pub volume_handle: String,
    #[serde(default, deserialize_with = "shared")]
    pub fs_type: Option<Shared>,
    pub read_only: Option<bool>,
    #[serde(default, deserialize_with = "small_map")]
    pub volume_attributes: Option<SmallMap>,
    pub controller_expand_secret_ref: Option<Box<SecretReference>>,
    pub controller_publish_secret_ref: Option<Box<SecretReference>>,
    pub node_expand_secret_ref: Option<Box<SecretReference>>,
    pub node_publish_secret_ref: Option<Box<SecretReference>>,
    pub node_stage_secret_ref: Option<Box<SecretReference>>,
}

impl CachedCsiSource {
    /// The k8s-openapi form.
    pub fn to_full(&self) -> CSIPersistentVolumeSource {
        let secret = |r: &Option<Box<SecretReference>>| r.as_deref().cloned();
        CSIPersistentVolumeSource {
            driver: self.driver.to_string(),
            volume_handle: self.volume_handle.clone(),
            fs_type: owned(&self.fs_type),
            read_only: self.read_only,
            volume_attributes: self.volume_attributes.as_ref().map(|m| m.iter().cloned().collect()),
            controller_expand_secret_ref: secret(&self.controller_expand_secret_ref),
            controller_publish_secret_ref: secret(&self.controller_publish_secret_ref),
            node_expand_secret_ref: secret(&self.node_expand_secret_ref),
            node_publish_secret_ref: secret(&self.node_publish_secret_ref),
            node_stage_secret_ref: secret(&self.node_stage_secret_ref),
        }
    }
}

/// A PersistentVolumeClaim as cached: metadata, the spec fields the
/// provisioner and resizer read, and the status fields of a resize or a
/// modification (boxed: `None` costs one pointer).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedPvc {
    #[serde(default, deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    pub spec: Option<CachedPvcSpec>,
    pub status: Option<Box<CachedPvcStatus>>,
}

/// The parts of a `PersistentVolumeClaimStatus` the resizer reads (only the
/// `storage` entries of the resource maps).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedPvcStatus {
    #[serde(default, deserialize_with = "shared")]
    pub phase: Option<Shared>,
    /// `capacity.storage`.
    #[serde(rename = "capacity", default, deserialize_with = "storage_of")]
    pub capacity_storage: Option<Quantity>,
    /// `allocatedResources.storage`.
    #[serde(rename = "allocatedResources", default, deserialize_with = "storage_of")]
    pub allocated_storage: Option<Quantity>,
    /// `allocatedResourceStatuses.storage`.
    #[serde(rename = "allocatedResourceStatuses", default, deserialize_with = "storage_status_of")]
    pub allocated_status_storage: Option<Shared>,
    #[serde(default)]
    pub conditions: Option<Vec<PersistentVolumeClaimCondition>>,
    pub current_volume_attributes_class_name: Option<String>,
    pub modify_volume_status: Option<ModifyVolumeStatus>,
    /// `healthStatus` (Kubernetes 1.37+, gated): the health monitor's field,
    /// kept as the apiserver sent it (k8s-openapi's 1.34 types lack it).
    #[serde(default)]
    pub health_status: Option<Box<serde_json::Value>>,
}

fn storage_status_of<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Shared>, D::Error> {
    let m: Option<BTreeMap<String, String>> = Deserialize::deserialize(d)?;
    Ok(m.and_then(|m| m.get("storage").map(|v| intern(v))))
}

impl CachedPvcStatus {
    /// The k8s-openapi form.
    pub fn to_full(&self) -> PersistentVolumeClaimStatus {
        PersistentVolumeClaimStatus {
            phase: owned(&self.phase),
            capacity: storage_map(&self.capacity_storage),
            allocated_resources: storage_map(&self.allocated_storage),
            allocated_resource_statuses: self
                .allocated_status_storage
                .as_ref()
                .map(|v| BTreeMap::from([("storage".to_string(), v.to_string())])),
            conditions: self.conditions.clone(),
            current_volume_attributes_class_name: self.current_volume_attributes_class_name.clone(),
            modify_volume_status: self.modify_volume_status.clone(),
            ..Default::default()
        }
    }
}

/// The parts of a `PersistentVolumeClaimSpec` kept.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPvcSpec {
    #[serde(default, deserialize_with = "shared_list")]
    pub access_modes: Option<SharedList>,
    pub data_source: Option<Box<TypedLocalObjectReference>>,
    pub data_source_ref: Option<Box<TypedObjectReference>>,
    /// `resources.requests.storage`.
    #[serde(rename = "resources", default, deserialize_with = "requested_storage")]
    pub requested_storage: Option<Quantity>,
    pub selector: Option<Box<LabelSelector>>,
    #[serde(default, deserialize_with = "shared")]
    pub storage_class_name: Option<Shared>,
    pub volume_attributes_class_name: Option<String>,
    #[serde(default, deserialize_with = "shared")]
    pub volume_mode: Option<Shared>,
    pub volume_name: Option<String>,
}

fn requested_storage<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Quantity>, D::Error> {
    #[derive(Deserialize)]
    struct Resources {
        #[serde(default, deserialize_with = "storage_of")]
        requests: Option<Quantity>,
    }
    let r: Option<Resources> = Deserialize::deserialize(d)?;
    Ok(r.and_then(|r| r.requests))
}

resource_as!(CachedPvc, PersistentVolumeClaim);

impl CachedPvc {
    /// The PersistentVolumeClaim with the kept fields.
    pub fn to_full(&self) -> PersistentVolumeClaim {
        let spec = self.spec.as_ref().map(|s| PersistentVolumeClaimSpec {
            access_modes: owned_list(&s.access_modes),
            data_source: s.data_source.as_deref().cloned(),
            data_source_ref: s.data_source_ref.as_deref().cloned(),
            resources: s
                .requested_storage
                .as_ref()
                .map(|q| VolumeResourceRequirements { requests: storage_map(&Some(q.clone())), ..Default::default() }),
            selector: s.selector.as_deref().cloned(),
            storage_class_name: owned(&s.storage_class_name),
            volume_attributes_class_name: s.volume_attributes_class_name.clone(),
            volume_mode: owned(&s.volume_mode),
            volume_name: s.volume_name.clone(),
        });
        let status = self.status.as_deref().map(CachedPvcStatus::to_full);
        PersistentVolumeClaim { metadata: self.metadata.clone(), spec, status }
    }
}

impl CachedPvSpec {
    /// The full spec with the kept fields.
    pub fn to_full(&self) -> PersistentVolumeSpec {
        PersistentVolumeSpec {
            access_modes: owned_list(&self.access_modes),
            capacity: storage_map(&self.capacity_storage),
            claim_ref: self.claim_ref.as_deref().cloned(),
            csi: self.csi.as_deref().map(CachedCsiSource::to_full),
            mount_options: self.mount_options.clone(),
            node_affinity: self.node_affinity.as_deref().cloned(),
            persistent_volume_reclaim_policy: owned(&self.persistent_volume_reclaim_policy),
            storage_class_name: owned(&self.storage_class_name),
            volume_attributes_class_name: self.volume_attributes_class_name.clone(),
            volume_mode: owned(&self.volume_mode),
            aws_elastic_block_store: self.aws_elastic_block_store.as_deref().cloned(),
            gce_persistent_disk: self.gce_persistent_disk.as_deref().cloned(),
            azure_disk: self.azure_disk.as_deref().cloned(),
            azure_file: self.azure_file.as_deref().cloned(),
            cinder: self.cinder.as_deref().cloned(),
            vsphere_volume: self.vsphere_volume.as_deref().cloned(),
            portworx_volume: self.portworx_volume.as_deref().cloned(),
            ..Default::default()
        }
    }

    /// The CSI driver of the volume, if it is a CSI volume.
    pub fn csi_driver(&self) -> Option<&str> {
        self.csi.as_deref().map(|c| &*c.driver)
    }

    /// The CSI driver that serves the volume's in-tree source (CSI
    /// migration), if it has one.
    pub fn migrated_driver(&self) -> Option<&'static str> {
        use crate::migration::Plugin;
        let plugin = [
            (self.aws_elastic_block_store.is_some(), Plugin::AwsEbs),
            (self.gce_persistent_disk.is_some(), Plugin::GcePd),
            (self.azure_disk.is_some(), Plugin::AzureDisk),
            (self.azure_file.is_some(), Plugin::AzureFile),
            (self.cinder.is_some(), Plugin::Cinder),
            (self.vsphere_volume.is_some(), Plugin::Vsphere),
            (self.portworx_volume.is_some(), Plugin::Portworx),
        ]
        .into_iter()
        .find_map(|(present, p)| present.then_some(p))?;
        Some(plugin.csi_driver())
    }
}

impl CachedPv {
    /// The PersistentVolume with the kept fields.
    pub fn to_full(&self) -> PersistentVolume {
        PersistentVolume {
            metadata: self.metadata.clone(),
            spec: self.spec.as_ref().map(CachedPvSpec::to_full),
            status: self.status.clone(),
        }
    }

    /// An annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.annotations.as_ref()?.get(key).map(String::as_str)
    }
}

/// A VolumeAttachment as cached.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedVa {
    #[serde(default, deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: CachedVaSpec,
    pub status: Option<VolumeAttachmentStatus>,
}

/// `VolumeAttachmentSpec` with the inline volume spec boxed and compact.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedVaSpec {
    #[serde(default, deserialize_with = "shared_required")]
    pub attacher: Shared,
    #[serde(default)]
    pub node_name: String,
    #[serde(default)]
    pub source: CachedVaSource,
}

/// `VolumeAttachmentSource`: a PV name or an inline (migrated) volume spec.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedVaSource {
    pub persistent_volume_name: Option<String>,
    pub inline_volume_spec: Option<Box<CachedPvSpec>>,
}

resource_as!(CachedVa, VolumeAttachment);

impl CachedVa {
    /// The VolumeAttachment with the kept fields.
    pub fn to_full(&self) -> VolumeAttachment {
        VolumeAttachment {
            metadata: self.metadata.clone(),
            spec: VolumeAttachmentSpec {
                attacher: self.spec.attacher.to_string(),
                node_name: self.spec.node_name.clone(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: self.spec.source.persistent_volume_name.clone(),
                    inline_volume_spec: self.spec.source.inline_volume_spec.as_deref().map(CachedPvSpec::to_full),
                },
            },
            status: self.status.clone(),
        }
    }

    /// The name of the PV this attachment is for, if it is not inline.
    pub fn pv_name(&self) -> Option<&str> {
        self.spec.source.persistent_volume_name.as_deref()
    }
}

/// A Pod as cached for the resizer's in-use check: its identity, the
/// claims it mounts and whether it has terminated; nothing else.
#[derive(Clone, Debug, Default)]
pub struct CachedPod {
    /// Name, namespace, UID and resourceVersion only.
    pub metadata: ObjectMeta,
    /// `spec.volumes[*].persistentVolumeClaim.claimName`.
    pub claims: Box<[String]>,
    /// `status.phase` is `Succeeded` or `Failed`.
    pub terminated: bool,
    /// `spec.nodeName` (the health monitor's node watcher).
    pub node_name: Option<Shared>,
}

resource_as!(CachedPod, Pod);

impl<'de> Deserialize<'de> for CachedPod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta {
            name: Option<String>,
            namespace: Option<String>,
            uid: Option<String>,
            resource_version: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct ClaimSource {
            claim_name: String,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Volume {
            persistent_volume_claim: Option<ClaimSource>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Spec {
            #[serde(default)]
            volumes: Option<Vec<Volume>>,
            node_name: Option<String>,
        }
        #[derive(Deserialize)]
        struct Status {
            phase: Option<String>,
        }
        #[derive(Deserialize)]
        struct Wire {
            metadata: Option<Meta>,
            spec: Option<Spec>,
            status: Option<Status>,
        }
        let w = Wire::deserialize(d)?;
        let m = w.metadata.unwrap_or(Meta { name: None, namespace: None, uid: None, resource_version: None });
        let node_name = w.spec.as_ref().and_then(|s| s.node_name.as_deref()).map(intern);
        let claims = w
            .spec
            .and_then(|s| s.volumes)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|v| v.persistent_volume_claim.map(|c| c.claim_name))
            .collect();
        let phase = w.status.and_then(|s| s.phase);
        Ok(CachedPod {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                ..Default::default()
            },
            claims,
            terminated: matches!(phase.as_deref(), Some("Succeeded" | "Failed")),
            node_name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_keep_only_their_claims_and_whether_they_ended() {
        let pod: CachedPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"a": "b"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i"}],
                     "volumes": [{"name": "a", "persistentVolumeClaim": {"claimName": "data"}},
                                 {"name": "b", "emptyDir": {}},
                                 {"name": "c", "persistentVolumeClaim": {"claimName": "logs", "readOnly": true}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        assert_eq!(&*pod.claims, ["data".to_string(), "logs".to_string()]);
        assert!(!pod.terminated);
        assert!(pod.metadata.labels.is_none() && pod.metadata.managed_fields.is_none());
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ns"));
        let done: CachedPod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "q"}, "status": {"phase": "Succeeded"}}))
                .unwrap();
        assert!(done.terminated && done.claims.is_empty());
        assert_eq!(CachedPod::kind(&()), "Pod");
    }

    #[test]
    fn claim_status_keeps_the_resize_fields() {
        let pvc: CachedPvc = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"volumeName": "pv1", "resources": {"requests": {"storage": "2Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                       "allocatedResources": {"storage": "2Gi"},
                       "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress", "x": "y"},
                       "conditions": [{"type": "Resizing", "status": "True"}],
                       "modifyVolumeStatus": {"status": "InProgress", "targetVolumeAttributesClassName": "gold"}}
        }))
        .unwrap();
        let st = pvc.status.as_deref().unwrap();
        assert_eq!(st.allocated_status_storage.as_deref(), Some("ControllerResizeInProgress"));
        assert_eq!(st.allocated_storage, Some(Quantity("2Gi".into())));
        let full = pvc.to_full().status.unwrap();
        assert_eq!(full.capacity.unwrap()["storage"].0, "1Gi");
        assert_eq!(full.conditions.unwrap()[0].type_, "Resizing");
        assert_eq!(full.modify_volume_status.unwrap().target_volume_attributes_class_name.as_deref(), Some("gold"));
    }

    #[test]
    fn cached_forms_are_small() {
        // The point of this module: an order of magnitude below k8s-openapi's.
        assert!(std::mem::size_of::<CachedPv>() * 4 < std::mem::size_of::<PersistentVolume>());
        assert!(std::mem::size_of::<CachedVa>() * 4 < std::mem::size_of::<VolumeAttachment>());
        assert!(std::mem::size_of::<CachedPvc>() < std::mem::size_of::<PersistentVolumeClaim>());
    }

    #[test]
    fn decodes_the_wire_form_and_round_trips_kept_fields() {
        let pv: CachedPv = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv1", "annotations": {"pv.kubernetes.io/provisioned-by": "d"},
                         "managedFields": [{"manager": "kcm", "fieldsV1": {"f:spec": {}}}], "finalizers": ["f"]},
            "spec": {
                "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                "csi": {"driver": "d", "volumeHandle": "h", "fsType": "ext4", "volumeAttributes": {"a": "b"}},
                "hostPath": {"path": "/ignored"},
                "persistentVolumeReclaimPolicy": "Delete", "mountOptions": ["ro"],
                "claimRef": {"namespace": "ns", "name": "c", "uid": "u"}
            },
            "status": {"phase": "Bound"}
        }))
        .unwrap();
        assert_eq!(pv.annotation("pv.kubernetes.io/provisioned-by"), Some("d"));
        assert!(pv.metadata.managed_fields.is_none());
        assert_eq!(pv.metadata.finalizers.as_deref(), Some(&["f".to_string()][..]));
        let full = pv.to_full();
        let spec = full.spec.unwrap();
        assert_eq!(spec.csi.as_ref().unwrap().volume_handle, "h");
        assert_eq!(spec.csi.unwrap().volume_attributes.unwrap()["a"], "b");
        assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some("u"));
        assert_eq!(spec.mount_options.unwrap(), ["ro"]);
        assert!(spec.host_path.is_none());
        assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
        assert_eq!(full.status.unwrap().phase.as_deref(), Some("Bound"));

        let pvc: CachedPvc = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns", "annotations": {"volume.kubernetes.io/storage-provisioner": "d"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast", "volumeMode": "Block",
                     "resources": {"requests": {"storage": "5Gi", "other": "1"}, "limits": {"storage": "9Gi"}},
                     "dataSource": {"kind": "VolumeSnapshot", "name": "s", "apiGroup": "snapshot.storage.k8s.io"}},
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        let full = pvc.to_full();
        let spec = full.spec.unwrap();
        assert_eq!(
            spec.resources.unwrap().requests.unwrap().into_iter().collect::<Vec<_>>(),
            [("storage".to_string(), Quantity("5Gi".into()))]
        );
        assert_eq!(spec.data_source.unwrap().name, "s");
        assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
        assert_eq!(full.metadata.annotations.unwrap()["volume.kubernetes.io/storage-provisioner"], "d");

        let va: CachedVa = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "va1"},
            "spec": {"attacher": "d", "nodeName": "n1", "source": {"inlineVolumeSpec": {
                "csi": {"driver": "d", "volumeHandle": "inline"}, "accessModes": ["ReadOnlyMany"]}}},
            "status": {"attached": true, "attachmentMetadata": {"k": "v"}}
        }))
        .unwrap();
        assert_eq!(va.pv_name(), None);
        let full = va.to_full();
        assert_eq!(full.spec.node_name, "n1");
        assert_eq!(full.spec.source.inline_volume_spec.unwrap().csi.unwrap().volume_handle, "inline");
        assert!(full.status.unwrap().attached);
    }

    #[test]
    fn low_cardinality_values_are_shared() {
        let pv = |name: &str| -> CachedPv {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                         "csi": {"driver": "d.example.com", "volumeHandle": name, "fsType": "ext4"}}
            }))
            .unwrap()
        };
        let (a, b) = (pv("a"), pv("b"));
        let (sa, sb) = (a.spec.as_ref().unwrap(), b.spec.as_ref().unwrap());
        assert!(std::sync::Arc::ptr_eq(&sa.csi.as_ref().unwrap().driver, &sb.csi.as_ref().unwrap().driver));
        assert!(std::sync::Arc::ptr_eq(sa.access_modes.as_ref().unwrap(), sb.access_modes.as_ref().unwrap()));
        assert!(std::sync::Arc::ptr_eq(sa.volume_mode.as_ref().unwrap(), sb.volume_mode.as_ref().unwrap()));
        assert_eq!(a.to_full().spec.unwrap().access_modes.unwrap(), ["ReadWriteOnce"]);
        assert_eq!(b.to_full().spec.unwrap().csi.unwrap().fs_type.as_deref(), Some("ext4"));
    }

    /// A PV whose interned values (class, access mode, driver) are its own.
    fn pv_with_own_values(i: usize) -> CachedPv {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("pv{i}")},
            "spec": {"storageClassName": format!("class-{i}"), "accessModes": [format!("mode-{i}")],
                     "csi": {"driver": format!("d{i}.example.com"), "volumeHandle": "h"}}
        }))
        .expect("decodes")
    }

    #[test]
    fn values_of_dropped_objects_leave_the_interner_when_it_prunes() {
        let pvs: Vec<CachedPv> = (0..10_000).map(pv_with_own_values).collect();
        assert!(lock(&STRINGS).len() >= 10_000, "the live values are interned");
        drop(pvs);
        let (strings, lists) = prune_interned();
        // Near zero: what other tests running now hold.
        assert!(strings < 200 && lists < 200, "{strings} strings and {lists} lists left");
    }

    #[test]
    fn an_interner_keeps_its_live_values_and_at_most_twice_them_plus_the_floor() {
        let mut table = Interner::<str>::new();
        let live: Vec<Shared> = (0..300).map(|i| table.intern(&format!("live-{i}"))).collect();
        let mut largest = 0;
        for i in 0..10_000 {
            drop(table.intern(&format!("gone-{i}")));
            largest = largest.max(table.len());
        }
        assert!(largest <= 2 * PRUNE_FLOOR, "{largest} entries for {} live values", live.len());
        table.prune();
        assert_eq!(table.len(), live.len());
        // Shared values stay shared across prunes.
        assert!(live.iter().enumerate().all(|(i, v)| std::sync::Arc::ptr_eq(v, &table.intern(&format!("live-{i}")))));
    }

    #[test]
    fn resource_identity_is_the_real_kinds() {
        assert_eq!(CachedPv::url_path(&(), None), PersistentVolume::url_path(&(), None));
        assert_eq!(CachedVa::url_path(&(), None), VolumeAttachment::url_path(&(), None));
        assert_eq!(CachedVa::kind(&()), "VolumeAttachment");
    }
}
