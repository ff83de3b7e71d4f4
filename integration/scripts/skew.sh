#!/usr/bin/env bash
# The skew suite: the integration tests of the API surface that changed
# between Kubernetes minors, run against the cluster of each version in
# integration/go/kube-versions/ (and the default one): kube-apiserver,
# kube-controller-manager, kube-scheduler and the kubelet at that version,
# the test tools (CSI mock driver, hollow kubelet, snapshot-controller) at
# their own. Results: one line per version and test executable, and
# target/skew/<version>/ with each executable's output.
#
# Usage: integration/scripts/skew.sh [VERSION...]
#   VERSION: vX.Y.Z of a module in integration/go/kube-versions/, or
#   "default"; no VERSION: all of them.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."

# The API surface that changed: provisioning with topology and data
# sources, attach/detach, expansion and VolumeAttributesClass modify,
# snapshots and group snapshots, capacity, registration with a kubelet,
# streaming lists vs LIST, leader election; the real node and its chart.
SUITE=(provisioner provisioner_sources provisioner_vac attacher resizer snapshotter group_snapshots
	capacity lists leader_election node_workflow kubelet_registration real_node)

versions=("$@")
if ((${#versions[@]} == 0)); then
	versions=(default)
	for d in integration/go/kube-versions/v*/; do versions+=("$(basename "$d")"); done
fi

cargo build --workspace --bins
mkdir -p target/skew
ARTIFACTS=$PWD/target/skew/artifacts.json
cargo test --workspace --no-run --message-format=json-render-diagnostics >"$ARTIFACTS"

declare -A outcome
for v in "${versions[@]}"; do
	suite=("${SUITE[@]}")
	if [[ $v == default ]]; then
		unset CSI_SIDECAR_KUBE_VERSION
	else
		export CSI_SIDECAR_KUBE_VERSION=$v
		if ! grep -q 'k8s.io/kubernetes/cmd/kubelet$' "integration/go/kube-versions/$v/go.mod"; then
			# No kubelet at this version (kube-version-module.sh says why).
			suite=("${suite[@]/real_node/}")
		fi
	fi
	comps=(kube-apiserver kube-controller-manager kube-scheduler)
	[[ " ${suite[*]} " == *" real_node "* ]] && comps+=(kubelet)
	echo "==> $v: building ${comps[*]}" >&2
	bash integration/scripts/build-components.sh "${comps[@]}" >&2
	export CSI_SIDECAR_CLUSTER_DIR=$PWD/target/skew/$v/cluster-runs
	rm -rf "target/skew/$v"
	mkdir -p "$CSI_SIDECAR_CLUSTER_DIR"
	set +e
	python3 integration/scripts/run-tests.py --log-dir "target/skew/$v" "$ARTIFACTS" $(printf '%s ' "${suite[@]}")
	outcome[$v]=$?
	set -e
done

echo
echo "skew suite:"
fail=0
for v in "${versions[@]}"; do
	if ((outcome[$v] == 0)); then
		echo "  $v: passed (target/skew/$v)"
	else
		echo "  $v: FAILED (target/skew/$v)"
		fail=1
	fi
done
exit $fail
