#!/bin/bash
# build-image.sh - builds the install-cni image from deploy/Dockerfile without a Docker daemon or a
# registry, as an OCI archive, and checks it (deploy/scripts/check-image.py):
#   1. integration/scripts/build-bins.sh: the one release build of the three binaries (static)
#   2. a build context with just bin/{istio-cni,istio-nftables,install-cni} and legacy-tools/
#      (Debian's iptables-legacy tools and ipset with their libraries: stage-legacy-tools.sh)
#   3. buildah bud (Debian 12's buildah, rootful, vfs storage in a throwaway directory: never the
#      system's /var/lib/containers), FROM scratch, so nothing is pulled
#   4. buildah push to oci-archive:<out> tagged with the image the rendered manifests run
#      (deploy/manifests/istio-cni.yaml)
#   5. check-image.py: entrypoint, user, env, exactly these files, the three binaries
#      byte-identical (sha256) to the release build and static, the legacy tools Debian's own
#      files whose libraries all resolve inside the image, and the compressed size (limit 20 MB)
# Usage: build-image.sh [--out FILE] [--no-build]
#   --out       the OCI archive (default: $CARGO_TARGET_DIR or target/, /images/install-cni.oci.tar)
#   --no-build  use the release binaries as they are (test.sh has just built them)
# Env: IMAGE (default: the manifest's install-cni image), BUILDAH (default: buildah).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
out= build=1
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
  esac
done
BINS=(istio-cni istio-nftables install-cni)
triple=$(sed -n 's/^target *= *"\([^"]*\)".*/\1/p' .cargo/config.toml)
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
release=$target_dir/$triple/release
out=${out:-$target_dir/images/install-cni.oci.tar}
image=${IMAGE:-$(sed -n 's/^ *image: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' deploy/manifests/istio-cni.yaml | head -1)}
[ -n "$image" ] || { echo "build-image: no image in deploy/manifests/istio-cni.yaml" >&2; exit 1; }
BUILDAH=${BUILDAH:-buildah}
command -v "$BUILDAH" >/dev/null || { echo "build-image: needs buildah (integration/scripts/install-deps.sh)" >&2; exit 1; }

if [ "$build" = 1 ]; then
  echo "== image: integration/scripts/build-bins.sh"
  integration/scripts/build-bins.sh >/dev/null
fi
umask 022   # the context's modes become the image's
work=$(mktemp -d "${TMPDIR:-/tmp}/istio-cni-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/context/bin" "$(dirname "$out")"
for b in "${BINS[@]}"; do
  [ -x "$release/$b" ] || { echo "build-image: $release/$b missing (build without --no-build)" >&2; exit 1; }
  if readelf -d "$release/$b" | grep -q NEEDED; then echo "build-image: $b is not static" >&2; exit 1; fi
  cp "$release/$b" "$work/context/bin/$b"
done
deploy/scripts/stage-legacy-tools.sh "$work/context/legacy-tools"
cp deploy/Dockerfile "$work/context/Dockerfile"

echo "== image: buildah bud -f deploy/Dockerfile -> $image"
store=(--root "$work/storage" --runroot "$work/run" --storage-driver vfs)
# --isolation chroot: the Dockerfile has no RUN, but buildah still checks its runtime otherwise.
"$BUILDAH" "${store[@]}" bud -q --isolation chroot --layers=false --format oci \
  -f "$work/context/Dockerfile" -t "$image" "$work/context" >/dev/null
rm -f "$out"
"$BUILDAH" "${store[@]}" push -q "$image" "oci-archive:$out:$image"
"$BUILDAH" "${store[@]}" rmi -a -f >/dev/null 2>&1 || true

python3 deploy/scripts/check-image.py --archive "$out" --image "$image" --release-dir "$release" \
  --manifest deploy/manifests/istio-cni.yaml --limit-mb 20
echo "image: $out ($image)"
