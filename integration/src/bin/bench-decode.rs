//! JSON vs protobuf for the lists the shared cache decodes: the same PVs and
//! PVCs fetched from a real kube-apiserver in both encodings, each body
//! decoded in four ways, with decode time (median) and heap (peak during the
//! decode, kept after it) from a counting allocator.
//!
//! ```text
//! bench-decode [--objects 10000] [--runs 5]
//! ```

use std::{fmt::Write as _, time::Instant};

use anyhow::{Context, Result, bail};
use argh::FromArgs;
use csi_sidecar::k8s::cached::{CachedPv, CachedPvc};
use csi_sidecar_integration::{
    cluster::ControlPlane,
    kube_support::{csi_pv, pvc, unique_name},
};
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    core::ObjectList,
};
use peak_alloc::PeakAlloc;
use prost::Message;

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

const DRIVER: &str = "decode.csi.example.com";
/// The magic prefix of Kubernetes' protobuf encoding, before a `runtime.Unknown`.
const PROTOBUF_MAGIC: &[u8] = b"k8s\0";

/// Decoding benchmark: JSON vs protobuf lists of PVs and PVCs from a real apiserver.
#[derive(FromArgs)]
struct Args {
    /// PVs and PVCs to create (default 10000 each)
    #[argh(option, default = "10_000")]
    objects: usize,
    /// decodes per variant; the table shows medians (default 5)
    #[argh(option, default = "5")]
    runs: usize,
}

// The slim protobuf forms: only the fields the cache keeps. prost skips the
// fields a message does not declare (managedFields, selfLink, ...) without
// allocating them, as csi-sidecar's serde forms do for JSON.

#[derive(Clone, PartialEq, Message)]
struct SlimMeta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(message, optional, tag = "9")]
    deletion_timestamp: Option<k8s_pb::apimachinery::pkg::apis::meta::v1::Time>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: std::collections::BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: std::collections::BTreeMap<String, String>,
    #[prost(string, repeated, tag = "14")]
    finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct SlimPv {
    #[prost(message, optional, tag = "1")]
    metadata: Option<SlimMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<k8s_pb::api::core::v1::PersistentVolumeSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<k8s_pb::api::core::v1::PersistentVolumeStatus>,
}

#[derive(Clone, PartialEq, Message)]
struct SlimPvList {
    #[prost(message, repeated, tag = "2")]
    items: Vec<SlimPv>,
}

#[derive(Clone, PartialEq, Message)]
struct SlimPvc {
    #[prost(message, optional, tag = "1")]
    metadata: Option<SlimMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<k8s_pb::api::core::v1::PersistentVolumeClaimSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<k8s_pb::api::core::v1::PersistentVolumeClaimStatus>,
}

#[derive(Clone, PartialEq, Message)]
struct SlimPvcList {
    #[prost(message, repeated, tag = "2")]
    items: Vec<SlimPvc>,
}

/// One way of decoding a list body into items.
struct Variant {
    label: &'static str,
    protobuf: bool,
    decode: fn(&[u8]) -> Result<Box<dyn std::any::Any>>,
}

/// The list inside a protobuf body: the magic, then a `runtime.Unknown` whose `raw` is the list.
fn unwrap_protobuf(body: &[u8]) -> Result<Vec<u8>> {
    let Some(rest) = body.strip_prefix(PROTOBUF_MAGIC) else { bail!("not a Kubernetes protobuf body") };
    let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(rest)?;
    unknown.raw.context("runtime.Unknown without raw")
}

fn json<T: serde::de::DeserializeOwned + 'static>(body: &[u8]) -> Result<Box<dyn std::any::Any>> {
    Ok(Box::new(serde_json::from_slice::<T>(body)?))
}

fn proto<T: Message + Default + 'static>(body: &[u8]) -> Result<Box<dyn std::any::Any>> {
    let raw = unwrap_protobuf(body)?;
    Ok(Box::new(T::decode(raw.as_slice())?))
}

fn variants(kind: &str) -> Vec<Variant> {
    match kind {
        "persistentvolumes" => vec![
            Variant {
                label: "JSON → k8s-openapi (full)",
                protobuf: false,
                decode: json::<ObjectList<PersistentVolume>>,
            },
            Variant { label: "JSON → csi-sidecar compact", protobuf: false, decode: json::<ObjectList<CachedPv>> },
            Variant {
                label: "protobuf → k8s-pb (full)",
                protobuf: true,
                decode: proto::<k8s_pb::api::core::v1::PersistentVolumeList>,
            },
            Variant { label: "protobuf → slim prost", protobuf: true, decode: proto::<SlimPvList> },
        ],
        _ => vec![
            Variant {
                label: "JSON → k8s-openapi (full)",
                protobuf: false,
                decode: json::<ObjectList<PersistentVolumeClaim>>,
            },
            Variant { label: "JSON → csi-sidecar compact", protobuf: false, decode: json::<ObjectList<CachedPvc>> },
            Variant {
                label: "protobuf → k8s-pb (full)",
                protobuf: true,
                decode: proto::<k8s_pb::api::core::v1::PersistentVolumeClaimList>,
            },
            Variant { label: "protobuf → slim prost", protobuf: true, decode: proto::<SlimPvcList> },
        ],
    }
}

/// The whole list of `path` from the watch cache, in `accept`'s encoding.
async fn fetch(client: &Client, path: &str, accept: &str) -> Result<Vec<u8>> {
    let req =
        http::Request::get(format!("{path}?resourceVersion=0")).header(http::header::ACCEPT, accept).body(Vec::new())?;
    let resp = client.send(req.map(kube::client::Body::from)).await?;
    if !resp.status().is_success() {
        bail!("GET {path} ({accept}): {}", resp.status());
    }
    Ok(resp.into_body().collect().await?.to_bytes().to_vec())
}

/// What a PV provisioned by csi-sidecar carries.
fn provisioned_pv(name: &str, ns: &str, i: usize) -> PersistentVolume {
    let mut pv = csi_pv(name, DRIVER, &format!("vol-{i:05}"), "1Gi");
    pv.metadata.annotations = Some([("pv.kubernetes.io/provisioned-by".to_string(), DRIVER.to_string())].into());
    pv.metadata.finalizers = Some(vec!["external-provisioner.volume.kubernetes.io/finalizer".into()]);
    if let Some(spec) = pv.spec.as_mut() {
        spec.claim_ref = Some(ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(ns.into()),
            name: Some(format!("claim-{i:05}")),
            uid: Some(format!("00000000-0000-4000-8000-{i:012}")),
            ..Default::default()
        });
        if let Some(c) = spec.csi.as_mut() {
            c.fs_type = Some("ext4".into());
            c.volume_attributes = Some(
                [("storage.kubernetes.io/csiProvisionerIdentity".to_string(), format!("1764460000000-{i}-{DRIVER}"))]
                    .into(),
            );
        }
    }
    pv
}

/// A claim of the driver, bound by name (to a PV that is not its own, so the PV binder leaves it alone).
fn bound_claim(ns: &str, i: usize) -> PersistentVolumeClaim {
    let mut c = pvc(&format!("claim-{i:05}"), None, "1Gi");
    c.metadata.namespace = Some(ns.into());
    c.metadata.annotations = Some(
        [
            ("volume.kubernetes.io/storage-provisioner".to_string(), DRIVER.to_string()),
            ("volume.beta.kubernetes.io/storage-provisioner".to_string(), DRIVER.to_string()),
        ]
        .into(),
    );
    if let Some(s) = c.spec.as_mut() {
        s.volume_name = Some(format!("{ns}-missing-{i:05}"));
    }
    c
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

async fn run(args: Args) -> Result<String> {
    eprintln!("starting the control plane ...");
    let cp = ControlPlane::try_start()?;
    let admin = cp.client().await;
    let ns = unique_name("decode");
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &Namespace { metadata: ObjectMeta { name: Some(ns.clone()), ..Default::default() }, ..Default::default() },
        )
        .await?;
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &ns);
    eprintln!("creating {} PVs and {} PVCs ...", args.objects, args.objects);
    futures::stream::iter(0..2 * args.objects)
        .map(|j| {
            let (pvs, pvcs, ns) = (pvs.clone(), pvcs.clone(), ns.clone());
            async move {
                let i = j / 2;
                if j % 2 == 0 {
                    pvs.create(&PostParams::default(), &provisioned_pv(&format!("{ns}-pv-{i:05}"), &ns, i))
                        .await
                        .map(drop)
                } else {
                    pvcs.create(&PostParams::default(), &bound_claim(&ns, i)).await.map(drop)
                }
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;

    let mut out = String::new();
    let _ = writeln!(
        out,
        "## JSON vs protobuf: decoding the initial lists\n\n{} PVs and {} PVCs of one driver (as provisioned: \
         annotations, finalizer, claimRef, CSI source; managedFields of one create), fetched whole from the \
         apiserver's watch cache in each encoding; each body decoded {} times (median).\n",
        args.objects, args.objects, args.runs
    );
    out.push_str(
        "| list | decoded as | body (MB) | decode (ms) | µs per object | heap peak during decode (MiB) | heap kept (MiB) |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    for (kind, path) in [
        ("persistentvolumes", "/api/v1/persistentvolumes"),
        ("persistentvolumeclaims", "/api/v1/persistentvolumeclaims"),
    ] {
        let json_body = fetch(&admin, path, "application/json").await?;
        let pb_body = fetch(&admin, path, "application/vnd.kubernetes.protobuf").await?;
        for v in variants(kind) {
            let body = if v.protobuf { &pb_body } else { &json_body };
            let (mut times, mut peaks, mut kept) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..args.runs.max(1) {
                let base = HEAP.current_usage();
                HEAP.reset_peak_usage();
                let t = Instant::now();
                let decoded = (v.decode)(body).with_context(|| format!("{kind}: {}", v.label))?;
                times.push(t.elapsed().as_secs_f64() * 1000.0);
                peaks.push(HEAP.peak_usage().saturating_sub(base) as f64);
                kept.push(HEAP.current_usage().saturating_sub(base) as f64);
                drop(decoded);
            }
            let ms = median(times);
            let _ = writeln!(
                out,
                "| {kind} | {} | {:.1} | {ms:.0} | {:.1} | {:.1} | {:.1} |",
                v.label,
                body.len() as f64 / 1e6,
                ms * 1000.0 / args.objects as f64,
                mib(median(peaks) as usize),
                mib(median(kept) as usize)
            );
        }
    }
    out.push_str(
        "\n\"heap kept\" is what the decoded list holds (the cache keeps that, or less: csi-sidecar's store interns \
         repeated strings); the body itself is not counted (it is the same for every decode of one encoding).\n",
    );
    cp.stop();
    Ok(out)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Args = argh::from_env();
    let out = run(args).await?;
    println!("{out}");
    Ok(())
}
