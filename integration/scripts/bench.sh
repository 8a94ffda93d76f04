#!/bin/bash
# Every benchmark in one command (run as root on Debian 12; ~5 minutes). Each table is measured
# side by side in the same run; results go to integration/results/bench.md and into docs/benchmarks.md
# between the `bench:begin` / `bench:end` markers, with the machine and the date.
#   rule programming      integration/bench/src/bin/bench-apply.rs   (CLI vs nft -f vs iptables-*-restore, in-process, CIDR scaling)
#   per-connection cost   integration/bench/src/bin/bench-conn.rs    (10,000 excluded CIDRs: interval set vs linear rules)
#   live migration        integration/bench/src/bin/bench-migrate.rs (redirect::migrate legacy -> nft -> legacy, per pod)
#   CNI ADD               integration/bench/src/bin/bench-cni.rs     (cnitool through the full chain on an install-cni node)
#   RunPodSandbox         integration/bench/src/bin/bench-cri.rs     (containerd 1.6 over the CRI, with/without istio-cni)
#   ambient ADD, RSS      integration/bench/src/bin/bench-ambient.rs (chain -> agent -> rules -> real ztunnel Ack; agent RSS)
#   plugin size/RSS       crates/istio-cni/tests/bench.rs           (-> integration/results/cni-plugin.txt)
#   daemon RSS/repair     crates/install-cni/tests/bench.rs          (-> integration/results/install-cni.txt)
#   charts                integration/bench/src/bin/bench-plot.rs    (docs/img/bench-*.svg from the raw samples
#                         bench-conn, bench-cni and bench-ambient write into integration/results/samples)
# Env: SAMPLES (apply, default 30), CONNS (default 3000), MIGRATE_PODS (default 50), PODS (200),
#      PAR (100), SANDBOXES (30), ROUNDS (3), AMBIENT_PODS (500), SKIP_CRATE_BENCHES=1.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
[ "$(id -u)" = 0 ] || { echo "bench: run as root (network namespaces, netfilter)" >&2; exit 1; }
command -v cargo >/dev/null || { echo "bench: needs cargo (Rust >= 1.85)" >&2; exit 1; }
integration/scripts/install-deps.sh >&2
echo "bench: building (release)" >&2
bin=$(integration/scripts/build-bins.sh | tail -1)
cargo build --locked --release -q --workspace --bins
res=integration/results
out=$res/bench.md
tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
# The benches behind the charts write their raw samples here; stale ones must not be drawn.
export BENCH_SAMPLES_DIR=$res/samples
rm -rf "$BENCH_SAMPLES_DIR"; mkdir -p "$BENCH_SAMPLES_DIR"
# A chart bench-plot draws at the end, linked from the generated section (relative to the
# results; the copy in docs/ links relative to docs/).
chart() { echo; echo "![$1](../../docs/img/$2)"; }

if [ "${SKIP_CRATE_BENCHES:-0}" != 1 ]; then
  echo "bench: plugin (ADD alone, peak RSS, binary) -> $res/cni-plugin.txt" >&2
  ISTIO_CNI_BIN=$bin/istio-cni cargo test --release --locked -q -p istio-cni --test bench -- --ignored >"$tmp" 2>&1 \
    || { tail -30 "$tmp" >&2; echo "bench: plugin bench FAILED; keeping the previous $res/cni-plugin.txt" >&2; }
  echo "bench: daemon (idle RSS, repair latency) -> $res/install-cni.txt" >&2
  cargo test --release --locked -q -p install-cni --test bench -- --ignored >"$tmp" 2>&1 \
    || { tail -30 "$tmp" >&2; echo "bench: daemon bench FAILED; keeping the previous $res/install-cni.txt" >&2; }
fi

cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)
{
  echo "Measured $(date -u +%Y-%m-%d) by \`integration/scripts/bench.sh\` on $(. /etc/os-release; echo "$PRETTY_NAME"), kernel $(uname -r), $(nproc) vCPU ($cpu), $mem; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg). Release build. The charts are drawn by \`bench-plot\` from this run's raw samples (\`integration/results/samples/\`)."
  echo
  echo "**Rule programming** (default sidecar rules, a fresh network namespace per sample):"
  echo
  echo "bench: apply latency" >&2
  "$bin/bench-apply" "$bin/istio-nftables" "${SAMPLES:-30}"
  echo
  echo "**Per-connection setup cost with 10,000 excluded CIDRs** (median of ${CONNS:-3000} connections per case):"
  echo
  echo "bench: per-connection cost" >&2
  "$bin/bench-conn" "${CONNS:-3000}" 10000
  chart "p50 connection setup against 0, 10, 100, 1000 and 10,000 excluded CIDRs, four ways" bench-conn-cidrs.svg
  echo
  echo "**Live migration of a running pod** (\`redirect::migrate\` / \`istio-nftables migrate\`, in-process; default sidecar rules, dual stack; program and verify the new backend, remove the old, verify the end state, under the namespace's lock; a new pod namespace per sample):"
  echo
  echo "bench: live migration" >&2
  "$bin/bench-migrate" "${MIGRATE_PODS:-50}"
  echo
  echo "**CNI ADD** (sidecar demo pod, node set up by install-cni, the pod from the daemon's cache):"
  echo
  echo "bench: CNI ADD" >&2
  "$bin/bench-cni" "${PODS:-200}" "${PAR:-100}"
  chart "sidecar CNI ADD latency, cumulative: one after another and ${PAR:-100} at once" bench-cni-add.svg
  chart "sidecar CNI ADD burst: each of the ${PAR:-100} ADDs from start to end" bench-cni-burst.svg
  echo
  echo "**Pod lookup** (the plugin asks the node daemon's pod watch over \`pods.sock\` instead of the API server; API server behind TLS on loopback):"
  echo
  echo "bench: pod lookup" >&2
  "$bin/bench-lookup" "${LOOKUP_PODS:-100}"
  echo
  echo "**The node daemon's per-event costs** (install-cni's own CPU from /proc; the inputs of the scale table):"
  echo
  echo "bench: daemon per-event costs" >&2
  "$bin/bench-scale" "${SCALE_PODS:-250}" "${SCALE_EVENTS:-5000}" "${SCALE_LOOKUPS:-2000}"
  echo
  echo "**Ambient ADD** (ambient pods through the chain, the node agent and the real ztunnel; agent RSS):"
  echo
  echo "bench: ambient ADD" >&2
  "$bin/bench-ambient" 50 "${PAR:-100}" "${AMBIENT_PODS:-500}"
  chart "ambient ADD latency, cumulative: whole chain, istio-cni's own ADD, agent enroll" bench-ambient-add.svg
  chart "ambient ADD bursts: each ADD from start to end, whole chain and istio-cni alone" bench-ambient-burst.svg
  echo
  echo "**RunPodSandbox under containerd** (Debian's containerd 1.6 over the CRI, install-cni running from the image, sidecar pods; with and without istio-cni in the chain, alternating rounds):"
  echo
  echo "bench: RunPodSandbox (containerd)" >&2
  CARGO_TARGET_DIR=$(pwd)/target "$bin/bench-cri" "${SANDBOXES:-30}" 20 "${ROUNDS:-3}"
  echo
  echo "**Binaries and memory:**"
  echo
  echo "| what | measured |"
  echo "|---|---|"
  for b in istio-cni istio-nftables install-cni; do
    needed=$(readelf -d "$bin/$b" 2>/dev/null | grep -c NEEDED || true)
    echo "| \`$b\` size, linkage | $(du -k "$bin/$b" | awk '{printf "%.1f MB", $1/1024}'), $([ "$needed" = 0 ] && echo "static (no NEEDED entries)" || echo "$needed NEEDED entries") |"
  done
  sed -n 's/^plugin peak RSS[^:]*: \(.*\)$/| istio-cni peak RSS (wait4 ru_maxrss, max over 200 ADDs) | \1 |/p' $res/cni-plugin.txt
  sed -n 's/^plugin alone[^:]*: \(.*\)$/| istio-cni ADD alone (fork+exec+GET+netns+nft batch, 200 pods) | \1 |/p' $res/cni-plugin.txt
  sed -n 's/^idle RSS: \([^ ]*\) kB.*$/| install-cni idle RSS | \1 kB |/p' $res/install-cni.txt
  awk '/^repair latency/ {getline; sub(/^ +/, ""); sub(/ +\[.*$/, ""); print "| install-cni repair latency (primary drops our entry -> back) | " $0 " |"}' $res/install-cni.txt
} > "$tmp"
cp "$tmp" "$out"
echo "bench: charts -> docs/img" >&2
"$bin/bench-plot" "$BENCH_SAMPLES_DIR" docs/img >&2

python3 - "$out" docs/benchmarks.md <<'PY'
import sys
res, readme = sys.argv[1], sys.argv[2]
body = open(res).read().rstrip().replace("](../../docs/img/", "](img/") + "\n"
s = open(readme).read()
b, e = "<!-- bench:begin -->\n", "<!-- bench:end -->"
if b not in s or e not in s:
    sys.exit(readme + " has no bench:begin/bench:end markers")
i, j = s.index(b) + len(b), s.index(e)
open(readme, "w").write(s[:i] + body + s[j:])
PY
cat "$out"
echo "bench: results in $out and docs/benchmarks.md" >&2
