#!/usr/bin/env python3
"""A Python gRPC client of the Kubernetes SnapshotMetadata API, for
bench-snapshot-metadata: upstream's figure (0.25 s for a 16 384-block delta)
was measured with a Python client, so csi-sidecar is timed the same way.

Generates the stubs from proto/snapshot_metadata.proto (grpcio-tools), dials
ADDRESS over TLS trusting --ca, makes --runs calls one after another (each
after --pause seconds) and prints one JSON line per call: its wall time
(request sent to the stream's end, TLS and the server's Kubernetes checks
included), responses and block records.
"""
import argparse
import importlib
import json
import os
import sys
import tempfile
import time


def stubs(proto_dir):
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="smd-stubs-")
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}",
                      os.path.join(proto_dir, "snapshot_metadata.proto")])
    if rc != 0:
        sys.exit(f"protoc failed ({rc})")
    sys.path.insert(0, out)
    return importlib.import_module("snapshot_metadata_pb2"), importlib.import_module("snapshot_metadata_pb2_grpc")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--proto-dir", required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--snapshot", required=True)
    p.add_argument("--base", default="")
    p.add_argument("--max-results", type=int, default=0)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--pause", type=float, default=0.0)
    a = p.parse_args()
    import grpc

    pb, rpc = stubs(a.proto_dir)
    with open(a.ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    channel = grpc.secure_channel(a.address, creds, options=[("grpc.max_receive_message_length", 64 << 20)])
    client = rpc.SnapshotMetadataStub(channel)
    for _ in range(a.runs):
        time.sleep(a.pause)
        start = time.perf_counter()
        if a.base:
            req = pb.GetMetadataDeltaRequest(security_token=a.token, namespace=a.namespace,
                                             base_snapshot_id=a.base, target_snapshot_name=a.snapshot,
                                             max_results=a.max_results)
            stream = client.GetMetadataDelta(req)
        else:
            req = pb.GetMetadataAllocatedRequest(security_token=a.token, namespace=a.namespace,
                                                 snapshot_name=a.snapshot, max_results=a.max_results)
            stream = client.GetMetadataAllocated(req)
        responses = records = 0
        for r in stream:
            responses += 1
            records += len(r.block_metadata)
        print(json.dumps({"seconds": time.perf_counter() - start, "responses": responses, "records": records}),
              flush=True)


if __name__ == "__main__":
    main()
