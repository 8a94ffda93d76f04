#!/bin/bash
# install-deps.sh - host dependencies for building, testing and end-to-end running the project on
# Debian 12 (bookworm), as root. Idempotent and quiet on a second run:
#   1. apt-get update + install ONLY when a package is missing
#   2. build-libmnl-static.sh  -> /usr/local/lib/istio-cni-static/{libmnl.a,libnftnl.a}
#   3. build-cnitool.sh        -> /usr/local/bin/cnitool
# Pass-through env for step 2 where Debian's libmnl source cannot be downloaded: LIBMNL_SRC, LIBMNL_GIT.
# SKIP_LIBMNL=1 / SKIP_CNITOOL=1 skip steps 2 / 3.
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
[ "$(id -u)" = 0 ] || { echo "install-deps: run as root" >&2; exit 1; }

PKGS=(
  # C libraries behind the nftnl / mnl crates (libnftnl-dev ships libnftnl.a; libmnl-dev has no .a)
  libnftnl-dev libmnl-dev pkg-config build-essential
  # building libmnl.a from source (autoreconf for non-release trees), apt-get source, dpkg-source
  autoconf automake libtool dpkg-dev xz-utils bzip2 ca-certificates debian-archive-keyring git
  # binary inspection used by checks (readelf, nm, file)
  binutils file
  # host tools the tests drive
  nftables iptables iproute2 util-linux containernetworking-plugins
  # cnitool from Debian's source package, offline
  golang-go golang-github-appc-cni-dev
  # test harness helpers
  python3 jq socat hyperfine curl
)
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

rc=0
[ "${SKIP_LIBMNL:-0}" = 1 ] || "$HERE/build-libmnl-static.sh" || { rc=1; echo "install-deps: libmnl.a NOT built: static cargo builds will fail to link (see integration/scripts/README.md)" >&2; }
[ "${SKIP_CNITOOL:-0}" = 1 ] || "$HERE/build-cnitool.sh" || rc=1
exit $rc
