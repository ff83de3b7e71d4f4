#!/usr/bin/env bash
# Builds the OCI images the real node runs, without a registry or a daemon
# (umoci), as one archive each for `ctr images import`:
#
#   <out>/pause.tar            localhost/pause:local      busybox-static `sleep`,
#                                                          containerd's sandbox image
#   <out>/busybox.tar          localhost/busybox:local    busybox-static with /bin/sh,
#                                                          the workload pods' image
#   <out>/csi-mock-driver.tar  localhost/csi-mock-driver:local
#                                                          Kubernetes' CSI mock driver
#                                                          (/csi-mock-driver) and a
#                                                          busybox /bin/sh, which the
#                                                          chart's driver.socketUmask needs
#   <out>/csi-sidecar.tar      localhost/csi-sidecar:dev  manifests/Dockerfile's image,
#                                                          assembled and checked by image.sh
#
# Every image carries exactly one name, a full localhost/ reference: a short
# or temporary tag would be imported under a generated name.
#
# With --e2e, also the images Kubernetes' storage e2e manifests name, under
# their exact references (integration/scripts/e2e.sh):
#
#   registry.k8s.io/sig-storage/csi-provisioner:v6.1.1 (and csi-attacher,
#   csi-resizer, csi-snapshotter, csi-node-driver-registrar at the
#   manifests' versions)                      csi-sidecar's image, entrypoint
#                                             the upstream program's name
#   registry.k8s.io/sig-storage/hostpathplugin:v1.17.1
#                                             hostpath-standin as /hostpathplugin
#                                             (the proxy mode, and the mock
#                                             service as the driver)
#   registry.k8s.io/e2e-test-images/busybox:1.36.1-1 and :1.37.0-1,
#   registry.k8s.io/pause:3.10.2              busybox-static
#   registry.k8s.io/e2e-test-images/nginx:1.15-4
#                                             the busybox image (the specs
#                                             give their own command)
#   registry.k8s.io/e2e-test-images/agnhost:2.63.0
#                                             agnhost (build-components.sh)
#                                             with busybox's applets
#
# Usage: integration/scripts/node-images.sh --out DIR [--sidecar-binary PATH] [--e2e]
#   --sidecar-binary  the csi-sidecar binary to put in the image (default:
#                     image.sh builds the release binary)
# Needs root and umoci (apt-get install umoci busybox-static).
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."

log() { printf 'node-images: %s\n' "$*" >&2; }
die() {
	printf 'node-images: FAIL: %s\n' "$*" >&2
	exit 1
}

OUT="" SIDECAR_BIN="" E2E=0
while (($#)); do
	case $1 in
	--e2e)
		E2E=1
		shift
		;;
	--out)
		OUT=$2
		shift 2
		;;
	--sidecar-binary)
		SIDECAR_BIN=$2
		shift 2
		;;
	*) die "unknown argument $1" ;;
	esac
done
[[ -n $OUT ]] || die "--out DIR is required"
((EUID == 0)) || die "needs root (umoci unpacks with ownership)"
command -v umoci >/dev/null || die "umoci is not installed (apt-get install -y umoci)"
BUSYBOX=/usr/bin/busybox
[[ -x $BUSYBOX ]] && file_is_static=$(readelf -l "$BUSYBOX" 2>/dev/null | grep -c 'program interpreter' || true)
[[ -x $BUSYBOX && ${file_is_static:-1} == 0 ]] ||
	die "a static busybox is needed at $BUSYBOX (apt-get install -y busybox-static)"

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# image NAME REF FILL ENTRYPOINT [ARG...]: a one-layer image whose rootfs FILL
# (a function taking the rootfs path) fills, tagged REF only, archived to
# $OUT/NAME.tar.
image() {
	local name=$1 ref=$2 fill=$3 entrypoint=$4
	shift 4
	local layout=$WORK/$name bundle=$WORK/$name.bundle cmd=() a
	umoci init --layout "$layout"
	umoci new --image "$layout:build"
	umoci unpack --image "$layout:build" "$bundle" >/dev/null
	"$fill" "$bundle/rootfs"
	umoci repack --image "$layout:build" "$bundle" >/dev/null
	for a in "$@"; do cmd+=(--config.cmd "$a"); done
	umoci config --image "$layout:build" --config.entrypoint "$entrypoint" --clear config.cmd "${cmd[@]}" >/dev/null
	retag "$layout" build "$ref"
	archive "$layout" "$name"
}

# retag LAYOUT FROM REF: the layout's only name becomes REF.
retag() {
	umoci tag --image "$1:$2" "$3"
	umoci rm --image "$1:$2"
	local names
	names=$(umoci ls --layout "$1")
	[[ $names == "$3" ]] || die "$1 has the names '$names', not only $3"
}

archive() {
	tar -C "$1" -cf "$OUT/$2.tar.tmp" .
	mv -f "$OUT/$2.tar.tmp" "$OUT/$2.tar"
	log "$2: $(umoci ls --layout "$1") ($(du -h "$OUT/$2.tar" | cut -f1))"
}

with_busybox() {
	mkdir -p "$1/bin" "$1/tmp"
	install -m 0755 "$BUSYBOX" "$1/bin/busybox"
	ln -s busybox "$1/bin/sh"
	chmod 1777 "$1/tmp"
}

image pause localhost/pause:local with_busybox /bin/busybox sleep 2147483647
image busybox localhost/busybox:local with_busybox /bin/sh

DRIVER=$(bash integration/scripts/build-components.sh --print-path csi-mock-driver)
[[ -x $DRIVER ]] || die "no csi-mock-driver at $DRIVER"
with_driver() {
	with_busybox "$1"
	install -m 0755 "$DRIVER" "$1/csi-mock-driver"
}
image csi-mock-driver localhost/csi-mock-driver:local with_driver /csi-mock-driver

# csi-sidecar: image.sh assembles manifests/Dockerfile's runtime stage and
# checks it (every name runs from the unpacked rootfs as the chart's 65532,
# the prober as the image's root against a root-owned 0755 driver socket).
if [[ -n $SIDECAR_BIN ]]; then
	# A debug build carries its debug information: not into the image.
	objcopy --strip-debug "$SIDECAR_BIN" "$WORK/csi-sidecar.bin" || die "cannot strip $SIDECAR_BIN"
	CSI_SIDECAR_IMAGE_BINARY=$WORK/csi-sidecar.bin bash integration/scripts/image.sh --out "$WORK/csi-sidecar"
else
	bash integration/scripts/image.sh --out "$WORK/csi-sidecar"
fi
retag "$WORK/csi-sidecar" csi-sidecar localhost/csi-sidecar:dev
archive "$WORK/csi-sidecar" csi-sidecar

((E2E)) || exit 0
# The e2e manifests' sidecars: csi-sidecar's layout under each reference,
# with the upstream program's name as entrypoint (the manifests give args
# only).
for pair in csi-provisioner:v6.1.1 csi-attacher:v4.11.0 csi-resizer:v2.1.0 csi-snapshotter:v8.5.0 \
	csi-node-driver-registrar:v2.16.0; do
	program=${pair%%:*}
	cp -a "$WORK/csi-sidecar" "$WORK/e2e-$program"
	umoci config --image "$WORK/e2e-$program:localhost/csi-sidecar:dev" --tag "registry.k8s.io/sig-storage/$pair" \
		--config.entrypoint "/$program" >/dev/null
	umoci rm --image "$WORK/e2e-$program:localhost/csi-sidecar:dev"
	archive "$WORK/e2e-$program" "e2e-$program"
done
STANDIN=$(bash integration/scripts/build-components.sh --print-path hostpath-standin)
with_standin() {
	with_busybox "$1"
	install -m 0755 "$STANDIN" "$1/hostpathplugin"
}
image e2e-hostpathplugin registry.k8s.io/sig-storage/hostpathplugin:v1.17.1 with_standin /hostpathplugin
# The e2e specs run busybox's applets by name (sleep, mkdir, base64, ...),
# and read owners by name (`ls -l` shows group 0 as "root" only with an
# /etc/group, as the e2e busybox images have).
with_applets() {
	with_busybox "$1"
	mkdir -p "$1/etc"
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$1/etc/passwd"
	printf 'root:x:0:\nnobody:x:65534:\n' >"$1/etc/group"
	local applet
	for applet in $("$BUSYBOX" --list); do
		[[ -e $1/bin/$applet ]] || ln -s busybox "$1/bin/$applet"
	done
}
image e2e-busybox-1.36 registry.k8s.io/e2e-test-images/busybox:1.36.1-1 with_applets /bin/sh
image e2e-busybox-1.37 registry.k8s.io/e2e-test-images/busybox:1.37.0-1 with_applets /bin/sh
# The volumes suite's exec spec runs its own shell command in nginx's image.
image e2e-nginx registry.k8s.io/e2e-test-images/nginx:1.15-4 with_applets /bin/sh
image e2e-pause registry.k8s.io/pause:3.10.2 with_busybox /bin/busybox sleep 2147483647
# agnhost (the external testsuites' subPath specs), with a shell and the
# applets as its image has, `pause` as its default command.
AGNHOST=$(bash integration/scripts/build-components.sh --print-path agnhost)
with_agnhost() {
	with_applets "$1"
	install -m 0755 "$AGNHOST" "$1/agnhost"
}
image e2e-agnhost registry.k8s.io/e2e-test-images/agnhost:2.63.0 with_agnhost /agnhost pause
