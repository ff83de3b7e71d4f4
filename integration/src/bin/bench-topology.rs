//! In-process benchmark of the provisioner's accessibility requirements (no
//! cluster): `--nodes` Nodes (metadata only, as the provisioner watches
//! them, with eleven labels each, as a cloud node carries) in `--zones`
//! zones, each with a CSINode listing the driver (and another driver), held
//! in the shared cache's own store. Measured: requirement computations per
//! second for a WaitForFirstConsumer claim with a selected node (non-strict,
//! no `allowedTopologies`: every segment of the driver's nodes) and for an
//! Immediate claim with `--immediate-topology`, BEFORE (the full scan of
//! every CSINode and Node per attempt, kept below in [`baseline`] as it
//! was) and AFTER (`ClusterTopology`, the index kept per watch event).
//! Each figure is the median of `--runs` runs of `--seconds` each.
//!
//! ```text
//! cargo run --release -p csi-sidecar-integration --bin bench-topology
//! ```

use std::{
    collections::BTreeMap,
    hint::black_box,
    time::{Duration, Instant},
};

use argh::FromArgs;
use csi_sidecar::{
    csi::proto::csi::v1::TopologyRequirement,
    k8s::cache::{Cache, Writer},
    modules::provisioner::{
        topology::{Request, TopologyError},
        topology_index::ClusterTopology,
    },
};
use k8s_openapi::{
    api::{
        core::v1::Node,
        storage::v1::{CSINode, CSINodeDriver, CSINodeSpec},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    core::{PartialObjectMeta, PartialObjectMetaExt},
    runtime::watcher::Event,
};

const DRIVER: &str = "bench-topology.csi.example.com";
const KEY: &str = "topology.bench-topology.csi.example.com/zone";

/// csi-sidecar accessibility requirements benchmark (in-process).
#[derive(FromArgs)]
struct Args {
    /// nodes, each with the driver's CSINode (default 5000)
    #[argh(option, default = "5000")]
    nodes: usize,
    /// zones the nodes are spread over (default 50)
    #[argh(option, default = "50")]
    zones: usize,
    /// runs per figure; the table shows medians (default 5)
    #[argh(option, default = "5")]
    runs: usize,
    /// seconds per run (default 1)
    #[argh(option, default = "1.0")]
    seconds: f64,
}

/// The full scan per attempt, as `Provisioner::accessibility` and
/// `topology::requirements` did it before the index (the BASELINE of this
/// benchmark, not used anywhere else): the names of every CSINode listing
/// the driver, then every one of those nodes' keys and labels copied to
/// build the aggregate. Trimmed to the paths measured (no strict topology,
/// no `allowedTopologies`); the error texts are the real ones.
mod baseline {
    use std::collections::{BTreeMap, BTreeSet};

    use csi_sidecar::{
        csi::proto::csi::v1::{Topology, TopologyRequirement},
        k8s::cache::Cache,
        modules::provisioner::topology::{Request, Segment, TopologyError},
    };
    use k8s_openapi::api::{core::v1::Node, storage::v1::CSINode};
    use kube::{core::PartialObjectMeta, runtime::reflector::ObjectRef};

    struct ClusterView<'a> {
        node_labels: &'a dyn Fn(&str) -> Option<BTreeMap<String, String>>,
        node_keys: &'a dyn Fn(&str) -> Option<Vec<String>>,
        driver_nodes: Vec<String>,
    }

    /// `Provisioner::accessibility` before the index.
    pub fn accessibility(
        nodes: &Cache<PartialObjectMeta<Node>>,
        csinodes: &Cache<CSINode>,
        driver: &str,
        req: &Request<'_>,
    ) -> Result<Option<TopologyRequirement>, TopologyError> {
        let labels = |n: &str| nodes.get(&ObjectRef::new(n)).map(|m| m.metadata.labels.clone().unwrap_or_default());
        let keys_of = |c: &CSINode| {
            c.spec.drivers.iter().find(|d| d.name == driver).map(|d| d.topology_keys.clone().unwrap_or_default())
        };
        let keys = |n: &str| csinodes.get(&ObjectRef::new(n)).map(|c| keys_of(&c).unwrap_or_default());
        let driver_nodes =
            csinodes.state().iter().filter(|c| keys_of(c).is_some()).filter_map(|c| c.metadata.name.clone()).collect();
        let view = ClusterView { node_labels: &labels, node_keys: &keys, driver_nodes };
        requirements(req, &view)
    }

    fn dedup(segments: Vec<Segment>) -> Vec<Segment> {
        let set: BTreeSet<Segment> = segments.into_iter().collect();
        set.into_iter().collect()
    }

    fn node_segment(view: &ClusterView<'_>, node: &str, keys: &[String]) -> Option<Segment> {
        let labels = (view.node_labels)(node)?;
        keys.iter().map(|k| labels.get(k).map(|v| (k.clone(), v.clone()))).collect()
    }

    fn go_list(items: &[String]) -> String {
        format!("[{}]", items.join(" "))
    }

    fn selected_segment(view: &ClusterView<'_>, node: &str) -> Result<(Vec<String>, Segment), TopologyError> {
        if (view.node_labels)(node).is_none() {
            return Err(TopologyError::Reschedule(format!("node \"{node}\" not found")));
        }
        let keys = (view.node_keys)(node)
            .ok_or_else(|| TopologyError::Reschedule(format!("csinode.storage.k8s.io \"{node}\" not found")))?;
        if keys.is_empty() {
            return Err(TopologyError::Retry(format!("no topology key found for node {node}")));
        }
        let segment = node_segment(view, node, &keys).ok_or_else(|| {
            TopologyError::Retry(format!(
                "topology labels from selected node map[] does not match topology keys from CSINode {}",
                go_list(&keys)
            ))
        })?;
        Ok((keys, segment))
    }

    /// The full scan.
    fn aggregate(view: &ClusterView<'_>, keys: &[String]) -> Vec<Segment> {
        dedup(
            view.driver_nodes
                .iter()
                .filter(|n| {
                    (view.node_keys)(n).is_some_and(|k| k.iter().collect::<BTreeSet<_>>() == keys.iter().collect())
                })
                .filter_map(|n| node_segment(view, n, keys))
                .collect(),
        )
    }

    fn rotate_to(mut segments: Vec<Segment>, first: usize) -> Vec<Segment> {
        if !segments.is_empty() {
            let k = first % segments.len();
            segments.rotate_left(k);
        }
        segments
    }

    fn spread_offset(pvc_name: &str) -> usize {
        let (base, ordinal) = match pvc_name.rsplit_once('-') {
            Some((b, o)) if !o.is_empty() && o.bytes().all(|c| c.is_ascii_digit()) => {
                (b, o.parse::<usize>().unwrap_or(0))
            }
            _ => (pvc_name, 0),
        };
        let mut h: u32 = 0x811c_9dc5;
        for b in base.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        (h as usize).wrapping_add(ordinal)
    }

    fn to_csi(segments: &[Segment]) -> Vec<Topology> {
        segments
            .iter()
            .map(|s| Topology { segments: s.iter().map(|(k, v)| (k.clone(), v.clone())).collect() })
            .collect()
    }

    fn requirements(req: &Request<'_>, view: &ClusterView<'_>) -> Result<Option<TopologyRequirement>, TopologyError> {
        assert!(!req.strict && req.allowed.is_empty(), "the baseline covers the measured paths only");
        let (requisite, preferred) = match (req.late_binding, req.selected_node) {
            (true, Some(node)) => {
                let (keys, selected) = selected_segment(view, node)?;
                let requisite = aggregate(view, &keys);
                let first = requisite.iter().position(|s| *s == selected).unwrap_or(0);
                let preferred = rotate_to(requisite.clone(), first);
                (requisite, preferred)
            }
            _ => {
                if !req.immediate_topology {
                    return Ok(None);
                }
                let keys = view.driver_nodes.iter().find_map(|n| (view.node_keys)(n).filter(|k| !k.is_empty()));
                let Some(keys) = keys else {
                    return Err(TopologyError::Retry("no available topology found".into()));
                };
                let requisite = aggregate(view, &keys);
                if requisite.is_empty() {
                    return Err(TopologyError::Retry(format!(
                        "topologyKeys {} were not found on any nodes",
                        go_list(&keys)
                    )));
                }
                let preferred = rotate_to(requisite.clone(), spread_offset(req.pvc_name));
                (requisite, preferred)
            }
        };
        Ok(Some(TopologyRequirement { requisite: to_csi(&requisite), preferred: to_csi(&preferred) }))
    }
}

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

/// A cloud node's labels: the well-known ones, the driver's key.
fn node(i: usize, zones: usize) -> PartialObjectMeta<Node> {
    let zone = format!("zone-{}", i % zones);
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", node_name(i)),
        ("kubernetes.io/os", "linux".into()),
        ("kubernetes.io/arch", "amd64".into()),
        ("beta.kubernetes.io/os", "linux".into()),
        ("beta.kubernetes.io/arch", "amd64".into()),
        ("beta.kubernetes.io/instance-type", "m5.xlarge".into()),
        ("node.kubernetes.io/instance-type", "m5.xlarge".into()),
        ("topology.kubernetes.io/region", "region-1".into()),
        ("topology.kubernetes.io/zone", zone.clone()),
        ("failure-domain.beta.kubernetes.io/zone", zone.clone()),
        (KEY, zone),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let meta = ObjectMeta {
        name: Some(node_name(i)),
        uid: Some(format!("uid-node-{i}")),
        resource_version: Some(i.to_string()),
        labels: Some(labels),
        ..Default::default()
    };
    meta.into_response_partial()
}

fn csinode(i: usize) -> CSINode {
    let driver = |name: &str, keys: Vec<String>| CSINodeDriver {
        name: name.into(),
        node_id: node_name(i),
        topology_keys: Some(keys),
        allocatable: None,
    };
    CSINode {
        metadata: ObjectMeta {
            name: Some(node_name(i)),
            uid: Some(format!("uid-csinode-{i}")),
            resource_version: Some(i.to_string()),
            ..Default::default()
        },
        spec: CSINodeSpec {
            drivers: vec![
                driver("other.csi.example.com", vec!["topology.other.csi.example.com/node".into()]),
                driver(DRIVER, vec![KEY.into()]),
            ],
        },
    }
}

type Attempt<'a> = &'a dyn Fn(&Request<'_>) -> Result<Option<TopologyRequirement>, TopologyError>;

/// Attempts per second over one run of `secs`.
fn rate(attempt: Attempt<'_>, req: &Request<'_>, secs: f64) -> f64 {
    let start = Instant::now();
    let limit = Duration::from_secs_f64(secs);
    let mut n = 0u64;
    loop {
        black_box(attempt(black_box(req)).ok());
        n += 1;
        let elapsed = start.elapsed();
        if elapsed >= limit {
            return n as f64 / elapsed.as_secs_f64();
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Args = argh::from_env();
    let (nodes, csinodes) = (Cache::default(), Cache::default());
    let (mut node_writer, mut csinode_writer) = (Writer::new(nodes.clone()), Writer::new(csinodes.clone()));
    for i in 0..args.nodes {
        node_writer.apply(Event::Apply(node(i, args.zones)), &|_| true);
        csinode_writer.apply(Event::Apply(csinode(i)), &|_| true);
    }
    // The index as the handlers keep it: one update per Node event and per
    // CSINode event.
    let cluster = ClusterTopology::new(nodes.clone(), csinodes.clone(), DRIVER);
    let start = Instant::now();
    for i in 0..args.nodes {
        cluster.update(&node_name(i));
        cluster.update(&node_name(i));
    }
    let build = start.elapsed();
    assert_eq!(cluster.len(), args.nodes);
    let selected = node_name(7);
    let paths = [
        (
            "WaitForFirstConsumer, selected node",
            Request {
                late_binding: true,
                selected_node: Some(&selected),
                strict: false,
                immediate_topology: true,
                allowed: &[],
                pvc_name: "data-web-0",
            },
        ),
        (
            "Immediate, --immediate-topology",
            Request {
                late_binding: false,
                selected_node: None,
                strict: false,
                immediate_topology: true,
                allowed: &[],
                pvc_name: "data-web-0",
            },
        ),
    ];
    let before = |r: &Request<'_>| baseline::accessibility(&nodes, &csinodes, DRIVER, r);
    let after = |r: &Request<'_>| cluster.requirements(r);
    for (what, req) in &paths {
        let (b, a) = (before(req), after(req));
        assert_eq!(b, a, "{what}: the index answers as the full scan");
        let segments = a.ok().flatten().map(|r| r.requisite.len()).unwrap_or_default();
        assert_eq!(segments, args.zones, "{what}");
    }
    println!(
        "{} Nodes in {} zones; the index built from {} Node and {} CSINode events in {:.1} ms ({:.2} µs per event); {} runs of {} s, medians",
        args.nodes,
        args.zones,
        args.nodes,
        args.nodes,
        build.as_secs_f64() * 1e3,
        build.as_secs_f64() * 1e6 / (2 * args.nodes) as f64,
        args.runs,
        args.seconds
    );
    println!();
    println!(
        "| path | before: full scan (attempts/s) | after: index (attempts/s) | before / after per attempt | speed-up |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (what, req) in &paths {
        let (mut b, mut a) = (Vec::new(), Vec::new());
        for _ in 0..args.runs {
            b.push(rate(&before, req, args.seconds));
            a.push(rate(&after, req, args.seconds));
        }
        let (b, a) = (median(b), median(a));
        println!("| {what} | {b:.0} | {a:.0} | {:.1} ms / {:.1} µs | {:.0}× |", 1e3 / b, 1e6 / a, a / b);
    }
}
