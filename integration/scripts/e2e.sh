#!/usr/bin/env bash
# Kubernetes' own storage e2e specs against csi-sidecar (issue 42; results
# and the cause of every failure in docs/e2e.md).
#
# Builds e2e.test (integration/go/e2e: Kubernetes' storage e2e packages in a
# test main of our own, cached like the other components), the images under
# the references the e2e manifests name (node-images.sh --e2e: csi-sidecar
# as each upstream sidecar, hostpath-standin as hostpathplugin,
# busybox and pause), starts the test world with a real node and the
# snapshot-controller, runs the specs serially, keeps the JUnit report and
# the log, writes the summary table (e2e-summary.py: summary.md), and stops
# the world (nothing left behind).
#
# Usage: integration/scripts/e2e.sh
#   E2E_SUITE  all (default): mock, then external, each in a world of its
#              own, their reports in E2E_OUT/mock and E2E_OUT/external; the
#              run fails if either does;
#              mock: the "CSI Mock" specs, each deploying the e2e
#              mock driver's manifests with csi-sidecar as the sidecars;
#              external: Kubernetes' external storage testsuites against
#              csi-sidecar and the mock driver installed by the Helm chart
#              (manifests/helm/csi-sidecar/examples/csi-mock-driver.yaml
#              plus integration/e2e/external-values.yaml: volumes keep
#              data), described by integration/e2e/testdriver.yaml
#   E2E_FOCUS  the specs (default: per suite, see below; only with one suite)
#   E2E_SKIP   the specs left out (default: per suite, see below; only with one suite)
#   E2E_OUT    where the images, the report and the log go (default target/e2e)
# Needs root (the real node) and the packages install-node-packages.sh installs.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."

log() { printf 'e2e: %s\n' "$*" >&2; }
die() {
	printf 'e2e: FAIL: %s\n' "$*" >&2
	exit 1
}

SUITE=${E2E_SUITE:-all}
OUT=${E2E_OUT:-${CARGO_TARGET_DIR:-target}/e2e}
if [[ $SUITE == all ]]; then
	[[ -z ${E2E_FOCUS:-}${E2E_SKIP:-} ]] || die "E2E_FOCUS and E2E_SKIP choose specs of one suite: set E2E_SUITE=mock or E2E_SUITE=external"
	failed=()
	for suite in mock external; do
		log "the $suite suite (report in $OUT/$suite) ..."
		E2E_SUITE=$suite E2E_OUT=$OUT/$suite bash integration/scripts/e2e.sh || failed+=("$suite")
	done
	((${#failed[@]} == 0)) || die "failed: ${failed[*]} (see $OUT/<suite>/summary.md and e2e.log)"
	log "both suites passed"
	exit 0
fi
DRIVER_DEFINITION=$PWD/integration/e2e/testdriver.yaml
case $SUITE in
mock)
	FOCUS=${E2E_FOCUS:-CSI Mock}
	SKIP=${E2E_SKIP:-Disruptive|SELinux|Alpha|OffByDefault}
	SUITE_ARGS=()
	;;
external)
	focus='External Storage.*\] (volumes|provisioning|multiVolume|subPath|volumeIO|volume-expand|read-write-once-pod|ephemeral) '
	# "any volume data source" deploys a volume populator and the data
	# source validator, whose images are not built here.
	skip='\[Feature:|Disruptive|Slow|any volume data source'
	FOCUS=${E2E_FOCUS:-$focus}
	SKIP=${E2E_SKIP:-$skip}
	SUITE_ARGS=(--storage.testdriver="$DRIVER_DEFINITION")
	;;
*) die "E2E_SUITE=$SUITE: all, mock or external" ;;
esac
((EUID == 0)) || die "needs root (the real node runs containerd and the kubelet)"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if command -v apt-get >/dev/null; then
	bash integration/scripts/install-node-packages.sh
fi
bash integration/scripts/build-components.sh etcd kube-apiserver kube-controller-manager kube-scheduler kubelet \
	snapshot-controller csi-mock-driver hostpath-standin e2e.test agnhost helm >&2
E2E_TEST=$(bash integration/scripts/build-components.sh --print-path e2e.test)
cargo build --release --locked -p csi-sidecar --bin csi-sidecar >&2
cargo build --locked -p csi-sidecar-integration --bin cluster >&2
TARGET=${CARGO_TARGET_DIR:-target}
bash integration/scripts/node-images.sh --out "$OUT/images" --sidecar-binary "$TARGET/release/csi-sidecar" --e2e

log "starting the test world (control plane, snapshot-controller, real node) ..."
rm -rf "$OUT/cluster" "$OUT/cluster.json"
"$TARGET/debug/cluster" serve --real-node "$OUT/images" --snapshots --ignore-stdin --quiet \
	--run-dir "$OUT/cluster" --info-file "$OUT/cluster.json" >"$OUT/cluster.out" &
WORLD=$!
stop_world() {
	kill -TERM "$WORLD" 2>/dev/null || true
	wait "$WORLD" || log "the test world's teardown reported a failure (see $OUT/cluster/logs)"
}
trap stop_world EXIT
for _ in $(seq 1 120); do
	[[ -s $OUT/cluster.json ]] && break
	kill -0 "$WORLD" 2>/dev/null || die "the test world did not start (see $OUT/cluster/logs)"
	sleep 1
done
[[ -s $OUT/cluster.json ]] || die "the test world was not ready within 120 s"
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, d))' "$OUT/cluster.json" "$1"; }
KUBECONFIG_FILE=$(field kubeconfig)
APISERVER="127.0.0.1:$(field 'ports["apiserver"]')"
KUBELET_ROOT=$(field 'real_node["root_dir"]')

if [[ $SUITE == external ]]; then
	HELM=$(bash integration/scripts/build-components.sh --print-path helm)
	helm() { "$HELM" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
	# In the node's directory: the world's teardown removes it whole, and
	# its footprint check finds any mount left below it.
	DATA=$(dirname "$KUBELET_ROOT")/csi-data
	data_volume=$(printf '[{"name":"csi-data","hostPath":{"path":"%s","type":"DirectoryOrCreate"}}]' "$DATA")
	log "installing csi-sidecar and the mock driver with the Helm chart (volumes keep data in $DATA) ..."
	helm install mock manifests/helm/csi-sidecar --namespace csi-mock --create-namespace \
		--values manifests/helm/csi-sidecar/examples/csi-mock-driver.yaml --values integration/e2e/external-values.yaml \
		--set node.kubeletDir="$KUBELET_ROOT" \
		--set-json "extraEnv=[{\"name\":\"KUBERNETES_SERVICE_HOST\",\"value\":\"127.0.0.1\"},{\"name\":\"KUBERNETES_SERVICE_PORT\",\"value\":\"${APISERVER##*:}\"}]" \
		--set-json "driver.controller.extraVolumes=$data_volume" --set-json "driver.node.extraVolumes=$data_volume" \
		--wait --timeout 5m >&2
	uninstall() {
		helm uninstall mock --namespace csi-mock --wait --timeout 5m >&2 || log "helm uninstall failed"
		stop_world
	}
	trap uninstall EXIT
fi

log "running the specs matching '$FOCUS' (skipping '$SKIP') ..."
set +e
(cd "$OUT" && "$E2E_TEST" --kubeconfig="$KUBECONFIG_FILE" --provider=skeleton --kubelet-root-dir="$KUBELET_ROOT" \
	--csi-sidecar.apiserver="$APISERVER" "${SUITE_ARGS[@]}" -ginkgo.focus="$FOCUS" -ginkgo.skip="$SKIP" -ginkgo.no-color -ginkgo.v -ginkgo.timeout=24h \
	-ginkgo.junit-report="$OUT/junit.xml" -test.run=TestE2E) >"$OUT/e2e.log" 2>&1
rc=$?
set -e
log "summary ($OUT/junit.xml, $OUT/e2e.log):"
grep -E '^Ran [0-9]+ of|^(SUCCESS|FAIL)! --' "$OUT/e2e.log" >&2 || log "no ginkgo summary: see $OUT/e2e.log"
grep -E '^  \[FAIL\]' "$OUT/e2e.log" >&2 || true
# A spec naming an image the world does not have makes containerd try a
# pull (a name lookup off the loopback, refused): say which, to add it to
# node-images.sh --e2e or skip the spec.
pulls=$(grep -o 'PullImage \\\?"[^"\\]*' "$OUT/cluster/logs/containerd.log" 2>/dev/null | sed 's/.*"//' | sort -u || true)
[[ -z $pulls ]] || log "images the specs named that the world does not have (pull attempted): $(echo $pulls)"
if [[ -s $OUT/junit.xml ]]; then
	python3 integration/scripts/e2e-summary.py "$OUT/junit.xml" >"$OUT/summary.md"
	log "the summary table: $OUT/summary.md"
	head -n 20 "$OUT/summary.md" >&2
fi
exit "$rc"
