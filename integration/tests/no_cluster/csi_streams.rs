//! The CSI connection's server-streaming calls (the snapshot-metadata
//! module's `GetMetadataAllocated` and `GetMetadataDelta`) against the fault
//! driver's SnapshotMetadata service: the driver's pages arrive one for one,
//! the deadline reaches the driver, and the call is counted in the call
//! metrics like a unary call.

use std::time::Duration;

use csi_sidecar::csi::{Connection, calls::CallStream, proto::csi::v1 as csi};
use csi_sidecar_integration::fault_driver::{FaultDriver, Script, Transport};

const T: Duration = Duration::from_secs(10);
const BLOCK: i64 = 4096;

type Pages = Vec<Vec<(i64, i64)>>;

/// The driver's pages of a stream (each response's (offset, size)
/// records), and the status it ended with, if not OK.
async fn read<R>(mut stream: CallStream<R>, blocks: impl Fn(&R) -> Vec<(i64, i64)>) -> (Pages, Option<tonic::Status>) {
    let mut all = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(response)) => all.push(blocks(&response)),
            Ok(None) => return (all, None),
            Err(status) => return (all, Some(status)),
        }
    }
}

async fn pages<R>(stream: CallStream<R>, blocks: impl Fn(&R) -> Vec<(i64, i64)>) -> Pages {
    match read(stream, blocks).await {
        (pages, None) => pages,
        (_, Some(status)) => panic!("the stream failed: {status:?}"),
    }
}

fn allocated(r: &csi::GetMetadataAllocatedResponse) -> Vec<(i64, i64)> {
    r.block_metadata.iter().map(|b| (b.byte_offset, b.size_bytes)).collect()
}

fn delta(r: &csi::GetMetadataDeltaResponse) -> Vec<(i64, i64)> {
    r.block_metadata.iter().map(|b| (b.byte_offset, b.size_bytes)).collect()
}

#[tokio::test]
async fn metadata_streams_pass_the_drivers_pages_one_for_one_under_one_deadline() {
    let dir = tempfile::tempdir().expect("dir");
    let socket = dir.path().join("csi.sock");
    let script = Script { controller: true, snapshots: true, snapshot_metadata: true, ..Script::default() };
    let driver = FaultDriver::start(&socket, Transport::Grpc, script);
    let conn = Connection::new(&format!("unix://{}", socket.display())).expect("address");
    driver.set_volume_size("vol-1", 64 * BLOCK as u64);
    for block in [1u64, 2, 3, 10] {
        driver.write_volume("vol-1", block * BLOCK as u64, b"data");
    }
    let cut = async |name: &str| {
        let req =
            csi::CreateSnapshotRequest { name: name.into(), source_volume_id: "vol-1".into(), ..Default::default() };
        conn.create_snapshot(T, req).await.expect("snapshot").snapshot.expect("snapshot").snapshot_id
    };
    let first = cut("first").await;
    driver.write_volume("vol-1", 40 * BLOCK as u64, b"new");
    let second = cut("second").await;

    let b = |n: i64| (n * BLOCK, BLOCK);
    let ask = csi::GetMetadataAllocatedRequest { snapshot_id: first.clone(), max_results: 2, ..Default::default() };
    let stream = conn.get_metadata_allocated(T, ask).await.expect("opened");
    assert_eq!(pages(stream, allocated).await, [vec![b(1), b(2)], vec![b(3), b(10)]]);
    let ask = csi::GetMetadataDeltaRequest {
        base_snapshot_id: first.clone(),
        target_snapshot_id: second,
        ..Default::default()
    };
    let stream = conn.get_metadata_delta(T, ask).await.expect("opened");
    assert_eq!(pages(stream, delta).await, [vec![b(40)]]);

    // The deadline covers the whole stream: a driver that takes 2 s a page
    // is cut off, before its first page, by the 1 s the call was given.
    driver.update(|s| s.metadata_response_delay = Duration::from_secs(2));
    let ask = csi::GetMetadataAllocatedRequest { snapshot_id: first, max_results: 1, ..Default::default() };
    let (got, status) = match conn.get_metadata_allocated(Duration::from_secs(1), ask).await {
        Ok(stream) => read(stream, allocated).await,
        Err(status) => (Vec::new(), Some(status)),
    };
    let code = status.expect("cut off by the deadline").code();
    assert!(matches!(code, tonic::Code::DeadlineExceeded | tonic::Code::Cancelled), "{code:?}");
    assert!(got.is_empty(), "no page of the four arrived: {got:?}");
}
