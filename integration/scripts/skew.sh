#!/usr/bin/env bash
# The skew suite: the integration tests of the API surface that changed
# between Kubernetes minors (run-tests.py's SKEW_SUITE), run against the
# cluster of each version in integration/go/kube-versions/ (and the default
# one): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the
# kubelet at that version, the test tools (CSI mock driver, hollow kubelet,
# snapshot-controller) at their own. All versions' test executables share one
# pool (run-tests.py --skew). Results: one line per version and test
# executable, and target/skew/ with each executable's output
# (<executable>@<version>.log).
#
# Usage: integration/scripts/skew.sh [VERSION...]
#   VERSION: vX.Y.Z of a module in integration/go/kube-versions/, or
#   "default"; no VERSION: all of them.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."

versions=("$@")
if ((${#versions[@]} == 0)); then
	versions=(default)
	for d in integration/go/kube-versions/v*/; do versions+=("$(basename "$d")"); done
fi

bash integration/scripts/build-skew-components.sh "${versions[@]}"
cargo build --workspace --bins
mkdir -p target
ARTIFACTS=$PWD/target/skew-artifacts.json
cargo test --workspace --no-run --message-format=json-render-diagnostics >"$ARTIFACTS"

export CSI_SIDECAR_KEEP_CLUSTER=1 CSI_SIDECAR_CLUSTER_DIR=$PWD/target/skew-cluster-runs
rm -rf "$CSI_SIDECAR_CLUSTER_DIR"
skew_args=()
for v in "${versions[@]}"; do skew_args+=(--skew "$v"); done
python3 integration/scripts/run-tests.py --log-dir target/skew --skew-only "${skew_args[@]}" "$ARTIFACTS"
rm -rf "$CSI_SIDECAR_CLUSTER_DIR"
