#!/bin/bash
# build-ztunnel.sh - build Istio's ztunnel (the ambient node proxy) from a source tarball, as the
# REAL peer of our ZDS server (crates/zds) in tests. Nothing of ztunnel enters this checkout:
# source, cargo target dir and binary all live in the cache dir below.
#
#   ZTUNNEL_SRC    source tarball (default ../shared/peers/ztunnel-src.tar.gz beside the checkout,
#                  see its README)
#   ZTUNNEL_CACHE  cache dir      (default /var/cache/istio-cni-build/ztunnel)
#   ZTUNNEL_BIN    installed binary (default /usr/local/bin/ztunnel-test; the tests look there,
#                  or wherever the env var ZTUNNEL_BIN points when they run)
#   FORCE=1        rebuild even when the binary matches the tarball
#
# Built with cargo's `dev` profile without debug info: a test peer needs ztunnel's behaviour,
# not its speed (the demo and the tests send a handful of connections through it), and this is
# the first run's longest step: 260 CPU-s measured here, where ztunnel's `quick-release`
# (opt-level 3, 16 codegen units) still ran 252 s after the product's release build was done on
# a fresh idle machine (its `release`, fat LTO over one codegen unit, longer still).
#
# Idempotent: the binary is rebuilt only when the tarball's sha256 or the profile changes
# (stamp next to the binary's cache copy). The cargo target dir is kept across versions, so a
# new tarball rebuilds incrementally. The build runs at nice 19 with -j2 so it never starves
# the rest of the machine.
# Needs protoc (protobuf-compiler; ztunnel's build.rs compiles its .proto files) and cargo.
set -euo pipefail
# The shared folder sits beside the checkout (where CI and developers have it), wherever that is.
SHARED=$(readlink -f "$(dirname "$(readlink -f "$0")")/../../../shared")
SRC_TGZ=${ZTUNNEL_SRC:-$SHARED/peers/ztunnel-src.tar.gz}
CACHE=${ZTUNNEL_CACHE:-/var/cache/istio-cni-build/ztunnel}
DEST=${ZTUNNEL_BIN:-/usr/local/bin/ztunnel-test}
log() { echo "build-ztunnel: $*"; }
die() { echo "build-ztunnel: ERROR: $*" >&2; exit 1; }

[ -f "$SRC_TGZ" ] || die "source tarball $SRC_TGZ not found (set ZTUNNEL_SRC)"
command -v cargo >/dev/null || die "cargo missing"
command -v protoc >/dev/null || die "protoc missing (apt-get install protobuf-compiler)"
mkdir -p "$CACHE"
# Several helpers/CI jobs may run install-deps.sh at once: one build at a time.
exec 9>"$CACHE/.lock"
flock 9

SHA=$(sha256sum "$SRC_TGZ" | cut -d' ' -f1)
PROFILE=dev-nodebug
STAMP="$SHA $PROFILE"
STAMP_FILE=$CACHE/ztunnel.stamp
BUILT=$CACHE/bin/ztunnel
if [ "${FORCE:-0}" != 1 ] && [ -x "$BUILT" ] && [ "$(cat "$STAMP_FILE" 2>/dev/null)" = "$STAMP" ]; then
  if cmp -s "$BUILT" "$DEST"; then
    log "up to date ($DEST, source sha256 ${SHA:0:16}…)"
  else
    install -D -m 0755 "$BUILT" "$DEST"
    log "reinstalled $DEST from the cache (source sha256 ${SHA:0:16}…)"
  fi
  exit 0
fi

# 1. fresh source tree for this tarball (a stale tree from another version would mix files)
SRC=$CACHE/src
rm -rf "$SRC" && mkdir -p "$SRC"
tar -xzf "$SRC_TGZ" -C "$SRC"
[ -f "$SRC/ztunnel/Cargo.toml" ] || die "no ztunnel/Cargo.toml in $SRC_TGZ"

# 2. release build (no --locked: the tarball drops one git dependency, so cargo prunes it from
#    Cargo.lock; every other version stays as locked): tls-ring (no BoringSSL/aws-lc C toolchain), testing (FAKE_CA for standalone runs)
log "building ztunnel (source sha256 ${SHA:0:16}…, profile $PROFILE) in $CACHE; takes ~2.5 min on 2 cores"
start=$(date +%s)
( cd "$SRC/ztunnel" \
  && env -u RUSTFLAGS -u CARGO_BUILD_TARGET -u CARGO_ENCODED_RUSTFLAGS CARGO_TARGET_DIR="$CACHE/target" \
     CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_DEV_INCREMENTAL=false \
     nice -n 19 cargo build --profile dev -j2 --no-default-features --features tls-ring,testing \
     --bin ztunnel ) >"$CACHE/build.log" 2>&1 || { tail -30 "$CACHE/build.log" >&2; die "cargo build failed (log: $CACHE/build.log)"; }
log "built in $(( $(date +%s) - start ))s"

# 3. install: cache copy + stamp, then the stable path the tests use
install -D -m 0755 "$CACHE/target/debug/ztunnel" "$BUILT"
echo "$STAMP" > "$STAMP_FILE"
install -D -m 0755 "$BUILT" "$DEST"
log "installed $DEST ($(du -h "$DEST" | cut -f1), source sha256 ${SHA:0:16}…)"
