#!/bin/bash
# check-bins.sh DIR [BINARY...] - every product binary given (and those in DIR) must be
# byte-identical to the build-bins.sh build recorded in DIR/SHA256SUMS; fails naming the first
# that differs. test.sh runs it on the binaries the tests ran, the image's and the deploy
# check's.
set -euo pipefail
dir=${1:?usage: check-bins.sh DIR [BINARY...]}
shift
sums=$dir/SHA256SUMS
[ -f "$sums" ] || { echo "check-bins: $sums missing (run integration/scripts/build-bins.sh)" >&2; exit 1; }
(cd "$dir" && sha256sum --quiet -c SHA256SUMS) || { echo "check-bins: $dir changed since build-bins.sh" >&2; exit 1; }
for f in "$@"; do
  name=$(basename "$f")
  want=$(awk -v n="$name" '$2 == n {print $1}' "$sums")
  [ -n "$want" ] || { echo "check-bins: $name is not a product binary" >&2; exit 1; }
  got=$(sha256sum "$f" | cut -d' ' -f1)
  [ "$got" = "$want" ] || { echo "check-bins: $f differs from the build (sha256 $got, built $want)" >&2; exit 1; }
done
echo "check-bins: ${#@} binaries identical to $dir (SHA256SUMS)"
