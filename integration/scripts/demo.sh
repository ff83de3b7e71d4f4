#!/usr/bin/env bash
# The demo (first command of the README): builds what is missing, then starts a
# real control plane with a real node (kube-scheduler and kubemark's hollow
# kubelet), the real CSI driver, and csi-sidecar as a driver deploys it (a
# controller process and a node process), all on 127.0.0.1, and runs a pod
# with a new volume through the whole CSI workflow (see
# integration/src/bin/demo.rs).
#
#   demo.sh          run the scenario, then keep serving until Ctrl-C
#   demo.sh --once   run the scenario and exit (non-zero if any step failed)
#   demo.sh --real-node [--once]
#                    instead: the chart installed with helm on a real node
#                    (containerd and the kubelet, as root; apt-get installs
#                    containerd, runc, the CNI plugins, umoci, busybox-static
#                    when missing)
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."

echo "==> building csi-sidecar and the real components (cached after the first run)"
components=(etcd kube-apiserver kube-controller-manager kube-scheduler csi-mock-driver kubelet-plugin-harness hollow-node snapshot-controller)
for a in "$@"; do
	if [[ $a == --real-node ]]; then
		components+=(kubelet helm)
		command -v apt-get >/dev/null && ((EUID == 0)) && bash integration/scripts/install-node-packages.sh
	fi
done
bash integration/scripts/build-components.sh "${components[@]}"
# The debug profile shares its build with the test command (CI runs both).
cargo build --bin csi-sidecar -p csi-sidecar --bin demo --bin cluster -p csi-sidecar-integration
exec "${CARGO_TARGET_DIR:-target}/debug/demo" "$@"
