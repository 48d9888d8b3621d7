#!/usr/bin/env bash
# Install monkey with the example's dependencies, then train the digits classifier under monkey
# on this machine (the `local` provider, no configuration). --follow streams the job's output
# and exits with the job's exit code.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/python-env.sh
python3 -m pip install -q '.[examples]'
exec monkey run --follow -- python3 examples/mnist.py --learning-rate 0.1
