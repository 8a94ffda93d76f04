#!/bin/bash
# build-bins.sh - THE build of the product's binaries (istio-cni, install-cni, istio-nftables):
# one command, one feature unification (the whole workspace is selected; only the three
# binaries are linked), so the image, the tests and the deploy checks run the same bytes.
# (Selecting one package, e.g. `cargo run -p install-cni`, unifies features over fewer crates
# and can give a different binary.) Other release binaries (the demo, the benchmarks) are built
# with `--workspace` too, so they never rebuild these.
# Writes SHA256SUMS next to the binaries and prints their directory on stdout (last line).
# check-bins.sh verifies a binary anywhere (an image, a test's copy) against SHA256SUMS.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
BINS=(istio-cni install-cni istio-nftables)
triple=$(sed -n 's/^target *= *"\([^"]*\)".*/\1/p' .cargo/config.toml)
dir=${CARGO_TARGET_DIR:-$PWD/target}/${triple:+$triple/}release
cargo build --locked --release --workspace "${BINS[@]/#/--bin=}" >&2
for b in "${BINS[@]}"; do
  [ -x "$dir/$b" ] || { echo "build-bins: $dir/$b missing" >&2; exit 1; }
  if readelf -d "$dir/$b" | grep -q NEEDED; then echo "build-bins: $b is not static" >&2; exit 1; fi
done
(cd "$dir" && sha256sum "${BINS[@]}" > SHA256SUMS)
echo "$dir"
