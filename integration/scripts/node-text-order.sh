#!/usr/bin/env bash
# Regenerates src/node-text.order: the functions a node process (registrar +
# prober, registered by the kubelet's plugin manager, serving /healthz) runs,
# hottest first. The release link places them first in the text (build.rs
# passes the file to lld as --symbol-ordering-file), so the node paths share a
# few contiguous pages instead of touching pages all over the binary; see
# docs/benchmarks.md "Node process" for what it saves. Rerun after changing
# the dependencies (Cargo.toml, Cargo.lock: the symbol names carry a hash of
# them) or code on the node paths (runtime, HTTP, CSI connection, registrar,
# prober), and whenever bench-node fails its figure check: a stale list only
# costs RSS, never correctness (names no longer present are ignored).
#
# Needs valgrind (callgrind) and the components bench-node uses; about 15
# minutes (one extra release build with symbols, in
# $CARGO_TARGET_DIR/node-text-order, default target/node-text-order).
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }

bash integration/scripts/build-components.sh csi-mock-driver kubelet-plugin-harness
target=${CARGO_TARGET_DIR:-target}
work=$target/node-text-order
mkdir -p "$work"
work=$(cd "$work" && pwd)
# The same release build with its symbol table kept (build.rs then leaves out
# --strip-all; the code and the names are the same).
CSI_SIDECAR_KEEP_SYMBOLS=1 cargo build --release --bin csi-sidecar --target-dir "$work/target"
cargo build --release -p csi-sidecar-integration --bin bench-node
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat >"$out/sidecar" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --demangle=no --dump-instr=no --callgrind-out-file=$out/callgrind.%p $work/target/release/csi-sidecar "\$@"
EOF
chmod +x "$out/sidecar"
CSI_SIDECAR_BIN="$out/sidecar" "$target/release/bench-node" --requests 3000 --concurrency 4 >&2
# callgrind names each function once per file ("fn=(id) name", later "fn=(id)");
# LLVM's ".N" suffixes of local copies are dropped (they move whenever the
# code changes; build.rs's linker script gathers every copy of a name);
# the cost lines under it add up to the function's own instructions, except
# the one after "calls=" (a call's inclusive cost).
python3 - "$out"/callgrind.* <<'PY' >src/node-text.order
import re, sys
cost = {}
for path in sys.argv[1:]:
    names, cur, skip = {}, None, False
    for line in open(path, errors="replace"):
        m = re.match(r"^(c?fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if m:
            kind, ident, name = m.groups()
            if name:
                # "name'2": callgrind's name for a recursion level.
                names[ident] = re.sub(r"'\d+$", "", name)
            cost.setdefault(names.get(ident), 0)
            if kind == "fn":
                cur = names.get(ident)
            continue
        if line.startswith("calls="):
            skip = True
            continue
        if line[:1].isdigit() or line[:1] in "+-*":
            if skip:
                skip = False
                continue
            parts = line.split()
            if cur and len(parts) >= 2 and parts[1].isdigit():
                cost[cur] += int(parts[1])
total = {}
for n, c in cost.items():
    if n and (n.startswith("_ZN") or n.startswith("_R")):
        base = re.sub(r"\.\d+$", "", n)
        total[base] = total.get(base, 0) + c
for n in sorted(total, key=lambda n: (-total[n], n)):
    print(n)
PY
echo "src/node-text.order: $(wc -l <src/node-text.order) functions" >&2
