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
# The ambient section runs Istio's real ztunnel: built once into a cache outside the checkout.
integration/scripts/install-deps.sh >&2
bin=$(integration/scripts/build-bins.sh | tail -1)
cargo build --locked --release -q --workspace --bin demo
exec "$bin/demo" "$bin"
