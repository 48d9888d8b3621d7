#!/usr/bin/env bash
# Install monkey with the example's dependencies, then train the digits classifier under monkey
# on this machine (the `local` provider, no configuration). --follow streams the job's output
# and exits with the job's exit code.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/python-env.sh
python3 -m pip install -q '.[examples]'
status=0
monkey run --follow -- python3 examples/mnist.py --learning-rate 0.1 || status=$?
if [ "${VIRTUAL_ENV:-}" = "$PWD/.venv" ]; then
  echo "==> monkey is installed in ./.venv; to use it in your shell: source .venv/bin/activate"
fi
exit "$status"
