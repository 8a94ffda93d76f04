#!/bin/bash
# build-cnitool.sh - build the upstream CNI reference client `cnitool` from Debian's source package
# golang-github-appc-cni (same version as the installed golang-github-appc-cni-dev, 1.1.2 on
# bookworm) with Debian's Go, OFFLINE: GOPATH mode, libcni and its deps from /usr/share/gocode.
# Why the source package: the -dev package ships libcni + pkg/ but NOT cnitool/.
# The source comes through a PRIVATE apt config (deb-src line in our own sources.list; /etc/apt
# untouched). Installs /usr/local/bin/cnitool. Idempotent: skips when the installed binary was
# built from this version (stamp /usr/local/share/istio-cni-build/cnitool.stamp). FORCE=1 rebuilds.
set -euo pipefail
DEST=${DEST:-/usr/local/bin/cnitool}
WORK=${CNITOOL_WORK:-/var/cache/istio-cni-build/cnitool}
STAMP_FILE=/usr/local/share/istio-cni-build/cnitool.stamp
log() { echo "build-cnitool: $*"; }
die() { echo "build-cnitool: ERROR: $*" >&2; exit 1; }

SRC_PKG=$(dpkg-query -W -f='${source:Package}' golang-github-appc-cni-dev)   # golang-github-appc-cni
SRC_VER=$(dpkg-query -W -f='${source:Version}' golang-github-appc-cni-dev)   # 1.1.2-1
UP_VER=${SRC_VER#*:}; UP_VER=${UP_VER%-*}
command -v go >/dev/null || die "go missing (apt-get install golang-go)"
STAMP="$SRC_PKG $SRC_VER $(go version | cut -d' ' -f3)"
if [ "${FORCE:-0}" != 1 ] && [ -x "$DEST" ] && [ "$(cat "$STAMP_FILE" 2>/dev/null)" = "$STAMP" ]; then
  log "up to date ($DEST, $STAMP)"; exit 0
fi

# 1. Debian source package via a private apt config
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/cache/archives/partial" "$WORK/src"
SRCDIR=$WORK/src/$SRC_PKG-$UP_VER
if [ ! -f "$SRCDIR/cnitool/cnitool.go" ]; then
  SL=$WORK/apt/sources.list
  CODENAME=$(. /etc/os-release; echo "${VERSION_CODENAME:-bookworm}")
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $CODENAME main" > "$SL"
  A=(-o "Dir::Etc::sourcelist=$SL" -o Dir::Etc::sourceparts=/nonexistent -o "Dir::State::Lists=$WORK/apt/lists"
     -o "Dir::Cache=$WORK/apt/cache" -o APT::Get::Only-Source=true -o APT::Sandbox::User=root)
  log "fetching Debian source $SRC_PKG=$SRC_VER"
  apt-get "${A[@]}" -qq update >/dev/null
  ( cd "$WORK/src" && apt-get "${A[@]}" -qq source --download-only "$SRC_PKG=$SRC_VER" >/dev/null \
    && rm -rf "$SRCDIR" && dpkg-source -q -x "${SRC_PKG}_${SRC_VER#*:}.dsc" "$SRCDIR" >"$WORK/dpkg-source.log" 2>&1 )
  [ -f "$SRCDIR/cnitool/cnitool.go" ] || die "no cnitool/cnitool.go in $SRCDIR"
fi

# 2. GOPATH mode, offline: our GOPATH first (only cnitool/), then Debian's /usr/share/gocode (libcni)
GP=$WORK/gopath
rm -rf "$GP" && mkdir -p "$GP/src/github.com/containernetworking/cni/cnitool"
cp "$SRCDIR/cnitool/"*.go "$GP/src/github.com/containernetworking/cni/cnitool/"
log "building with $(go version | cut -d' ' -f3) (GOPATH=$GP:/usr/share/gocode, GOPROXY=off)"
env HOME="${HOME:-/root}" GOCACHE="$WORK/gocache" GOPROXY=off GOSUMDB=off GOFLAGS= GOTOOLCHAIN=local \
    GO111MODULE=off GOPATH="$GP:/usr/share/gocode" CGO_ENABLED=0 \
  go build -trimpath -o "$WORK/cnitool" github.com/containernetworking/cni/cnitool
install -D -m 0755 "$WORK/cnitool" "$DEST"
mkdir -p "$(dirname "$STAMP_FILE")" && echo "$STAMP" > "$STAMP_FILE"
log "installed $DEST ($STAMP, sha256 $(sha256sum "$DEST" | cut -c1-16)…)"
