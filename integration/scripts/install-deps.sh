#!/bin/bash
# install-deps.sh - host dependencies for building, testing and end-to-end running the project on
# Debian 12 (bookworm), as root. Idempotent and quiet on a second run:
#   1. apt-get update + install ONLY when a package is missing
#   2. build-cnitool.sh        -> /usr/local/bin/cnitool
#   3. build-ztunnel.sh        -> /usr/local/bin/ztunnel-test (Istio's ztunnel, the ZDS peer of
#      the ambient tests; cached in /var/cache/istio-cni-build/ztunnel, rebuilt only when its
#      source tarball changes; the first build takes ~2.5 min on 2 cores)
# SKIP_CNITOOL=1 skips step 2, SKIP_ZTUNNEL=1 step 3. DEPS=demo installs only what the demo
# needs (no containerd, buildah, test helpers); the default DEPS=all is everything.
# No libmnl.a is needed: the mnl_* functions come from our Rust crate crates/mnl-impl, and
# .cargo/config.toml links Debian's /usr/lib/x86_64-linux-gnu/libnftnl.a directly.
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
[ "$(id -u)" = 0 ] || { echo "install-deps: run as root" >&2; exit 1; }

# What the demo needs (DEPS=demo): build, the node's tools, cnitool, protoc for ztunnel.
DEMO_PKGS=(
  # libnftnl-dev ships libnftnl.a (static-linked); libmnl is crates/mnl-impl; cc drives the link
  libnftnl-dev build-essential
  # apt-get source / dpkg-source for build-cnitool.sh
  dpkg-dev xz-utils ca-certificates debian-archive-keyring
  # readelf: build-bins.sh checks the binaries are static
  binutils
  # host tools the demo and the tests drive
  nftables iptables iproute2 util-linux containernetworking-plugins
  # ambient's legacy host probe rule keeps Istio's ipsets (istio-inpod-probes-v4/v6)
  ipset
  # cnitool from Debian's source package, offline
  golang-go golang-github-appc-cni-dev
  # protoc: ztunnel's build.rs (build-ztunnel.sh) and the k8s-cri crate compile protobufs
  protobuf-compiler
)
# What only the tests and the benchmarks add (≈35 s of apt on a fresh machine, not the demo's).
TEST_PKGS=(
  # binary inspection used by checks
  file
  # libmnl's shared object: the differential test compares crates/mnl-impl with it
  libmnl0
  # test harness helpers
  python3 jq socat hyperfine curl
  # the container image (deploy/scripts/build-image.sh) and the container-runtime e2e
  # (integration/tests/cri.rs): a private containerd 1.6 with its CRI plugin, runc
  buildah containerd runc
)
case "${DEPS:-all}" in
  demo) PKGS=("${DEMO_PKGS[@]}") ;;
  all) PKGS=("${DEMO_PKGS[@]}" "${TEST_PKGS[@]}") ;;
  *) echo "install-deps: DEPS=${DEPS} is neither demo nor all" >&2; exit 2 ;;
esac
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-deps: all ${#PKGS[@]} apt packages present"
fi

[ "${SKIP_CNITOOL:-0}" = 1 ] || "$HERE/build-cnitool.sh"
[ "${SKIP_ZTUNNEL:-0}" = 1 ] || "$HERE/build-ztunnel.sh"
