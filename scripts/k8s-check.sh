#!/usr/bin/env bash
# The driver contract of the `kubernetes` provider against a real cluster (issue 45): the
# cluster KUBECONFIG's context names (a `kind create cluster` on a laptop works), in its
# namespace or MONKEY_K8S_NAMESPACE; MONKEY_K8S_IMAGE: an image the cluster pulls that has
# sh and python3 (default python:3.12-alpine). It creates a few pods labelled monkey.dev/home
# and deletes them. Not run where monkey is developed: no cluster runs there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 -c 'import kubernetes' 2>/dev/null || { echo "pip install kubernetes first" >&2; exit 2; }
exec python3 -m pytest -q -n 0 -p no:cacheprovider tests/k8s_real_contract.py "$@"
