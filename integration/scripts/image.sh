#!/usr/bin/env bash
# Builds the csi-sidecar OCI image without a daemon (umoci), from the runtime
# stage of manifests/Dockerfile, then unpacks it and runs it from the
# unpacked root filesystem with chroot:
#
#   1. the root filesystem is assembled from the Dockerfile's runtime COPY
#      lines (build-stage files taken from this Debian 12 machine, which is
#      what the build stage is) and its SYMLINKS line;
#   2. packed with umoci into an OCI layout (entrypoint, user, labels as the
#      Dockerfile says), unpacked again, and the unpacked tree compared with
#      the list of files the Dockerfile describes: the same filesystem;
#   3. from the unpacked rootfs, as the chart's user 65532: the entrypoint
#      and every symlink name with --version and --help; as the image's own
#      user (root, as upstream's sidecar images: manifests written for them
#      set no user), livenessprobe against the real CSI driver (Kubernetes'
#      CSI mock driver) whose socket is root's srwxr-xr-x, as most drivers
#      create it, /healthz answering 200 "ok".
#
# Usage: integration/scripts/image.sh [--out DIR]
#   CSI_SIDECAR_IMAGE_PROFILE  release (default, what the Dockerfile ships) or debug
#   CSI_SIDECAR_IMAGE_BINARY   use this csi-sidecar binary instead of building one
# Needs root (chroot, unpacking with ownership) and umoci (apt-get install umoci).
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."

log() { printf 'image: %s\n' "$*" >&2; }
die() {
	printf 'image: FAIL: %s\n' "$*" >&2
	exit 1
}

OUT=""
while (($#)); do
	case $1 in
	--out)
		OUT=$2
		shift 2
		;;
	*) die "unknown argument $1" ;;
	esac
done

((EUID == 0)) || die "needs root (chroot and unpacking the image's ownership)"
command -v umoci >/dev/null || die "umoci is not installed (apt-get install -y umoci)"
command -v readelf >/dev/null || die "readelf (binutils) is not installed"
DOCKERFILE=manifests/Dockerfile
PROFILE=${CSI_SIDECAR_IMAGE_PROFILE:-release}

WORK=$(mktemp -d)
PIDS=()
cleanup() {
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT

# --- the binary ---------------------------------------------------------------
if [[ -n ${CSI_SIDECAR_IMAGE_BINARY:-} ]]; then
	BIN=$CSI_SIDECAR_IMAGE_BINARY
	PROFILE=given
else
	case $PROFILE in
	release) cargo build --release --locked -p csi-sidecar --bin csi-sidecar >&2 && BIN="${CARGO_TARGET_DIR:-target}/release/csi-sidecar" ;;
	debug) cargo build -p csi-sidecar --bin csi-sidecar >&2 && BIN="${CARGO_TARGET_DIR:-target}/debug/csi-sidecar" ;;
	*) die "CSI_SIDECAR_IMAGE_PROFILE=$PROFILE: release or debug" ;;
	esac
fi
[[ -x $BIN ]] || die "no binary at $BIN"
log "binary: $BIN ($PROFILE, $(stat -c %s "$BIN") bytes)"
# The tests' fault points exist in debug builds only (src/modules/kit).
if [[ $PROFILE == release ]] && grep -q CSI_SIDECAR_TEST_PANIC "$BIN"; then
	die "the release binary contains a test fault point (CSI_SIDECAR_TEST_PANIC)"
fi

# --- 1. the runtime stage of the Dockerfile ------------------------------------
stage_from=$(grep -n '^FROM ' "$DOCKERFILE" | tail -1 | cut -d: -f1)
[[ $(sed -n "${stage_from}p" "$DOCKERFILE") == "FROM scratch" ]] || die "the runtime stage is not FROM scratch"
mapfile -t STAGE < <(tail -n +"$stage_from" "$DOCKERFILE")
links_line=$(grep -E '^ARG SYMLINKS="[^"]+"$' "$DOCKERFILE") || die "no SYMLINKS line"
links_line=${links_line#ARG SYMLINKS=\"}
read -r -a LINKS <<<"${links_line%\"}"
USER_LINE="" ENTRY_LINE=""
ROOT=$WORK/tree
mkdir -p "$ROOT"
EXPECTED=$WORK/expected.txt
: >"$EXPECTED"
expect() { # every path and its parents
	local p=$1
	while [[ $p != "/" && -n $p ]]; do
		echo "${p#/}" >>"$EXPECTED"
		p=$(dirname -- "$p")
	done
}
for line in "${STAGE[@]}"; do
	case $line in
	COPY\ *)
		read -r -a words <<<"${line#COPY }"
		from=""
		if [[ ${words[0]} == --from=* ]]; then
			from=${words[0]#--from=}
			words=("${words[@]:1}")
		fi
		dest=${words[-1]}
		srcs=("${words[@]:0:${#words[@]}-1}")
		if [[ $from == build && ${srcs[*]} == "/out/" && $dest == "/" ]]; then
			# The build stage's /out: the binary and its symlinks.
			install -m 0755 "$BIN" "$ROOT/csi-sidecar"
			expect /csi-sidecar
			for name in "${LINKS[@]}"; do
				ln -s csi-sidecar "$ROOT/$name"
				expect "/$name"
			done
			continue
		fi
		for src in "${srcs[@]}"; do
			if [[ -n $from ]]; then
				[[ $from == build ]] || die "COPY --from=$from: unknown stage"
				file=$src # the build stage is Debian 12, as this machine
			else
				file=$src # the build context is the repository root
			fi
			[[ -f $file ]] || die "COPY source $src: no such file here"
			if [[ $dest == */ ]]; then target=$dest$(basename -- "$src"); else target=$dest; fi
			mkdir -p "$ROOT$(dirname -- "$target")"
			cp -L -- "$file" "$ROOT$target"
			expect "$target"
		done
		;;
	USER\ *) USER_LINE=${line#USER } ;;
	ENTRYPOINT\ *) ENTRY_LINE=${line#ENTRYPOINT } ;;
	esac
done
[[ -z $USER_LINE ]] || die "runtime USER is '$USER_LINE': the image runs as root, as upstream's (no USER)"
[[ $ENTRY_LINE == '["/csi-sidecar"]' ]] || die "runtime ENTRYPOINT is $ENTRY_LINE"
sort -u -o "$EXPECTED" "$EXPECTED"

# What the binary needs is in the tree: its interpreter and NEEDED libraries.
interp=$(readelf -l "$BIN" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
[[ -f $ROOT$interp ]] || die "the Dockerfile's runtime stage lacks the ELF interpreter $interp"
while read -r lib; do
	[[ -f $ROOT/lib/x86_64-linux-gnu/$lib || $ROOT$interp == */$lib ]] || die "the runtime stage lacks $lib (NEEDED)"
done < <(readelf -d "$BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')

# --- 2. pack, unpack, compare ----------------------------------------------------
LAYOUT=${OUT:-$WORK/oci}
TAG=csi-sidecar
rm -rf "$LAYOUT"
umoci init --layout "$LAYOUT"
umoci new --image "$LAYOUT:$TAG"
umoci unpack --image "$LAYOUT:$TAG" "$WORK/bundle" >&2
cp -a "$ROOT/." "$WORK/bundle/rootfs/"
chown -R 0:0 "$WORK/bundle/rootfs"
umoci repack --image "$LAYOUT:$TAG" "$WORK/bundle" >&2
labels=()
while IFS= read -r l; do labels+=(--config.label "$l"); done < <(
	tr '\n' ' ' <"$DOCKERFILE" | sed 's/\\ */ /g' | grep -o 'org\.opencontainers\.image\.[a-z]*="[^"]*"' | sed 's/"//g'
)
umoci config --image "$LAYOUT:$TAG" --config.entrypoint /csi-sidecar --clear config.cmd "${labels[@]}"
log "packed: $LAYOUT:$TAG ($(du -sh "$LAYOUT" | cut -f1))"

umoci unpack --image "$LAYOUT:$TAG" "$WORK/unpacked" >&2
RFS=$WORK/unpacked/rootfs
(cd "$RFS" && find . -mindepth 1 -printf '%P\n' | sort) >"$WORK/image.txt"
if ! diff -u "$EXPECTED" "$WORK/image.txt" >"$WORK/diff.txt"; then
	die "the image's files differ from what manifests/Dockerfile describes:
$(cat "$WORK/diff.txt")"
fi
log "the image holds exactly the Dockerfile's $(wc -l <"$EXPECTED") paths"
grep -q '"/csi-sidecar"' "$WORK/unpacked/config.json" || die "entrypoint not /csi-sidecar in the image config"
IMAGE_USER=$(python3 -c 'import json,sys; u=json.load(open(sys.argv[1]))["process"]["user"]; print("%d:%d" % (u.get("uid", 0), u.get("gid", 0)))' "$WORK/unpacked/config.json")
[[ $IMAGE_USER == 0:0 ]] || die "the image's user is $IMAGE_USER, not root (0:0) as upstream's images"
for l in "${LINKS[@]}"; do
	[[ $(readlink "$RFS/$l") == csi-sidecar ]] || die "/$l is not a symlink to csi-sidecar in the image"
done

# --- 3. run it from the unpacked rootfs --------------------------------------------
run() { chroot --userspec=65532:65532 "$RFS" "$@"; }
for name in csi-sidecar "${LINKS[@]}"; do
	out=$(run "/$name" --version 2>&1) || die "/$name --version failed: $out"
	[[ $out == "$name "* ]] || die "/$name --version printed: $out"
	help=$(run "/$name" --help 2>&1) || die "/$name --help failed: $help"
	case $name in
	csi-sidecar) grep -q '^Modules:' <<<"$help" || die "/$name --help: $help" ;;
	csi-sidecars) grep -q 'KEP-4958' <<<"$help" || die "/$name --help: $help" ;;
	*) grep -q "^Usage: $name " <<<"$help" || die "/$name --help: $help" ;;
	esac
done
log "entrypoint and ${#LINKS[@]} names: --version and --help from the unpacked rootfs as 65532"

driver=$(bash integration/scripts/build-components.sh csi-mock-driver | tail -1)
driver=${driver##* }
[[ -x $driver ]] || die "no csi-mock-driver ($driver)"
mkdir -p "$RFS/csi"
chmod 0777 "$RFS/csi"
"$driver" --endpoint="unix://$RFS/csi/csi.sock" --name=image.csi.example.com >"$WORK/driver.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do [[ -S $RFS/csi/csi.sock ]] && break; sleep 0.1; done
[[ -S $RFS/csi/csi.sock ]] || die "the CSI mock driver did not create its socket: $(cat "$WORK/driver.log")"
chmod 0755 "$RFS/csi/csi.sock" # root's, as most drivers leave it
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 19808)
# chroot itself in the background (not the run function's subshell), so
# that $! is the process (chroot execs it) and the cleanup stops it.
chroot --userspec="$IMAGE_USER" "$RFS" /livenessprobe --csi-address=/csi/csi.sock --http-endpoint="127.0.0.1:$port" \
	>"$WORK/probe.log" 2>&1 &
PIDS+=($!)
healthz() {
	exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
	printf 'GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' >&3
	cat <&3
	exec 3<&-
}
reply=""
for _ in $(seq 100); do
	reply=$(healthz 2>/dev/null || true)
	[[ $reply == "HTTP/1.1 200"*ok ]] && break
	sleep 0.2
done
[[ $reply == "HTTP/1.1 200"*ok ]] || die "/livenessprobe in the image: /healthz did not answer 200 ok: $reply
$(cat "$WORK/probe.log")"
grep -q "Probe -> OK" "$WORK/driver.log" || die "the driver saw no Probe: $(cat "$WORK/driver.log")"
log "livenessprobe from the image, as its user $IMAGE_USER, against the CSI mock driver's root-owned 0755 socket: /healthz 200 ok"
log "OK"
