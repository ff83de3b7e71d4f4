//! The Kubernetes SnapshotMetadata API's types, client and server, generated
//! from `proto/snapshot_metadata.proto` (package `snapshotmetadata`).

#![allow(missing_docs, clippy::all)]

tonic::include_proto!("snapshotmetadata");

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// Clients depend on the package, the service and every field number:
    /// each field of each message encodes under the API's number (a tag is
    /// `number << 3 | wire type`), and the service's path is the API's.
    #[test]
    fn the_wire_contract_is_the_apis() {
        let tags = |bytes: Vec<u8>| -> Vec<u8> {
            let mut out = Vec::new();
            let mut i = 0;
            while i < bytes.len() {
                out.push(bytes[i] >> 3);
                let wire = bytes[i] & 7;
                i += 1;
                match wire {
                    0 => {
                        while bytes[i] & 0x80 != 0 {
                            i += 1;
                        }
                        i += 1;
                    }
                    2 => i += 1 + usize::from(bytes[i]),
                    other => panic!("wire type {other}"),
                }
            }
            out
        };
        let allocated = GetMetadataAllocatedRequest {
            security_token: "t".into(),
            namespace: "n".into(),
            snapshot_name: "s".into(),
            starting_offset: 1,
            max_results: 2,
        };
        assert_eq!(tags(allocated.encode_to_vec()), [1, 2, 3, 4, 5]);
        let delta = GetMetadataDeltaRequest {
            security_token: "t".into(),
            namespace: "n".into(),
            base_snapshot_id: "b".into(),
            target_snapshot_name: "s".into(),
            starting_offset: 1,
            max_results: 2,
        };
        assert_eq!(tags(delta.encode_to_vec()), [1, 2, 3, 4, 5, 6]);
        let block = BlockMetadata { byte_offset: 4096, size_bytes: 4096 };
        let response = GetMetadataDeltaResponse {
            block_metadata_type: BlockMetadataType::FixedLength as i32,
            volume_capacity_bytes: 1,
            block_metadata: vec![block],
        };
        assert_eq!(tags(response.encode_to_vec()), [1, 2, 3]);
        assert_eq!(tags(block.encode_to_vec()), [1, 2]);
        assert_eq!(BlockMetadataType::VariableLength as i32, 2);
        assert_eq!(snapshot_metadata_server::SERVICE_NAME, "snapshotmetadata.SnapshotMetadata");
    }
}
