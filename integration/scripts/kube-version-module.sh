#!/usr/bin/env bash
# Writes the wrapper module of one more Kubernetes version for the version
# matrix: integration/go/kube-versions/<version>/go.mod and go.sum, building
# kube-apiserver, kube-controller-manager, kube-scheduler and the kubelet of
# k8s.io/kubernetes <version> (the cluster under test; the test tools of
# integration/go/kube stay at the default version). Every staging module
# k8s.io/kubernetes maps to ./staging/src/k8s.io/<name> is replaced by its
# published v0.<minor>.<patch>, read from that version's own go.mod.
#
# A version whose go.mod needs a newer Go than this machine's gets a
# `toolchain` line; build-components.sh then builds it with GOTOOLCHAIN=auto
# (the toolchain comes from the Go module proxy, golang.org/toolchain).
#
# It also writes etcd.mod and etcd.sum there: the module file that builds
# integration/go/etcd (build-components.sh, `go build -modfile`) at the etcd
# that version pins (build/dependencies.yaml, the etcd kubeadm deploys).
#
# Usage: integration/scripts/kube-version-module.sh v1.34.4 [COMPONENT...]
#   COMPONENT: the commands to build (default: kube-apiserver
#   kube-controller-manager kube-scheduler kubelet). v1.38.0-beta.0 is
#   generated without the kubelet: one of its dependencies,
#   sigs.k8s.io/iptables-wrappers v1.0.0, is refused by the module proxy
#   (403), so `go mod tidy` cannot complete with it.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../go"
version=${1:?usage: kube-version-module.sh vX.Y.Z [COMPONENT...]}
shift
commands=("$@")
((${#commands[@]})) || commands=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)(-.*)?$ ]] || { echo "not a Kubernetes version: $version" >&2; exit 2; }
staging="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}${BASH_REMATCH[3]}"
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod
# (Its go.mod arrives even when the module needs a newer Go than this one.)
download=$({ go mod download -json "k8s.io/kubernetes@$version" || true; })
upstream=$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' <<<"$download")
zip=$(sed -n 's/.*"Zip": "\(.*\)".*/\1/p' <<<"$download")
[[ -f $upstream && -f $zip ]] || { echo "cannot download k8s.io/kubernetes@$version" >&2; exit 1; }
dir=kube-versions/$version
mkdir -p "$dir"
go_line=$(awk '$1 == "go" { print $2; exit }' "$upstream")
toolchain_line=$(awk '$1 == "toolchain" { print $2; exit }' "$upstream")
local_go=$(go env GOVERSION)
local_go=${local_go#go}
if [[ $(printf '%s\n%s\n' "$go_line" "$local_go" | sort -V | tail -1) == "$local_go" ]]; then
	go_line=1.26.0 toolchain_line=""
else
	# The newest patch release of that Go the proxy serves.
	minor=${go_line%.*}
	toolchain_line=$(go list -m -versions golang.org/toolchain | tr ' ' '\n' |
		sed -n "s/^v0.0.1-go\(${minor//./\\.}\.[0-9]*\)\.linux-amd64$/go\1/p" | sort -V | tail -1)
	[[ -n $toolchain_line ]] || { echo "no Go $minor toolchain on the module proxy" >&2; exit 1; }
	export GOTOOLCHAIN=$toolchain_line
fi
{
	printf 'module csi-sidecar.invalid/kube-%s\n\ngo %s\n\n' "${version//./-}" "$go_line"
	[[ -z $toolchain_line ]] || printf 'toolchain %s\n\n' "$toolchain_line"
	printf 'require k8s.io/kubernetes %s\n\n' "$version"
	printf 'tool (\n'
	for c in "${commands[@]}"; do
		printf '\tk8s.io/kubernetes/cmd/%s\n' "$c"
	done
	printf ')\n\nreplace (\n'
	awk '$2 == "=>" && $3 ~ /^\.\/staging\/src\// { print $1 }' "$upstream" | sort -u |
		while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
	printf ')\n'
} >"$dir/go.mod"
(cd "$dir" && go mod tidy)
echo "$dir: $(grep -c '=>' "$dir/go.mod") staging modules replaced by $staging, $(wc -l <"$dir/go.sum") go.sum lines"

# The etcd this version pins: the entry after `name: "etcd"` in
# build/dependencies.yaml.
# (From the module zip: a version needing a newer Go is not extracted.)
etcd=$(python3 -c 'import sys, zipfile; sys.stdout.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]).decode())' \
	"$zip" "k8s.io/kubernetes@$version/build/dependencies.yaml" |
	awk '$2 == "name:" && $3 == "\"etcd\"" { on = 1; next } on && $1 == "version:" { print $2; exit }')
[[ $etcd =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "no etcd version in build/dependencies.yaml of $version" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp etcd/main.go "$tmp/"
printf 'module csi-sidecar.invalid/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$etcd" >"$tmp/go.mod"
(cd "$tmp" && GOTOOLCHAIN=local go mod tidy)
cp "$tmp/go.mod" "$dir/etcd.mod"
cp "$tmp/go.sum" "$dir/etcd.sum"
echo "$dir: etcd v$etcd (etcd.mod, $(wc -l <"$dir/etcd.sum") etcd.sum lines)"
