//! The fault driver's CSI SnapshotMetadata service: a snapshot's allocated
//! blocks and the blocks two snapshots of one volume differ in, computed
//! from the backing files (`blocks.rs`), `max_results` records per response
//! (256 when 0), with the script's faults (a slow stream, an error after
//! some responses).

use csi_sidecar::csi::proto::csi::v1 as csi;
use tonic::{Request, Response, Status, codegen::BoxStream};

use super::{
    Service,
    blocks::{BLOCK, ChangedBlocks, merged},
};

/// Records per response when the request says 0 (the hostpath driver's).
const DEFAULT_MAX_RESULTS: usize = 256;

/// One response's fields: type, capacity, records.
type Page = (i32, i64, Vec<csi::BlockMetadata>);

impl Service {
    /// The source volume of snapshot `id`, if the backend has it.
    fn snapshot_source(&self, id: &str) -> Option<String> {
        let snapshots = self.snapshots.lock().expect("snapshots");
        snapshots.values().find(|(sid, _)| sid == id).map(|(_, source)| source.clone())
    }

    /// The records of `id`'s blocks (against `base` for a delta) from
    /// `start`, after the checks a driver makes before it streams.
    fn records(&self, id: &str, base: Option<&str>, start: i64) -> Result<Records, Status> {
        let not_found = |id: &str| Status::not_found(format!("snapshot {id} not found"));
        let source = self.snapshot_source(id).ok_or_else(|| not_found(id))?;
        if self.filesystems.lock().expect("filesystems").contains(&source) {
            return Err(Status::invalid_argument("source volume does not have block mode access type"));
        }
        let target = self.blocks.open(id).ok_or_else(|| not_found(id))?;
        let base_file = match base {
            Some(b) => {
                if self.snapshot_source(b).ok_or_else(|| not_found(b))? != source {
                    return Err(Status::invalid_argument(format!("snapshots {b} and {id} are of different volumes")));
                }
                Some(self.blocks.open(b).ok_or_else(|| not_found(b))?)
            }
            None => None,
        };
        let io = |e: std::io::Error| Status::internal(e.to_string());
        let start = u64::try_from(start).map_err(|_| Status::out_of_range("negative starting_offset"))?;
        let (capacity, blocks): (u64, Blocks) = match self.script().metadata_synthetic_blocks {
            Some(n) => (n * BLOCK, Box::new((start.div_ceil(BLOCK)..n).map(|i| Ok((i * BLOCK, BLOCK))))),
            None => {
                let capacity = target.metadata().map_err(io)?.len();
                (capacity, Box::new(ChangedBlocks::new(target, base_file, start).map_err(io)?))
            }
        };
        let variable = self.script().metadata_variable_length;
        let blocks = if variable { Box::new(merged(blocks)) } else { blocks };
        let kind = if variable { csi::BlockMetadataType::VariableLength } else { csi::BlockMetadataType::FixedLength };
        Ok(Records { kind: kind as i32, capacity: capacity as i64, blocks })
    }

    /// The records as a stream of `max_results` per response (256 when 0),
    /// read while they are sent (a few responses ahead), with the script's
    /// delay before each response and its error after
    /// `metadata_error_after` of them.
    fn streamed<T: Send + 'static>(&self, records: Records, max_results: i32, wrap: fn(Page) -> T) -> BoxStream<T> {
        let s = self.script();
        let (delay, error_after) = (s.metadata_response_delay, s.metadata_error_after);
        let per_page = usize::try_from(max_results).ok().filter(|n| *n > 0).unwrap_or(DEFAULT_MAX_RESULTS);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<T, Status>>(READ_AHEAD);
        tokio::task::spawn_blocking(move || {
            let Records { kind, capacity, blocks } = records;
            let mut sent = 0;
            let mut page = Vec::with_capacity(per_page);
            let mut blocks = blocks.peekable();
            while let Some(block) = blocks.next() {
                match block {
                    Ok((offset, size)) => {
                        page.push(csi::BlockMetadata { byte_offset: offset as i64, size_bytes: size as i64 });
                    }
                    Err(e) => {
                        let _ = tx.blocking_send(Err(Status::internal(e.to_string())));
                        return;
                    }
                }
                if page.len() < per_page && blocks.peek().is_some() {
                    continue;
                }
                let full = std::mem::replace(&mut page, Vec::with_capacity(per_page));
                if tx.blocking_send(Ok(wrap((kind, capacity, full)))).is_err() {
                    return; // the caller went away
                }
                sent += 1;
                if error_after == Some(sent) {
                    break;
                }
            }
            if error_after.is_some() {
                // The error ends the stream.
                let _ = tx.blocking_send(Err(Status::internal("fault: the metadata stream broke")));
            }
        });
        Box::pin(futures::stream::unfold(rx, move |mut rx| async move {
            let item = rx.recv().await?;
            tokio::time::sleep(delay).await;
            Some((item, rx))
        }))
    }
}

/// Responses the driver reads ahead of the one being sent.
const READ_AHEAD: usize = 2;

/// A stream's blocks, in order.
type Blocks = Box<dyn Iterator<Item = std::io::Result<(u64, u64)>> + Send>;

/// What a stream sends: the records' type, the volume's capacity, the
/// blocks.
struct Records {
    kind: i32,
    capacity: i64,
    blocks: Blocks,
}

#[tonic::async_trait]
impl csi::snapshot_metadata_server::SnapshotMetadata for Service {
    async fn get_metadata_allocated(
        &self,
        req: Request<csi::GetMetadataAllocatedRequest>,
    ) -> Result<Response<BoxStream<csi::GetMetadataAllocatedResponse>>, Status> {
        let req = req.into_inner();
        let records = self.records(&req.snapshot_id, None, req.starting_offset)?;
        let wrap = |(block_metadata_type, volume_capacity_bytes, block_metadata): Page| {
            csi::GetMetadataAllocatedResponse { block_metadata_type, volume_capacity_bytes, block_metadata }
        };
        Ok(Response::new(self.streamed(records, req.max_results, wrap)))
    }

    async fn get_metadata_delta(
        &self,
        req: Request<csi::GetMetadataDeltaRequest>,
    ) -> Result<Response<BoxStream<csi::GetMetadataDeltaResponse>>, Status> {
        let req = req.into_inner();
        let base = Some(req.base_snapshot_id.as_str());
        let records = self.records(&req.target_snapshot_id, base, req.starting_offset)?;
        let wrap = |(block_metadata_type, volume_capacity_bytes, block_metadata): Page| csi::GetMetadataDeltaResponse {
            block_metadata_type,
            volume_capacity_bytes,
            block_metadata,
        };
        Ok(Response::new(self.streamed(records, req.max_results, wrap)))
    }
}

#[cfg(test)]
mod tests {
    use csi::snapshot_metadata_client::SnapshotMetadataClient;

    use super::*;
    use crate::fault_driver::{FaultDriver, Script, Transport};

    const KIB4: i64 = 4096;

    /// Each response's records, or how many came before the error.
    async fn pages<T>(
        stream: Result<Response<tonic::Streaming<T>>, Status>,
        records: fn(&T) -> Vec<(i64, i64)>,
    ) -> Result<Vec<Vec<(i64, i64)>>, (usize, Status)> {
        let mut stream = stream.map_err(|e| (0, e))?.into_inner();
        let mut out = Vec::new();
        loop {
            match stream.message().await {
                Ok(Some(m)) => out.push(records(&m)),
                Ok(None) => return Ok(out),
                Err(e) => return Err((out.len(), e)),
            }
        }
    }

    fn allocated(r: &csi::GetMetadataAllocatedResponse) -> Vec<(i64, i64)> {
        r.block_metadata.iter().map(|b| (b.byte_offset, b.size_bytes)).collect()
    }

    fn delta(r: &csi::GetMetadataDeltaResponse) -> Vec<(i64, i64)> {
        r.block_metadata.iter().map(|b| (b.byte_offset, b.size_bytes)).collect()
    }

    /// The blocks written before a snapshot is cut are its allocated ones,
    /// those written between two cuts the delta, paged by `max_results`,
    /// from `starting_offset`; the script's faults show.
    #[tokio::test]
    async fn the_streams_answer_the_blocks_written() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("csi.sock");
        let script = Script { controller: true, snapshots: true, snapshot_metadata: true, ..Script::default() };
        let driver = FaultDriver::start(&socket, Transport::Grpc, script);
        let channel = crate::uds_channel(&socket).await.expect("channel");
        let mut controller = csi::controller_client::ControllerClient::new(channel.clone());
        let mut client = SnapshotMetadataClient::new(channel);
        driver.set_volume_size("vol-1", 64 * KIB4 as u64);
        for block in [1u64, 2, 3, 10] {
            driver.write_volume("vol-1", block * 4096, b"data");
        }
        let cut = async |controller: &mut csi::controller_client::ControllerClient<_>, name: &str| {
            let req = csi::CreateSnapshotRequest {
                name: name.into(),
                source_volume_id: "vol-1".into(),
                ..Default::default()
            };
            controller
                .create_snapshot(req)
                .await
                .expect("snapshot")
                .into_inner()
                .snapshot
                .expect("snapshot")
                .snapshot_id
        };
        let first = cut(&mut controller, "first").await;
        driver.write_volume("vol-1", 2 * 4096 + 100, b"new");
        driver.write_volume("vol-1", 40 * 4096, b"new");
        let second = cut(&mut controller, "second").await;

        let ask = |id: &str, start, max| csi::GetMetadataAllocatedRequest {
            snapshot_id: id.into(),
            starting_offset: start,
            max_results: max,
            ..Default::default()
        };
        let all = pages(client.get_metadata_allocated(ask(&first, 0, 2)).await, allocated).await;
        let b = |n: i64| (n * KIB4, KIB4);
        assert_eq!(all.expect("allocated"), [vec![b(1), b(2)], vec![b(3), b(10)]]);
        let from = pages(client.get_metadata_allocated(ask(&first, 2 * KIB4 + 1, 0)).await, allocated).await;
        assert_eq!(from.expect("allocated from an offset"), [vec![b(2), b(3), b(10)]]);
        let ask_delta = |base: &str, target: &str| csi::GetMetadataDeltaRequest {
            base_snapshot_id: base.into(),
            target_snapshot_id: target.into(),
            ..Default::default()
        };
        let changed = pages(client.get_metadata_delta(ask_delta(&first, &second)).await, delta).await;
        assert_eq!(changed.expect("delta"), [vec![b(2), b(40)]]);

        let unknown = pages(client.get_metadata_allocated(ask("nope", 0, 0)).await, allocated).await;
        assert_eq!(unknown.map_err(|(_, e)| e.code()), Err(tonic::Code::NotFound));
        driver.update(|s| {
            s.metadata_error_after = Some(1);
            s.metadata_variable_length = true;
        });
        let broken = pages(client.get_metadata_allocated(ask(&first, 0, 1)).await, allocated).await;
        let (received, status) = broken.expect_err("broken mid-stream");
        assert_eq!((received, status.code()), (1, tonic::Code::Internal), "one response, then the error");
        driver.update(|s| s.metadata_error_after = None);
        let merged = pages(client.get_metadata_allocated(ask(&first, 0, 0)).await, allocated).await;
        assert_eq!(merged.expect("variable length"), [vec![(KIB4, 3 * KIB4), b(10)]]);
        let one_each = pages(client.get_metadata_allocated(ask(&first, 0, 1)).await, allocated).await;
        assert_eq!(one_each.expect("a range per response"), [vec![(KIB4, 3 * KIB4)], vec![b(10)]]);
    }
}
