#!/usr/bin/env bash
# Builds (or finds cached) the cluster components of each Kubernetes version
# the skew suite runs at: etcd (the version that release pins),
# kube-apiserver, kube-controller-manager, kube-scheduler, and the kubelet
# where the version's module builds one (see kube-version-module.sh).
#
# Usage: integration/scripts/build-skew-components.sh VERSION...
#   VERSION: vX.Y.Z of a module in integration/go/kube-versions/, or "default"
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."
for v in "$@"; do
	comps=(etcd kube-apiserver kube-controller-manager kube-scheduler)
	if [[ $v == default ]]; then
		unset CSI_SIDECAR_KUBE_VERSION
		comps+=(kubelet)
	else
		[[ -f integration/go/kube-versions/$v/go.mod ]] ||
			{ echo "build-skew-components: no module integration/go/kube-versions/$v" >&2; exit 2; }
		export CSI_SIDECAR_KUBE_VERSION=$v
		grep -q 'k8s.io/kubernetes/cmd/kubelet$' "integration/go/kube-versions/$v/go.mod" && comps+=(kubelet)
	fi
	echo "==> Kubernetes $v: ${comps[*]}" >&2
	bash integration/scripts/build-components.sh "${comps[@]}" >&2
done
