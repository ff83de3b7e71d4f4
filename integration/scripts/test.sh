#!/usr/bin/env bash
# The test command of the README: formatting, lints, unit tests, and the
# integration tests against the real CSI driver (built from the Go module
# proxy and cached; see integration/go/README.md) and the fault driver.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."

step() { printf '\n==> %s\n' "$*" >&2; }

step "building the test components (cached after the first run)"
CSI_SIDECAR_CSI_MOCK_DRIVER=$(bash integration/scripts/build-components.sh --print-path csi-mock-driver)
export CSI_SIDECAR_CSI_MOCK_DRIVER

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo build"
cargo build --workspace --bins

step "cargo test"
cargo test --workspace
