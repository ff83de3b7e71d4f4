#!/usr/bin/env bash
# Builds the Go programs the csi-sidecar integration tests run, from the wrapper
# modules in integration/go/ (see integration/go/README.md), into a binary cache
# outside the source tree:
#
#   ${CSI_SIDECAR_CACHE:-$HOME/.cache/csi-sidecar}/bin/<component>-<key>/<component>
#
# <key> = <version>-<go version>-<hash>, where <hash> covers the wrapper's go.mod
# and go.sum, the sources of our own programs, and the build flags. A component
# whose binary is already there is not rebuilt ("cached: ...").
#
# Usage:
#   build-components.sh [COMPONENT...]         build (default: the test components)
#   build-components.sh --print-path COMPONENT print the binary's path (building it
#                                              first if missing); the path is the
#                                              only thing written to stdout
#   build-components.sh --list                 list the components
#
# Components: etcd kube-apiserver kube-controller-manager csi-mock-driver
#             kubelet-plugin-harness (the test components, built by default)
#             helm kubectl (for integration/scripts/check-manifests.sh; built
#             only when named, from integration/go/helm)
#             kube-scheduler hollow-node (the real node: the scheduler and
#             kubemark's hollow kubelet in a main of our own; built only when
#             named, from integration/go/kube)
#             kubelet (the real kubelet, cmd/kubelet, for the real node with
#             containerd; built only when named, from integration/go/kube)
#             csi-translate (k8s.io/csi-translation-lib over a corpus, for
#             integration/tests/no_cluster/migration_corpus.rs; built only when named,
#             from integration/go/kube)
#             snapshot-controller (the common snapshot controller; built only
#             when named, from integration/go/helm, so that it reuses the
#             packages helm and kubectl compiled; the snapshot CRDs of the
#             same release are copied next to it, into crd/)
#             promtool (Prometheus' rule checker and rule unit tester, for
#             the chart's alerts in integration/tests/no_cluster/monitoring.rs; built
#             only when named, from integration/go/promtool)
#             e2e.test (Kubernetes' storage e2e suite with a main of our own,
#             `go test -c`, for integration/scripts/e2e.sh; built only when
#             named, from integration/go/e2e)
#             agnhost (Kubernetes' e2e test image program, for e2e.sh's
#             agnhost image; built only when named, from integration/go/e2e)
#             hostpath-standin (hostpathplugin in the e2e mock manifests:
#             the proxy to e2e.test's embedded driver, or the mock service
#             itself; for e2e.sh's images; built only when named, from
#             integration/go/kube)
#
# Environment:
#   CSI_SIDECAR_KUBE_VERSION the Kubernetes version of the cluster under test
#                            (kube-apiserver, kube-controller-manager,
#                            kube-scheduler, kubelet, and etcd at the version
#                            that release pins): one of the modules in
#                            integration/go/kube-versions/ (see
#                            kube-version-module.sh); default: the version of
#                            integration/go/kube, which also builds the test
#                            tools (CSI mock driver, hollow node, ...) at every
#                            version
#   CSI_SIDECAR_CACHE        cache root (default $HOME/.cache/csi-sidecar)
#   CSI_SIDECAR_BUILD_NICE   niceness of the go build (default 10; 0 disables)
#   GOMODCACHE, GOCACHE, GOPROXY are honoured as usual. GOTOOLCHAIN=local,
#   GOWORK=off, CGO_ENABLED=0 and GOFLAGS=-mod=readonly are always set: the
#   committed go.sum files must be complete.
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
GO_DIR=$(cd -- "$SCRIPT_DIR/../go" && pwd)
CACHE_ROOT=${CSI_SIDECAR_CACHE:-$HOME/.cache/csi-sidecar}
NICENESS=${CSI_SIDECAR_BUILD_NICE:-10}
DEFAULT_COMPONENTS=(etcd kube-apiserver kube-controller-manager csi-mock-driver kubelet-plugin-harness)
ALL_COMPONENTS=("${DEFAULT_COMPONENTS[@]}" kube-scheduler hollow-node kubelet helm kubectl snapshot-controller csi-translate promtool e2e.test agnhost hostpath-standin)

export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly
KUBE_VERSION=${CSI_SIDECAR_KUBE_VERSION:-}

log() { printf 'build-components: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

usage() {
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

# build_of COMPONENT -> the build that makes it: the components of one build
# share one go build, its tags and its ldflags (its recipe)
build_of() {
	case $1 in
	etcd) if [[ -n $KUBE_VERSION ]]; then echo etcdver; else echo etcd; fi ;;
	kube-apiserver | kube-controller-manager | kube-scheduler | kubelet) if [[ -n $KUBE_VERSION ]]; then echo kubever; else echo kube; fi ;;
	kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | csi-mock-driver | kubelet-plugin-harness | hollow-node | csi-translate | hostpath-standin) echo kube ;;
	e2e.test) echo e2e ;;
	agnhost) echo agnhost ;;
	helm | kubectl) echo helm ;;
	snapshot-controller) echo snapshotter ;;
	promtool) echo promtool ;;
	*) return 1 ;;
	esac
}

# dir_of BUILD -> wrapper module directory name under integration/go. The
# snapshotter build is a second go build in the helm module (its own ldflags):
# one go.mod gives both one version of every shared dependency, so it links
# the packages the helm build compiled from the Go build cache.
dir_of() {
	case $1 in
	snapshotter) echo helm ;;
	agnhost) echo e2e ;;
	kubever) echo "kube-versions/$KUBE_VERSION" ;;
	etcdver) echo etcd ;;
	*) echo "$1" ;;
	esac
}

# modfile_of BUILD -> the module file of a build: its directory's go.mod, or
# for etcd at a Kubernetes version the etcd.mod that kube-version-module.sh
# wrote beside that version's module (the etcd that release pins), used
# with `go build -modfile`. Its sums are in the .sum file of the same name.
modfile_of() {
	case $1 in
	etcdver) echo "$GO_DIR/kube-versions/$KUBE_VERSION/etcd.mod" ;;
	*) echo "$GO_DIR/$(dir_of "$1")/go.mod" ;;
	esac
}

# package_of COMPONENT -> import path (or relative package) to build
package_of() {
	case $1 in
	etcd) echo . ;;
	kube-apiserver | kube-controller-manager | kube-scheduler | kubelet) echo "k8s.io/kubernetes/cmd/$1" ;;
	csi-mock-driver | kubelet-plugin-harness | hollow-node | csi-translate | hostpath-standin | kubectl) echo "./cmd/$1" ;;
	e2e.test) echo . ;;
	agnhost) echo k8s.io/kubernetes/test/images/agnhost ;;
	helm) echo helm.sh/helm/v4/cmd/helm ;;
	snapshot-controller) echo github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller ;;
	promtool) echo github.com/prometheus/prometheus/cmd/promtool ;;
	esac
}

# own_sources COMPONENT -> our own source files that go into the binary
own_sources() {
	case $1 in
	etcd) echo "$GO_DIR/etcd/main.go" ;;
	csi-mock-driver | kubelet-plugin-harness | hollow-node | csi-translate | hostpath-standin)
		find "$GO_DIR/kube/cmd/$1" -type f -name '*.go' | LC_ALL=C sort
		;;
	e2e.test)
		find "$GO_DIR/e2e" -type f -name '*.go' | LC_ALL=C sort
		;;
	kubectl)
		find "$GO_DIR/helm/cmd/$1" -type f -name '*.go' | LC_ALL=C sort
		;;
	esac
}

# modver GO_MOD MODULE_PATH -> the required version of MODULE_PATH in GO_MOD
modver() {
	awk -v m="$2" '
		$1 == "require" && $2 == m { print $3; exit }
		$1 == m && $2 ~ /^v/ { print $2; exit }
	' "$1"
}

# Per-build recipe: sets VERSION, TAGS and LDFLAGS.
recipe() {
	local build=$1 gomod
	gomod=$(modfile_of "$build")
	GO_VERSION=$LOCAL_GO_VERSION
	export GOTOOLCHAIN=local
	case $build in
	etcd | etcdver)
		[[ -f $gomod ]] || die "CSI_SIDECAR_KUBE_VERSION=$KUBE_VERSION: no $gomod (kube-version-module.sh $KUBE_VERSION)"
		VERSION=$(modver "$gomod" go.etcd.io/etcd/server/v3)
		[[ -n $VERSION ]] || die "no go.etcd.io/etcd/server/v3 requirement in $gomod"
		TAGS=""
		LDFLAGS="-s -w"
		;;
	kube | kubever | e2e | agnhost)
		if [[ $build == kubever ]]; then
			[[ -f $gomod ]] || die "CSI_SIDECAR_KUBE_VERSION=$KUBE_VERSION: no module $gomod (kube-version-module.sh $KUBE_VERSION)"
			# A version needing a newer Go names it (toolchain line): from the proxy.
			if grep -q '^toolchain ' "$gomod"; then
				export GOTOOLCHAIN=auto
				GO_VERSION=$(cd "$(dirname "$gomod")" && go env GOVERSION)
			fi
		fi
		VERSION=$(modver "$gomod" k8s.io/kubernetes)
		[[ $VERSION =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "cannot parse the k8s.io/kubernetes version in $gomod"
		local major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]} p
		# Same tags and version stamping as upstream release builds
		# (hack/lib/golang.sh, hack/lib/version.sh).
		TAGS="selinux,notest,grpcnotrace"
		# e2e.test as hack/make-rules builds it: a test binary, no notest.
		[[ $build != e2e && $build != agnhost ]] || TAGS=""
		LDFLAGS="-s -w"
		for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
			LDFLAGS+=" -X $p.gitVersion=$VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
		done
		;;
	helm)
		# helm (VERSION) and kubectl, whose version is that of the k8s.io/kubectl
		# staging module helm requires (v0.X.Y = Kubernetes v1.X.Y). One go
		# build serves both, so the ldflags stamp both (an -X for a package
		# that is not linked is ignored).
		VERSION=$(modver "$gomod" helm.sh/helm/v4)
		[[ -n $VERSION ]] || die "no helm.sh/helm/v4 requirement in $gomod"
		local kv
		kv=$(modver "$gomod" k8s.io/kubectl)
		[[ $kv =~ ^v0\.([0-9]+)\.([0-9]+)$ ]] || die "cannot parse the k8s.io/kubectl version in $gomod"
		KUBECTL_VERSION="v1.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
		TAGS=""
		LDFLAGS="-s -w -X helm.sh/helm/v4/internal/version.version=$VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
		for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
			LDFLAGS+=" -X $p.gitVersion=$KUBECTL_VERSION -X $p.gitMajor=1 -X $p.gitMinor=${BASH_REMATCH[1]} -X $p.gitTreeState=clean"
		done
		;;
	snapshotter)
		VERSION=$(modver "$gomod" github.com/kubernetes-csi/external-snapshotter/v8)
		[[ -n $VERSION ]] || die "no github.com/kubernetes-csi/external-snapshotter/v8 requirement in $gomod"
		local cv
		cv=$(modver "$gomod" github.com/kubernetes-csi/external-snapshotter/client/v8)
		[[ $cv == "$VERSION" ]] || die "client/v8 ($cv) and external-snapshotter/v8 ($VERSION) differ in $gomod"
		TAGS=""
		LDFLAGS="-s -w -X main.version=$VERSION"
		;;
	promtool)
		# Prometheus 3.x is published as module versions v0.3MM.P for
		# release v3.MM.P; stamped as upstream's .promu.yml does. The tag
		# leaves out the service-discovery plugins (cloud SDKs) that
		# promtool's rule commands never use.
		VERSION=$(modver "$gomod" github.com/prometheus/prometheus)
		[[ $VERSION =~ ^v0\.3([0-9][0-9])\.([0-9]+)$ ]] || die "cannot parse the github.com/prometheus/prometheus version in $gomod"
		PROMTOOL_VERSION="v3.$((10#${BASH_REMATCH[1]})).${BASH_REMATCH[2]}"
		TAGS="remove_all_sd"
		LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=${PROMTOOL_VERSION#v} -X github.com/prometheus/common/version.Branch=HEAD"
		;;
	*) die "unknown build $build" ;;
	esac
}

# version_of COMPONENT -> the version in its cache key (needs recipe)
version_of() {
	case $1 in
	kubectl) echo "$KUBECTL_VERSION" ;;
	promtool) echo "$PROMTOOL_VERSION" ;;
	*) echo "$VERSION" ;;
	esac
}

# key_of COMPONENT -> cache key (needs recipe to have run for its build)
key_of() {
	local comp=$1 modfile f hash files
	modfile=$(modfile_of "$(build_of "$comp")")
	mapfile -t files < <(own_sources "$comp")
	hash=$(
		{
			printf 'component %s\npackage %s\ngo %s\nplatform %s\ntags %s\nldflags %s\nflags -trimpath -buildvcs=false\n' \
				"$comp" "$(package_of "$comp")" "$GO_VERSION" "$GO_PLATFORM" "$TAGS" "$LDFLAGS"
			for f in "$modfile" "${modfile%.mod}.sum" "${files[@]}"; do
				printf 'file %s\n' "${f#"$GO_DIR"/}"
				cat -- "$f"
			done
		} | sha256sum | cut -c1-12
	)
	printf '%s-%s-%s\n' "$(version_of "$comp")" "$GO_VERSION" "$hash"
}

bin_path() {
	local comp=$1
	printf '%s/bin/%s-%s/%s\n' "$CACHE_ROOT" "$comp" "$(key_of "$comp")" "$comp"
}

# build_components BUILD COMPONENT... : one go build for all missing components
# of a build, so that shared packages are compiled once.
build_components() {
	local build=$1 mod
	shift
	mod=$(dir_of "$build")
	recipe "$build"
	local comp dest missing=() pkgs=()
	for comp in "$@"; do
		dest=$(bin_path "$comp")
		if [[ -x $dest ]]; then
			echo "cached: $dest"
		else
			missing+=("$comp")
		fi
	done
	((${#missing[@]})) || return 0

	mkdir -p "$CACHE_ROOT/bin"
	# Serialize builds of the same module (e.g. parallel test processes).
	local lock_fd
	exec {lock_fd}>"$CACHE_ROOT/bin/.lock-${mod//\//-}"
	if command -v flock >/dev/null; then
		flock "$lock_fd"
	fi
	# Someone else may have built them while we waited.
	local todo=()
	for comp in "${missing[@]}"; do
		dest=$(bin_path "$comp")
		if [[ -x $dest ]]; then
			echo "cached: $dest"
		else
			todo+=("$comp")
			pkgs+=("$(package_of "$comp")")
		fi
	done
	if ((${#todo[@]})); then
		local tmp start nice_cmd=()
		tmp=$(mktemp -d "$CACHE_ROOT/bin/.tmp-$build.XXXXXX")
		TMP_DIRS+=("$tmp")
		((NICENESS == 0)) || nice_cmd=(nice -n "$NICENESS")
		log "building ${todo[*]} ($mod module, $VERSION, $GO_VERSION) ..."
		start=$SECONDS
		local gobuild=(go build -trimpath -buildvcs=false -ldflags="$LDFLAGS" -o "$tmp/")
		# A test binary: `go test -c` of the wrapper's own test package.
		[[ $build != e2e ]] || gobuild=(go test -c -trimpath -buildvcs=false -ldflags="$LDFLAGS" -o "$tmp/e2e.test")
		[[ -z $TAGS ]] || gobuild+=(-tags="$TAGS")
		[[ $build != etcdver ]] || gobuild+=(-modfile="$(modfile_of "$build")")
		(cd "$GO_DIR/$mod" && "${nice_cmd[@]}" "${gobuild[@]}" "${pkgs[@]}") >&2 ||
			die "go build failed for ${todo[*]} (module integration/go/$mod)"
		log "built ${todo[*]} in $((SECONDS - start))s"
		for comp in "${todo[@]}"; do
			dest=$(bin_path "$comp")
			[[ -f $tmp/$comp ]] || die "go build did not produce $comp"
			mkdir -p "$(dirname "$dest")"
			if [[ $comp == snapshot-controller ]]; then
				# The CRDs of the same release, from the client module.
				local crds
				crds=$(cd "$GO_DIR/$mod" && go list -m -f '{{.Dir}}' github.com/kubernetes-csi/external-snapshotter/client/v8)/config/crd
				mkdir -p "$(dirname "$dest")/crd"
				cp "$crds"/*.storage.k8s.io_*.yaml "$(dirname "$dest")/crd/"
			fi
			mv -f "$tmp/$comp" "$dest"
			echo "built: $dest"
		done
		rm -rf "$tmp"
	fi
	exec {lock_fd}>&-
}

# The SnapshotMetadataService CRD (cbt.storage.k8s.io/v1beta1, changed block
# tracking) of external-snapshot-metadata's client module, beside the
# snapshot CRDs (the world installs every crd/*.yaml); the module's files are
# checksummed by go.
CBT_CLIENT_VERSION=v1.0.0
CBT_CRD=cbt.storage.k8s.io_snapshotmetadataservices.yaml
ensure_cbt_crd() {
	local dir=$1 src
	[[ -f $dir/$CBT_CRD ]] && return 0
	src=$(cd "$GO_DIR" && GOFLAGS=-mod=mod go mod download -json "github.com/kubernetes-csi/external-snapshot-metadata/client@$CBT_CLIENT_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[[ -n $src && -f $src/config/crd/$CBT_CRD ]] ||
		die "no $CBT_CRD in github.com/kubernetes-csi/external-snapshot-metadata/client@$CBT_CLIENT_VERSION"
	mkdir -p "$dir"
	cp "$src/config/crd/$CBT_CRD" "$dir/"
	chmod u+w "$dir/$CBT_CRD"
	echo "copied: $dir/$CBT_CRD"
}

TMP_DIRS=()
cleanup() {
	local d
	for d in "${TMP_DIRS[@]}"; do
		rm -rf "$d"
	done
}
trap cleanup EXIT

print_path=""
components=()
while (($#)); do
	case $1 in
	-h | --help)
		usage
		exit 0
		;;
	--list)
		printf '%s\n' "${ALL_COMPONENTS[@]}"
		exit 0
		;;
	--print-path)
		[[ $# -ge 2 ]] || die "--print-path needs a component"
		print_path=$2
		shift 2
		;;
	--print-path=*)
		print_path=${1#--print-path=}
		shift
		;;
	-*) die "unknown option $1 (see --help)" ;;
	*)
		components+=("$1")
		shift
		;;
	esac
done

if [[ -n $print_path ]]; then
	((${#components[@]} == 0)) || die "--print-path takes exactly one component"
	components=("$print_path")
	# Keep stdout for the path alone.
	exec 3>&1 1>&2
fi
((${#components[@]})) || components=("${DEFAULT_COMPONENTS[@]}")
for comp in "${components[@]}"; do
	build_of "$comp" >/dev/null || die "unknown component '$comp' (known: ${ALL_COMPONENTS[*]})"
done

command -v go >/dev/null || die "go is not on PATH (Go >= 1.26 is needed)"
LOCAL_GO_VERSION=$(go env GOVERSION)
GO_VERSION=$LOCAL_GO_VERSION
GO_PLATFORM=$(go env GOOS)/$(go env GOARCH)

if [[ -n $KUBE_VERSION ]]; then
	for comp in "${components[@]}"; do
		if [[ $(build_of "$comp") == kubever ]] &&
			! grep -q "k8s.io/kubernetes/cmd/$comp\$" "$GO_DIR/kube-versions/$KUBE_VERSION/go.mod" 2>/dev/null; then
			die "$comp is not built at $KUBE_VERSION (integration/go/kube-versions/$KUBE_VERSION/go.mod; see kube-version-module.sh)"
		fi
	done
fi
for build in etcd etcdver kube kubever helm snapshotter promtool e2e agnhost; do
	wanted=()
	for comp in "${components[@]}"; do
		if [[ $(build_of "$comp") == "$build" ]]; then
			wanted+=("$comp")
		fi
	done
	((${#wanted[@]} == 0)) || build_components "$build" "${wanted[@]}"
	if [[ $build == snapshotter && " ${wanted[*]} " == *" snapshot-controller "* ]]; then
		recipe snapshotter
		ensure_cbt_crd "$(dirname "$(bin_path snapshot-controller)")/crd"
	fi
done

if [[ -n $print_path ]]; then
	recipe "$(build_of "$print_path")"
	bin_path "$print_path" >&3
fi
