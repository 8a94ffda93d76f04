#!/bin/bash
# The README's main job: a demo pod namespace programmed by istio-nftables, its
# `nft list ruleset`, and real connections landing on Envoy's ports.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
[ "$(id -u)" = 0 ] || { echo "demo: run as root (network namespaces, netfilter)" >&2; exit 1; }
command -v cargo >/dev/null || { echo "demo: needs cargo (Rust >= 1.85)" >&2; exit 1; }
integration/scripts/install-deps.sh >&2
cargo build --release --locked -q -p istio-nftables -p integration --bins
bin=target/x86_64-unknown-linux-gnu/release
exec "$bin/demo" "$bin/istio-nftables"
