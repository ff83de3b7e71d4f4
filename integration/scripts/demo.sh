#!/usr/bin/env bash
# The demo (first command of the README): builds what is missing, starts a
# real CSI driver, the kubelet's real plugin manager (as a harness) and one
# csi-sidecar process running the registrar and prober modules, all on
# 127.0.0.1 and unix sockets in a temporary directory, and shows them work:
# registration with the kubelet, /healthz following the driver's life, metrics.
#
#   demo.sh          run the scenario, then keep serving until Ctrl-C
#   demo.sh --once   run the scenario and exit (non-zero if any step failed)
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."

ONCE=false
[[ ${1:-} == --once ]] && ONCE=true

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
fail() {
	printf '\nDEMO FAILED: %s\n' "$*" >&2
	for f in "$RUN"/*.log; do
		printf -- '----- %s -----\n' "$f" >&2
		tail -n 30 "$f" >&2
	done
	exit 1
}

say "building csi-sidecar and the real components (cached after the first run)"
cargo build --release --bin csi-sidecar
SIDECAR=$PWD/target/release/csi-sidecar
DRIVER_BIN=$(bash integration/scripts/build-components.sh --print-path csi-mock-driver)
KUBELET_BIN=$(bash integration/scripts/build-components.sh --print-path kubelet-plugin-harness)

RUN=$(mktemp -d)
PIDS=()
cleanup() {
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$RUN"
}
trap cleanup EXIT INT TERM

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ADDR=127.0.0.1:$PORT
DRIVER=demo.csi.example.com
mkdir -p "$RUN/plugins_registry" "$RUN/bin"
ln -s "$SIDECAR" "$RUN/bin/csi-sidecar"

start_driver() {
	"$DRIVER_BIN" --endpoint="unix://$RUN/csi.sock" --name=$DRIVER >>"$RUN/driver.log" 2>&1 &
	DRIVER_PID=$!
	PIDS+=("$DRIVER_PID")
}

health() { curl -s -o "$RUN/body" -w '%{http_code}' "http://$ADDR$1" || echo 000; }
wait_health() { # path code
	for _ in $(seq 1 100); do
		[[ $(health "$1") == "$2" ]] && { echo "GET $1 -> $2 $(cat "$RUN/body")"; return 0; }
		sleep 0.1
	done
	fail "GET $1 never answered $2 (last: $(health "$1") $(cat "$RUN/body" 2>/dev/null))"
}

say "starting the kubelet's plugin manager on $RUN/plugins_registry"
"$KUBELET_BIN" --dir="$RUN/plugins_registry" >"$RUN/kubelet.log" 2>"$RUN/kubelet-stderr.log" &
PIDS+=($!)

say "starting csi-sidecar: registrar + prober in one process, one port ($ADDR)"
"$RUN/bin/csi-sidecar" --csi-address="$RUN/csi.sock" --http-endpoint="$ADDR" \
	registrar --kubelet-registration-path=/var/lib/kubelet/plugins/$DRIVER/csi.sock \
	--plugin-registration-path="$RUN/plugins_registry" \
	prober --probe-timeout=2s >"$RUN/csi-sidecar.log" 2>&1 &
PIDS+=($!)
sleep 1
echo "the driver is not running yet; csi-sidecar waits for it (upstream would exit after 30 s):"
health /healthz/prober >/dev/null; echo "GET /healthz/prober -> $(health /healthz/prober) $(cat "$RUN/body")"

say "starting the real CSI driver (Kubernetes' CSI mock driver) as $DRIVER"
start_driver
wait_health /healthz 200
for _ in $(seq 1 100); do grep -q '"event":"register"' "$RUN/kubelet.log" && break; sleep 0.1; done
grep '"event"' "$RUN/kubelet.log" || true
grep -q "\"event\":\"register\",\"name\":\"$DRIVER\"" "$RUN/kubelet.log" || fail "the kubelet did not register $DRIVER"
wait_health /healthz/registrar 200
wait_health /healthz/prober 200

say "killing the driver: the prober reports it, the process stays up"
kill "$DRIVER_PID"
wait_health /healthz/prober 500

say "restarting the driver: healthy again, same csi-sidecar process"
start_driver
wait_health /healthz 200

say "metrics (upstream names, labels and buckets)"
curl -s "http://$ADDR/metrics" | grep -E '^csi_sidecar_operations_seconds_count|^process_resident_memory_bytes' || fail "no metrics"

say "demo OK"
if $ONCE; then
	exit 0
fi
echo "serving on http://$ADDR/healthz and /metrics; Ctrl-C to stop"
while true; do
	sleep 5
	echo "$(date +%T) /healthz -> $(health /healthz) $(cat "$RUN/body")"
done
