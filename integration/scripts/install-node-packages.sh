#!/usr/bin/env bash
# Installs, with apt-get, what the image and the real node need and this
# machine lacks: umoci (images without a daemon), containerd and runc (the
# real node's runtime), containernetworking-plugins (its loopback-only
# network), busybox-static (the pause, workload and driver images' shell).
# Nothing is started here: the launcher starts containerd per real node.
set -euo pipefail
want=()
command -v umoci >/dev/null || want+=(umoci)
command -v containerd >/dev/null || want+=(containerd)
command -v runc >/dev/null || want+=(runc)
[[ -x /usr/lib/cni/loopback ]] || want+=(containernetworking-plugins)
[[ -x /usr/bin/busybox ]] && ! readelf -l /usr/bin/busybox 2>/dev/null | grep -q 'program interpreter' || want+=(busybox-static)
((${#want[@]})) || exit 0
echo "install-node-packages: apt-get install ${want[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${want[@]}" >/dev/null ||
	{ apt-get update >/dev/null && apt-get install -y --no-install-recommends "${want[@]}" >/dev/null; } ||
	{ echo "install-node-packages: apt-get install ${want[*]} failed" >&2; exit 1; }
