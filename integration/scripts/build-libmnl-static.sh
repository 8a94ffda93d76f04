#!/bin/bash
# build-libmnl-static.sh - static libmnl.a (Debian ships only libmnl.so) + a copy of Debian's
# libnftnl.a, both in ONE directory that .cargo/config.toml points the linker at:
#   /usr/local/lib/istio-cni-static/{libmnl.a,libnftnl.a,BUILD-INFO.txt}
# libmnl is built at the exact upstream version of the installed libmnl0 (1.0.4 on bookworm;
# Debian carries no code patches for it) with -O2 -fPIC, static only.
# Source, first that works:
#   1. $LIBMNL_SRC        a source dir or tarball you provide (tarballs are checked against the
#                         sha256 that Debian's Sources index lists for the .orig tarball, if named so)
#   2. Debian's source package via `apt-get source`, through a PRIVATE apt config (a deb-src line in
#                         our own sources.list; /etc/apt is not touched)
#   3. $LIBMNL_GIT        a git clone of libmnl; tag libmnl-<version> is exported (needs autoreconf)
# After building, the archive's exported symbols must equal the installed libmnl.so.0's, or it fails.
# Idempotent: skips when BUILD-INFO.txt says this version is installed. FORCE=1 rebuilds.
# Env: STATIC_DIR (install dir), LIBMNL_WORK (build dir, default /var/cache/istio-cni-build/libmnl).
set -euo pipefail
STATIC_DIR=${STATIC_DIR:-/usr/local/lib/istio-cni-static}
WORK=${LIBMNL_WORK:-/var/cache/istio-cni-build/libmnl}
MA=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
NFTNL_A=/usr/lib/$MA/libnftnl.a
MNL_SO=$(readlink -f "/usr/lib/$MA/libmnl.so.0")
log() { echo "build-libmnl-static: $*"; }
die() { echo "build-libmnl-static: ERROR: $*" >&2; exit 1; }

SRC_PKG=$(dpkg-query -W -f='${source:Package}' libmnl0)        # libmnl
SRC_VER=$(dpkg-query -W -f='${source:Version}' libmnl0)        # 1.0.4-3
UP_VER=${SRC_VER#*:}; UP_VER=${UP_VER%-*}                       # 1.0.4
STAMP="libmnl $SRC_VER"
mkdir -p "$STATIC_DIR"

# libnftnl.a: Debian's own (libnftnl-dev), copied so one -L dir holds both archives
[ -f "$NFTNL_A" ] || die "missing $NFTNL_A (apt-get install libnftnl-dev)"
cmp -s "$NFTNL_A" "$STATIC_DIR/libnftnl.a" || { install -m 0644 "$NFTNL_A" "$STATIC_DIR/libnftnl.a"; log "copied $NFTNL_A"; }

if [ "${FORCE:-0}" != 1 ] && [ -f "$STATIC_DIR/libmnl.a" ] && grep -qx "$STAMP" "$STATIC_DIR/BUILD-INFO.txt" 2>/dev/null; then
  log "up to date ($STATIC_DIR/libmnl.a, $STAMP)"; exit 0
fi

mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/cache/archives/partial" "$WORK/src"
SRCDIR=$WORK/src/$SRC_PKG-$UP_VER
ORIGIN=

# private apt config (deb-src only): Sources index gives the orig tarball's sha256 even when
# the tarball itself cannot be fetched
SL=$WORK/apt/sources.list
CODENAME=$(. /etc/os-release; echo "${VERSION_CODENAME:-bookworm}")
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $CODENAME main" > "$SL"
A=(-o "Dir::Etc::sourcelist=$SL" -o Dir::Etc::sourceparts=/nonexistent -o "Dir::State::Lists=$WORK/apt/lists"
   -o "Dir::Cache=$WORK/apt/cache" -o APT::Get::Only-Source=true -o APT::Sandbox::User=root)
apt_ready=0
apt_update() { [ $apt_ready = 1 ] || { apt-get "${A[@]}" -qq update >/dev/null 2>&1 && apt_ready=1; }; }
orig_sha256() {   # sha256 of Debian's .orig tarball for $SRC_PKG=$SRC_VER, from the Sources index
  apt_update || return 0
  apt-cache "${A[@]}" showsrc "$SRC_PKG" 2>/dev/null | awk -v v="$SRC_VER" '
    /^$/ {ok=0} /^Version: / {ok=($2==v)} /^Checksums-Sha256:/ {f=1; next} /^[^ ]/ {f=0}
    ok && f && $3 ~ /\.orig\.tar\.[a-z0-9]+$/ {print $1; exit}'
}
unpack_tarball() {   # $1 tarball -> $SRCDIR
  local t=$1 want got; want=$(orig_sha256); got=$(sha256sum "$t" | cut -d' ' -f1)
  if [ -n "$want" ]; then
    if [ "$want" = "$got" ]; then log "tarball sha256 matches Debian's ${SRC_PKG}_$UP_VER.orig"
    else log "WARNING: $t sha256 $got != Debian orig $want (not the release tarball?)"; fi
  fi
  rm -rf "$SRCDIR" && mkdir -p "$SRCDIR" && tar -xf "$t" -C "$SRCDIR" --strip-components=1
  ORIGIN="tarball $(basename "$t") sha256=$got"
}

if [ -n "${LIBMNL_SRC:-}" ]; then                                   # 1. explicit
  if [ -d "$LIBMNL_SRC" ]; then rm -rf "$SRCDIR"; cp -a "$LIBMNL_SRC" "$SRCDIR"; ORIGIN="dir $LIBMNL_SRC"
  else unpack_tarball "$LIBMNL_SRC"; fi
fi
if [ -z "$ORIGIN" ]; then                                           # 2. Debian source package
  if [ -f "$SRCDIR/debian/changelog" ] && head -1 "$SRCDIR/debian/changelog" | grep -qF "($SRC_VER)"; then
    ORIGIN="debian source $SRC_PKG=$SRC_VER (cached)"
  else
    log "fetching Debian source $SRC_PKG=$SRC_VER"
    if apt_update && (cd "$WORK/src" && apt-get "${A[@]}" -qq source --download-only "$SRC_PKG=$SRC_VER" >"$WORK/apt-source.log" 2>&1); then
      rm -rf "$SRCDIR" && (cd "$WORK/src" && dpkg-source -q -x "${SRC_PKG}_${SRC_VER#*:}.dsc" "$SRCDIR" >"$WORK/dpkg-source.log" 2>&1)
      ORIGIN="debian source $SRC_PKG=$SRC_VER"
    else
      log "apt-get source $SRC_PKG=$SRC_VER failed: $(grep -m1 '^E:' "$WORK/apt-source.log" || echo 'see '"$WORK/apt-source.log")"
    fi
  fi
fi
if [ -z "$ORIGIN" ] && [ -n "${LIBMNL_GIT:-}" ]; then                # 3. upstream git tag
  TAG=libmnl-$UP_VER
  COMMIT=$(git -C "$LIBMNL_GIT" rev-parse "$TAG^{commit}") || die "no tag $TAG in $LIBMNL_GIT"
  rm -rf "$SRCDIR" && mkdir -p "$SRCDIR"
  git -C "$LIBMNL_GIT" archive --format=tar "$TAG" | tar -x -C "$SRCDIR"
  ORIGIN="git tag $TAG ($COMMIT)"
fi
[ -n "$ORIGIN" ] || die "no libmnl $UP_VER source: Debian's source tarball could not be fetched; pass
  LIBMNL_SRC=<libmnl-$UP_VER.tar.bz2 or dir> or LIBMNL_GIT=<libmnl git clone with tag libmnl-$UP_VER>"
log "source: $ORIGIN"

# build: static only, PIC (rustc links PIE / static-pie), out of tree so the source stays pristine
B=$WORK/build-$SRC_VER
rm -rf "$B" && mkdir -p "$B"
if [ ! -x "$SRCDIR/configure" ]; then
  command -v autoreconf >/dev/null || die "autoreconf missing (apt-get install autoconf automake libtool)"
  log "autoreconf (no configure script in this source)"
  (cd "$SRCDIR" && autoreconf -fi >"$B/autoreconf.log" 2>&1) || { cat "$B/autoreconf.log"; die "autoreconf failed"; }
fi
log "building in $B"
( cd "$B"
  "$SRCDIR/configure" --enable-static --disable-shared --with-pic --prefix="$B/inst" \
      CFLAGS="-O2 -fPIC -g -ffile-prefix-map=$SRCDIR=libmnl-$UP_VER" >configure.log 2>&1 \
    || { cat configure.log; exit 1; }
  make -j"$(nproc)" >make.log 2>&1 || { cat make.log; exit 1; }
  make install >>make.log 2>&1 )
NEW=$B/inst/lib/libmnl.a

# the archive must export exactly what the installed shared library exports (same version, same API)
nm -g --defined-only "$NEW" | awk '$2=="T"{print $3}' | sort -u > "$B/syms.a"
nm -D --defined-only "$MNL_SO" | awk '$2=="T"{sub(/@.*/,"",$3); print $3}' | sort -u > "$B/syms.so"
if ! cmp -s "$B/syms.a" "$B/syms.so"; then
  diff "$B/syms.so" "$B/syms.a" >&2 || true; die "exported symbols of libmnl.a differ from $MNL_SO"
fi

install -m 0644 "$NEW" "$STATIC_DIR/libmnl.a"
{ echo "$STAMP"; echo "libnftnl $(dpkg-query -W -f='${Version}' libnftnl-dev)"
  echo "libmnl source: $ORIGIN"
  echo "built $(date -Is) with $(gcc --version | head -1), CFLAGS -O2 -fPIC"
  (cd "$STATIC_DIR" && sha256sum libmnl.a libnftnl.a); } > "$STATIC_DIR/BUILD-INFO.txt"
log "installed $STATIC_DIR/libmnl.a ($(wc -l < "$B/syms.a") exported functions, same as $(basename "$MNL_SO"))"
