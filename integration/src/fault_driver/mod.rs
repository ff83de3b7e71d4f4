//! An in-process CSI driver that misbehaves on purpose, for what a real
//! driver cannot be made to show: Probe not ready, Probe slower than the
//! timeout, errors, a socket that accepts and never answers, garbage bytes.
//!
//! It serves the Identity and Controller services, counts connections and
//! calls so tests can prove that csi-sidecar shares one connection and one
//! Probe, and records every ControllerPublish/ControllerUnpublish with its
//! start, end and outcome so tests can find calls on one (volume, node) that
//! overlapped ([`FaultDriver::overlaps`]); ControllerExpandVolume calls are
//! recorded the same way with their requested size ([`FaultDriver::expand_calls`]).
//! CreateSnapshot, DeleteSnapshot and ListSnapshots keep a backend of
//! snapshots ([`FaultDriver::snapshots`], idempotent by name) and record every
//! call with its secrets and parameters ([`FaultDriver::snapshot_calls`]).
//! The GroupController service (with `Script::group_snapshots`) keeps group
//! snapshots the same way ([`FaultDriver::groups`], [`FaultDriver::group_calls`]);
//! without it every group call answers `Unimplemented`.
//! GetCapacity answers per topology segment, less what the created volumes
//! in that segment take, with an optional maximum volume size and garbage
//! on demand ([`Script::capacity`]).
//! Volume health, in the v1.12 form (conditions in `ListVolumes` and
//! `ControllerGetVolume`) and the v1.13 one (`ControllerListVolumeHealth`,
//! `ControllerGetVolumeHealth`), is in [`health`]: [`Script::health`] and
//! [`FaultDriver::set_volume_health`].

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, atomic::Ordering},
};

use csi_sidecar::csi::proto::csi::v1::{
    group_controller_server::GroupControllerServer, identity_server::IdentityServer, node_server::NodeServer,
};
use tokio::{io::AsyncWriteExt, net::UnixListener};
use tokio_stream::{StreamExt, wrappers::UnixListenerStream};
use tokio_util::sync::CancellationToken;

mod blocks;
mod controller;
mod env;
mod group;
pub mod health;
mod identity;
mod record;
mod script;
mod service;
mod snapshot_metadata;

pub use env::FaultEnv;
pub use health::{HealthBook, HealthForms};
pub use record::{
    Allocations, CallKind, CallOutcome, ControllerCall, Counters, GroupCall, GroupMethod, Groups, PublishCall,
    PublishLog, Published, SnapshotCall, SnapshotMethod, Snapshots, Volumes, overlapping_calls,
};
pub use script::{ProbeAnswer, Script, Transport, segment_key};

use record::{CallLog, CallRecord, ModifyLog};
use service::{Service, check_secret};

/// A running fault driver; stopped (and its socket removed) on drop.
pub struct FaultDriver {
    socket: PathBuf,
    script: Arc<Mutex<Script>>,
    /// Counters.
    pub counters: Arc<Counters>,
    /// The volumes that exist in the backend.
    pub volumes: Volumes,
    /// Where volumes are published.
    pub published: Published,
    /// Every publish call.
    pub publish_log: Arc<Mutex<PublishLog>>,
    calls: CallLog,
    modify_log: ModifyLog,
    /// The snapshots that exist in the backend.
    pub snapshots: Snapshots,
    snapshot_log: Arc<Mutex<Vec<SnapshotCall>>>,
    /// The group snapshots that exist in the backend.
    pub groups: Groups,
    group_log: Arc<Mutex<Vec<GroupCall>>>,
    /// Bytes of the created volumes by segment.
    pub allocations: Allocations,
    /// The conditions set by [`FaultDriver::set_volume_health`].
    pub health: HealthBook,
    blocks: blocks::BlockFiles,
    stop: CancellationToken,
}

impl FaultDriver {
    /// Writes `data` at `offset` of volume `volume_id`'s backing data (what
    /// its next snapshot holds).
    pub fn write_volume(&self, volume_id: &str, offset: u64, data: &[u8]) {
        self.blocks.write(volume_id, offset, data).expect("write a volume's backing file");
    }

    /// Sets volume `volume_id`'s size (the capacity its snapshots report).
    pub fn set_volume_size(&self, volume_id: &str, bytes: u64) {
        self.blocks.set_size(volume_id, bytes).expect("size a volume's backing file");
    }

    /// Listens on `socket` (replacing a stale one).
    pub fn start(socket: &Path, transport: Transport, script: Script) -> FaultDriver {
        Self::start_with(socket, transport, script, Arc::default())
    }

    /// Like [`FaultDriver::start`], over an existing backend: a driver
    /// process restart that keeps its storage.
    pub fn start_with(socket: &Path, transport: Transport, script: Script, volumes: Volumes) -> FaultDriver {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).expect("bind fault driver socket");
        let script = Arc::new(Mutex::new(script));
        let counters = Arc::new(Counters::default());
        let stop = CancellationToken::new();
        let published: Published = Arc::default();
        let publish_log: Arc<Mutex<PublishLog>> = Arc::default();
        let calls: CallLog = Arc::default();
        let modify_log: ModifyLog = Arc::default();
        let snapshots: Snapshots = Arc::default();
        let snapshot_log: Arc<Mutex<Vec<SnapshotCall>>> = Arc::default();
        let groups: Groups = Arc::default();
        let group_log: Arc<Mutex<Vec<GroupCall>>> = Arc::default();
        let allocations: Allocations = Arc::default();
        let health: HealthBook = Arc::default();
        let blocks = blocks::BlockFiles::default();
        let svc = Service {
            blocks: blocks.clone(),
            health: health.clone(),
            creating: Arc::default(),
            filesystems: Arc::default(),
            allocations: allocations.clone(),
            groups: groups.clone(),
            group_log: group_log.clone(),
            snapshots: snapshots.clone(),
            snapshot_log: snapshot_log.clone(),
            modify_log: modify_log.clone(),
            script: script.clone(),
            counters: counters.clone(),
            volumes: volumes.clone(),
            published: published.clone(),
            publish_log: publish_log.clone(),
            calls: calls.clone(),
        };
        let (stop2, counters2) = (stop.clone(), counters.clone());
        tokio::spawn(async move {
            let mut held = Vec::new();
            let incoming = UnixListenerStream::new(listener).map(move |c| {
                counters2.connections.fetch_add(1, Ordering::SeqCst);
                c
            });
            match transport {
                Transport::Grpc => {
                    let _ = tonic::transport::Server::builder()
                        .add_service(IdentityServer::new(svc.clone()))
                        .add_service(GroupControllerServer::new(svc.clone()))
                        .add_service(NodeServer::new(svc.clone()))
                        .add_service(
                            csi_sidecar::csi::proto::csi::v1::snapshot_metadata_server::SnapshotMetadataServer::new(
                                svc.clone(),
                            ),
                        )
                        .add_service(health::ControllerWithLegacy::new(svc))
                        .serve_with_incoming_shutdown(incoming, stop2.cancelled_owned())
                        .await;
                }
                Transport::Silent | Transport::Garbage => {
                    tokio::pin!(incoming);
                    loop {
                        tokio::select! {
                            _ = stop2.cancelled() => break,
                            conn = incoming.next() => match conn {
                                Some(Ok(mut c)) if transport == Transport::Garbage => {
                                    let _ = c.write_all(b"\x00\xffHTTP/0.9 garbage \x13\x37 not a gRPC server\r\n\r\n").await;
                                    let _ = c.shutdown().await;
                                }
                                Some(Ok(c)) => held.push(c),
                                _ => break,
                            }
                        }
                    }
                }
            }
        });
        FaultDriver {
            blocks,
            socket: socket.to_path_buf(),
            script,
            counters,
            volumes,
            published,
            publish_log,
            calls,
            modify_log,
            snapshots,
            snapshot_log,
            groups,
            group_log,
            allocations,
            health,
            stop,
        }
    }

    /// Changes the script.
    pub fn update(&self, f: impl FnOnce(&mut Script)) {
        f(&mut self.script.lock().expect("script lock"));
    }

    /// `Probe` calls so far.
    pub fn probes(&self) -> u64 {
        self.counters.probes.load(Ordering::SeqCst)
    }

    /// `GetPluginInfo` calls so far.
    pub fn plugin_infos(&self) -> u64 {
        self.counters.plugin_infos.load(Ordering::SeqCst)
    }

    /// Names of the volumes that exist in the backend.
    pub fn volume_names(&self) -> Vec<String> {
        self.volumes.lock().expect("volumes").keys().cloned().collect()
    }

    /// `GetCapacity` calls so far.
    pub fn get_capacities(&self) -> u64 {
        self.counters.get_capacities.load(Ordering::SeqCst)
    }

    /// `CreateVolume` calls so far.
    pub fn creates(&self) -> u64 {
        self.counters.creates.load(Ordering::SeqCst)
    }

    /// The publish calls so far.
    pub fn publish_calls(&self) -> Vec<PublishCall> {
        self.publish_log.lock().expect("publish log").calls.clone()
    }

    /// Every ControllerPublishVolume and ControllerUnpublishVolume call so
    /// far, in arrival order, with start, end and outcome.
    pub fn controller_calls(&self) -> Vec<ControllerCall> {
        self.calls.lock().expect("call log").clone()
    }

    /// The controller calls on one (volume, node), in arrival order.
    pub fn calls_for(&self, volume_id: &str, node_id: &str) -> Vec<ControllerCall> {
        let calls = self.calls.lock().expect("call log");
        calls.iter().filter(|c| c.volume_id == volume_id && c.node_id == node_id).cloned().collect()
    }

    /// The snapshot calls so far (with their secrets), in arrival order.
    pub fn snapshot_calls(&self) -> Vec<SnapshotCall> {
        self.snapshot_log.lock().expect("snapshot log").clone()
    }

    /// The snapshot calls of `method` so far.
    pub fn snapshot_calls_of(&self, method: SnapshotMethod) -> Vec<SnapshotCall> {
        self.snapshot_calls().into_iter().filter(|c| c.method == method).collect()
    }

    /// The group snapshot calls so far (with their secrets), in arrival order.
    pub fn group_calls(&self) -> Vec<GroupCall> {
        self.group_log.lock().expect("group log").clone()
    }

    /// The group calls of `method` so far.
    pub fn group_calls_of(&self, method: GroupMethod) -> Vec<GroupCall> {
        self.group_calls().into_iter().filter(|c| c.method == method).collect()
    }

    /// The ControllerExpandVolume calls so far, in arrival order.
    pub fn expand_calls(&self) -> Vec<ControllerCall> {
        let calls = self.calls.lock().expect("call log");
        calls.iter().filter(|c| c.kind == CallKind::Expand).cloned().collect()
    }

    /// The `mutable_parameters` of every ControllerModifyVolume call so far.
    pub fn modify_parameters(&self) -> Vec<BTreeMap<String, String>> {
        self.modify_log.lock().expect("modify log").clone()
    }

    /// Pairs of calls on one (volume, node) that ran at the same time.
    pub fn overlaps(&self) -> Vec<(ControllerCall, ControllerCall)> {
        overlapping_calls(&self.controller_calls())
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.counters.connections.load(Ordering::SeqCst)
    }
}

impl FaultDriver {
    /// Stops serving and removes the socket now (a driver process exiting),
    /// so another driver can take the socket while this value lives on.
    pub fn stop(&self) {
        if !self.stop.is_cancelled() {
            self.stop.cancel();
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

impl Drop for FaultDriver {
    fn drop(&mut self) {
        self.stop();
    }
}
