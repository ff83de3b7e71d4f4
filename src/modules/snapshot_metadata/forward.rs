//! The driver's stream passed on to the client: each CSI response becomes
//! one API response with the same records, in order, with nothing held
//! beyond the response in hand (memory does not grow with the stream); a
//! status the driver sent passes through with its code and message,
//! anything else (the connection failing) is Internal with upstream's text.
//! The stream's deadline (`--max-streaming-duration-min`) is the CSI
//! call's ([`CallStream`]).

use futures::Stream;
use tonic::Status;

use super::api;
use crate::{
    compat::snapshot_metadata as upstream,
    csi::{calls::CallStream, proto::csi::v1 as csi},
};

/// One CSI `GetMetadataAllocated` response as the API's.
pub fn allocated(r: csi::GetMetadataAllocatedResponse) -> api::GetMetadataAllocatedResponse {
    api::GetMetadataAllocatedResponse {
        block_metadata_type: block_type(r.block_metadata_type),
        volume_capacity_bytes: r.volume_capacity_bytes,
        block_metadata: blocks(r.block_metadata),
    }
}

/// One CSI `GetMetadataDelta` response as the API's.
pub fn delta(r: csi::GetMetadataDeltaResponse) -> api::GetMetadataDeltaResponse {
    api::GetMetadataDeltaResponse {
        block_metadata_type: block_type(r.block_metadata_type),
        volume_capacity_bytes: r.volume_capacity_bytes,
        block_metadata: blocks(r.block_metadata),
    }
}

/// The CSI block type as the API's (the same names and numbers; a value
/// neither knows is UNKNOWN).
fn block_type(csi_type: i32) -> i32 {
    match csi::BlockMetadataType::try_from(csi_type) {
        Ok(csi::BlockMetadataType::FixedLength) => api::BlockMetadataType::FixedLength as i32,
        Ok(csi::BlockMetadataType::VariableLength) => api::BlockMetadataType::VariableLength as i32,
        _ => api::BlockMetadataType::Unknown as i32,
    }
}

fn blocks(records: Vec<csi::BlockMetadata>) -> Vec<api::BlockMetadata> {
    records.into_iter().map(|b| api::BlockMetadata { byte_offset: b.byte_offset, size_bytes: b.size_bytes }).collect()
}

/// What the client gets for a failed driver call: the driver's own status
/// as it is; a failure of the connection (a status tonic made from a
/// transport error, which carries that error as its source) as Internal
/// with upstream's text.
pub fn driver_error(status: Status) -> Status {
    if std::error::Error::source(&status).is_none() {
        return status;
    }
    Status::internal(upstream::driver_failed(status.message()))
}

/// The driver's responses, converted, then its end: OK, or the first error
/// as [`driver_error`] makes it (nothing follows an error).
pub fn forward<T, U>(source: CallStream<T>, convert: fn(T) -> U) -> impl Stream<Item = Result<U, Status>> {
    futures::stream::unfold(Some(source), move |source| async move {
        let mut source = source?;
        match source.message().await {
            Ok(Some(response)) => Some((Ok(convert(response)), Some(source))),
            Ok(None) => None,
            Err(status) => Some((Err(driver_error(status)), None)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_keeps_its_records_in_order_and_its_type() {
        let response = csi::GetMetadataDeltaResponse {
            block_metadata_type: csi::BlockMetadataType::VariableLength as i32,
            volume_capacity_bytes: 1 << 30,
            block_metadata: vec![
                csi::BlockMetadata { byte_offset: 8192, size_bytes: 4096 },
                csi::BlockMetadata { byte_offset: 0, size_bytes: 65536 },
            ],
        };
        let got = delta(response);
        assert_eq!(got.block_metadata_type, api::BlockMetadataType::VariableLength as i32);
        assert_eq!(got.volume_capacity_bytes, 1 << 30);
        let records: Vec<(i64, i64)> = got.block_metadata.iter().map(|b| (b.byte_offset, b.size_bytes)).collect();
        assert_eq!(records, [(8192, 4096), (0, 65536)]);
        let fixed = allocated(csi::GetMetadataAllocatedResponse {
            block_metadata_type: csi::BlockMetadataType::FixedLength as i32,
            ..Default::default()
        });
        assert_eq!(fixed.block_metadata_type, api::BlockMetadataType::FixedLength as i32);
        let unknown = allocated(csi::GetMetadataAllocatedResponse { block_metadata_type: 7, ..Default::default() });
        assert_eq!(unknown.block_metadata_type, api::BlockMetadataType::Unknown as i32);
    }

    #[test]
    fn a_drivers_status_passes_through_and_a_broken_connection_is_internal() {
        let driver = Status::invalid_argument("source volume does not have block mode access type");
        let passed = driver_error(driver);
        assert_eq!(
            (passed.code(), passed.message()),
            (tonic::Code::InvalidArgument, "source volume does not have block mode access type")
        );
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let broken = driver_error(Status::from_error(Box::new(io)));
        assert_eq!(broken.code(), tonic::Code::Internal);
        assert!(broken.message().starts_with("failed to get response from CSI driver: "), "{}", broken.message());
    }
}
