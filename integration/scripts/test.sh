#!/bin/bash
# Every check the project has: formatting, lints, and all tests (unit, golden parity, and the
# real-kernel tests that create their own network namespaces). Run as root on Debian 12.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
[ "$(id -u)" = 0 ] || { echo "test: run as root (network namespaces, netfilter)" >&2; exit 1; }
command -v cargo >/dev/null || { echo "test: needs cargo (Rust >= 1.85)" >&2; exit 1; }
integration/scripts/install-deps.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
echo "== cargo doc (no broken or private links in any crate's docs)"
RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps --document-private-items -q
echo "== integration/scripts/build-bins.sh (the one release build: static binaries)"
# The image, every test that runs a product binary and the deploy checks use these bytes.
bins=$(integration/scripts/build-bins.sh | tail -1)
export ISTIO_CNI_BIN_DIR=$bins INSTALL_CNI=$bins/install-cni
echo "== container image (deploy/scripts/build-image.sh: buildah, no registry; checked)"
# Built once from the binaries just built; the CRI e2e (integration/tests/cri.rs) runs this archive.
export ISTIO_CNI_IMAGE=${CARGO_TARGET_DIR:-$PWD/target}/images/install-cni.oci.tar
deploy/scripts/build-image.sh --no-build --out "$ISTIO_CNI_IMAGE"
echo "== cargo test"
# Every binary runs even after one fails: a red run names all its failures at once.
cargo test --locked --workspace --no-fail-fast
deploy/scripts/check.sh
echo "== the binaries the tests, the image and the deploy checks ran are the build's"
python3 deploy/scripts/check-image.py --extract-bins "$ISTIO_CNI_IMAGE" "$bins/image-bins"
integration/scripts/check-bins.sh "$bins" "$bins"/image-bins/* "$INSTALL_CNI"
