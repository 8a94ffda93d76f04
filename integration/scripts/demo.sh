#!/bin/bash
# The README's main job: the whole product in its three modes, each on a node namespace of its
# own with a host layout and the real install-cni. 1. sidecar pods on an nftables node (cnitool
# ADDs demo pods through Debian's bridge + host-local + portmap chain as kubelet would; the
# sidecar pod's `nft list ruleset`, where real connections landed, CHECK, a repaired conflist
# rewrite, DEL, SIGTERM); 2. the same pods on an iptables-legacy node; 3. ambient pods with
# Istio's real ztunnel (HBONE with mutual TLS, passthrough, kubelet's probe). One `explain` per
# mode. Exits non-zero if anything landed elsewhere.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
[ "$(id -u)" = 0 ] || { echo "demo: run as root (network namespaces, netfilter)" >&2; exit 1; }
command -v cargo >/dev/null || { echo "demo: needs cargo (Rust >= 1.85)" >&2; exit 1; }
# Each step says how long it took and the total so far (on stderr; the demo's own output is
# stdout).
T0=$(date +%s)
took() { echo "demo: $1: $(($(date +%s) - $2)) s (total $(($(date +%s) - T0)) s)" >&2; }

# The host's packages (only the demo's) and cnitool install while cargo downloads the crates:
# one waits on the Debian mirror, the other on crates.io.
started=$(date +%s)
deps_log=$(mktemp)
DEPS=demo SKIP_ZTUNNEL=1 integration/scripts/install-deps.sh >"$deps_log" 2>&1 &
deps_pid=$!
cargo fetch --locked -q
took "the crates downloaded" "$started"
if ! wait "$deps_pid"; then
  cat "$deps_log" >&2
  echo "demo: installing the host's packages failed" >&2
  exit 1
fi
cat "$deps_log" >&2
rm -f "$deps_log"
took "host packages and cnitool (beside the download)" "$started"

# The ambient section runs Istio's real ztunnel, built once into a cache outside the checkout.
# It builds beside the product (niced, so the product's build comes first): on 2 cores the
# serial phases of each (build scripts, the last crates' codegen and link) leave a core the
# other uses.
started=$(date +%s)
ztunnel_log=$(mktemp)
trap 'rm -f "$ztunnel_log"' EXIT
integration/scripts/build-ztunnel.sh >"$ztunnel_log" 2>&1 &
ztunnel_pid=$!
bin=$(integration/scripts/build-bins.sh | tail -1)
took "release build of istio-cni, install-cni, istio-nftables" "$started"
step=$(date +%s)
cargo build --locked --release -q --workspace --bin demo
took "the demo's binary" "$step"
if ! wait "$ztunnel_pid"; then
  cat "$ztunnel_log" >&2
  echo "demo: building Istio's ztunnel failed" >&2
  exit 1
fi
cat "$ztunnel_log" >&2
took "Istio's ztunnel (built beside the release build; cached after the first run)" "$started"

started=$(date +%s)
if "$bin/demo" "$bin"; then rc=0; else rc=$?; fi
took "the three modes" "$started"
exit "$rc"
