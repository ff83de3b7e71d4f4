#!/usr/bin/env bash
# The test command of the README: formatting, lints, unit tests, and the
# integration tests against the real CSI driver (built from the Go module
# proxy and cached; see integration/go/README.md) and the fault driver.
#
# CSI_SIDECAR_SKEW="VERSION..." also runs the skew suite (run-tests.py's
# SKEW_SUITE) against those Kubernetes versions (modules in
# integration/go/kube-versions/), in the same pool; .ci/run names the oldest
# and the newest.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."

step() { printf '\n==> %s\n' "$*" >&2; }

step "building the real components from the Go module proxy (cached after the first run)"
bash integration/scripts/build-components.sh etcd kube-apiserver kube-controller-manager kube-scheduler kubelet csi-mock-driver kubelet-plugin-harness hollow-node helm kubectl snapshot-controller promtool
read -r -a skew <<<"${CSI_SIDECAR_SKEW:-}"
skew_args=()
for v in "${skew[@]}"; do skew_args+=(--skew "$v"); done
if ((${#skew[@]})); then
	step "the cluster components of Kubernetes ${skew[*]} for the skew suite (cached after the first run)"
	bash integration/scripts/build-skew-components.sh "${skew[@]}"
fi

step "go test: the test world's own Go programs (the mock driver's data mode, the hostpath stand-in)"
(cd integration/go/kube && GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly \
	go test ./cmd/csi-mock-driver ./cmd/hostpath-standin)

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo build"
cargo build --workspace --bins

step "cargo test --no-run (the test executables)"
# Built first, run below several at a time: each integration test binary
# boots its own control plane and mostly waits on it.
TEST_ARTIFACTS="$PWD/target/test-artifacts.json"
mkdir -p target
cargo test --workspace --no-run --message-format=json-render-diagnostics >"$TEST_ARTIFACTS"

step "tests (${CSI_SIDECAR_TEST_JOBS:-3} executables at once; output in target/test-logs/)"
# Integration tests share one control plane per test binary. Keep its run
# directories (component logs) so a failure can be diagnosed; the runner
# prints a failing executable's log tails, then its failed tests' output
# (last: CI shows the end). They are removed on success.
export CSI_SIDECAR_KEEP_CLUSTER=1 CSI_SIDECAR_CLUSTER_DIR="$PWD/target/test-cluster-runs"
rm -rf "$CSI_SIDECAR_CLUSTER_DIR"
if command -v python3 >/dev/null; then
	python3 integration/scripts/run-tests.py "${skew_args[@]}" "$TEST_ARTIFACTS"
else
	# No python3: cargo runs them one after another.
	echo "test.sh: python3 is missing; cargo test runs the executables one at a time (no skew suite)" >&2
	cargo test --workspace --no-fail-fast
fi
rm -rf "$CSI_SIDECAR_CLUSTER_DIR"
