#!/usr/bin/env bash
# The test command of the README: formatting, lints, unit tests, and the
# integration tests against the real CSI driver (built from the Go module
# proxy and cached; see integration/go/README.md) and the fault driver.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."

step() { printf '\n==> %s\n' "$*" >&2; }

step "building the real components from the Go module proxy (cached after the first run)"
bash integration/scripts/build-components.sh etcd kube-apiserver kube-controller-manager kube-scheduler csi-mock-driver kubelet-plugin-harness hollow-node helm kubectl snapshot-controller

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo build"
cargo build --workspace --bins

step "cargo test"
# Integration tests share one control plane per test binary. Keep its run
# directories (component logs) so a failure can be diagnosed; print their log
# tails on failure, remove them on success.
export CSI_SIDECAR_KEEP_CLUSTER=1 CSI_SIDECAR_CLUSTER_DIR="$PWD/target/test-cluster-runs"
rm -rf "$CSI_SIDECAR_CLUSTER_DIR"
# The test output also goes to a file, so that on failure the failing tests'
# own output is printed again after the component logs: CI shows the end.
TEST_LOG="$PWD/target/cargo-test.log"
if ! cargo test --workspace --no-fail-fast 2>&1 | tee "$TEST_LOG"; then
	for d in "$CSI_SIDECAR_CLUSTER_DIR"/*/; do
		[[ -d "$d" ]] || continue
		printf '\n----- control-plane run %s -----\n' "$d" >&2
		for f in "$d"logs/*.log; do
			[[ -f "$f" ]] || continue
			printf -- '--- %s (last 30 lines)\n' "$f" >&2
			tail -n 30 "$f" >&2
		done
	done
	printf '\n===== failing tests (their output, from %s) =====\n' "target/cargo-test.log" >&2
	# Each test binary's "failures:" section: the failed tests' output, then their names.
	awk '/^failures:$/ {on = 1} on {print} /^test result:/ {on = 0}' "$TEST_LOG" | tail -n 400 >&2
	grep -E '^test .* \.\.\. FAILED$|^error: test failed|^error: could not compile' "$TEST_LOG" >&2 || true
	exit 1
fi
rm -rf "$CSI_SIDECAR_CLUSTER_DIR"
