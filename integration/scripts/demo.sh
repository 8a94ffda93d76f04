#!/bin/bash
# The README's main job: the whole product on one node, end to end. A node namespace with a
# host layout; the real install-cni chains istio-cni into Debian's bridge + host-local + portmap
# conflist; cnitool ADDs demo pods (sidecar, TPROXY, DNS capture, dual stack, excluded
# namespace, no sidecar) as kubelet would; prints the sidecar pod's `nft list ruleset` and where
# real connections landed; then CHECK, a repaired conflist rewrite, DEL and SIGTERM.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
[ "$(id -u)" = 0 ] || { echo "demo: run as root (network namespaces, netfilter)" >&2; exit 1; }
command -v cargo >/dev/null || { echo "demo: needs cargo (Rust >= 1.85)" >&2; exit 1; }
# The demo needs no ztunnel (ambient is not wired yet): skip its 10-minute first build.
SKIP_ZTUNNEL=${SKIP_ZTUNNEL:-1} integration/scripts/install-deps.sh >&2
cargo build --release --locked -q -p istio-cni -p install-cni -p istio-nftables -p integration --bins
bin=target/x86_64-unknown-linux-gnu/release
exec "$bin/demo" "$(pwd)/$bin"
