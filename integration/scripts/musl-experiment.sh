#!/bin/bash
# musl-experiment.sh - the evidence behind docs/benchmarks.md's "CLI apply vs nft -f" row: the same
# istio-nftables linked against musl instead of glibc, applied in fresh namespaces by
# bench-apply beside the shipped (glibc) build, alternating, so that the cost of glibc's
# start-up (its CPU cache probe: ≈90 `cpuid`, each a VM exit on this nested VM) is measured,
# not argued.
#
# An experiment, not a build of the product: it needs Rust's x86_64-unknown-linux-musl
# standard library, which a fresh machine's toolchain does not have and no package registry
# we reach ships (the product's one build, build-bins.sh, stays glibc). Exits 2 without it.
# Debian's libnftnl.a is built with glibc's _FORTIFY_SOURCE; musl has no `__*_chk`, so two
# forwarding shims (compiled with musl-gcc, Debian's musl-tools) stand in for them.
#
# Usage (as root, after build-bins.sh and `cargo build --release --workspace --bins`):
#   integration/scripts/musl-experiment.sh [samples]
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
samples=${1:-30}
musl=x86_64-unknown-linux-musl
if ! rustc --print sysroot >/dev/null || [ ! -d "$(rustc --print sysroot)/lib/rustlib/$musl" ]; then
  echo "musl-experiment: Rust's $musl standard library is not installed; nothing measured" >&2
  exit 2
fi
command -v musl-gcc >/dev/null || apt-get install -y -q musl-tools >/dev/null
work=${MUSL_EXPERIMENT_DIR:-/var/cache/istio-cni-build/musl-experiment}
mkdir -p "$work/lib"
cat > "$work/fortify.c" <<'EOF'
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
int __snprintf_chk(char *s, size_t maxlen, int flag, size_t slen, const char *fmt, ...) {
  (void)flag; if (maxlen > slen) abort();
  va_list ap; va_start(ap, fmt); int r = vsnprintf(s, maxlen, fmt, ap); va_end(ap); return r;
}
int __fprintf_chk(FILE *f, int flag, const char *fmt, ...) {
  (void)flag; va_list ap; va_start(ap, fmt); int r = vfprintf(f, fmt, ap); va_end(ap); return r;
}
EOF
musl-gcc -O2 -c "$work/fortify.c" -o "$work/fortify.o"
ar rcs "$work/lib/libfortifyshim.a" "$work/fortify.o"
ln -sf /usr/lib/x86_64-linux-gnu/libnftnl.a "$work/lib/libnftnl.a"
# The same flags as .cargo/config.toml's glibc target: static, non-PIE.
CARGO_TARGET_DIR="$work/target" cargo build --locked --release --target "$musl" --bin istio-nftables \
  --config "target.$musl.rustflags=[\"-C\",\"target-feature=+crt-static\",\"-C\",\"relocation-model=static\"]" \
  --config "target.$musl.nftnl.rustc-link-lib=[\"static=nftnl\",\"static=fortifyshim\"]" \
  --config "target.$musl.nftnl.rustc-link-search=[\"native=$work/lib\"]" \
  --config "target.$musl.mnl.rustc-link-lib=[]" >&2
glibc_dir=target/x86_64-unknown-linux-gnu/release
musl_cli=$work/target/$musl/release/istio-nftables

# Both builds must program the same ruleset before their times mean anything.
flags=(-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -b '*' -d 15090,15021,15020 --ipv6=off --backend nft)
for cli in "$glibc_dir/istio-nftables" "$musl_cli"; do
  ns=musl-exp-$$
  ip netns add "$ns"
  ip netns exec "$ns" "$cli" "${flags[@]}" 2>/dev/null
  ip netns exec "$ns" nft list ruleset | sha256sum
  ip netns del "$ns"
done | uniq | [ "$(wc -l)" = 1 ] || { echo "musl-experiment: the two builds' rulesets differ" >&2; exit 1; }

row() { grep -E "nsenter|CLI \(netlink|nft -f. of Istio" | awk -F'|' '{printf "%s ms  ", $3}'; }
for round in 1 2; do
  for cli in "$glibc_dir/istio-nftables" "$musl_cli"; do
    kind=glibc; [ "$cli" = "$musl_cli" ] && kind=musl
    out=$("$glibc_dir/bench-apply" "$cli" "$samples")
    echo "round $round, $kind: nsenter+true / CLI / nft -f (p50): $(row <<<"$out") $(tail -1 <<<"$out")"
  done
done
