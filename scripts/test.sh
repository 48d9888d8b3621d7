#!/usr/bin/env bash
# Install monkey with its test dependencies, then run the test suite.
# Usage (from anywhere):  bash scripts/test.sh [extra pytest args]   (`-n 0`: serially)
# CI runs this same script via .ci/run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export DEBIAN_FRONTEND=noninteractive

# System packages: task-spooler (local job queue), sshd + iproute2 (SSH tests), git,
# slurm-wlm + munge (single-node Slurm for the Slurm provider tests), zsh (completion tests),
# chromium (Monkey Web's browser tests, driven by Playwright), bubblewrap (jobs in a
# sandbox on a main node: tests/test_sandbox.py); docker-registry, skopeo, umoci, apache2-utils
# (htpasswd) and busybox-static: a real OCI registry and images built without a daemon, for
# jobs in images (tests/test_images.py); docker.io: Docker's engine, started by
# tests/test_image_engines.py (as root) for jobs in images with `engine: docker`.
# python3/pip/venv are listed too because a bare Debian 12 image has none of them.
apt_pkgs=(task-spooler openssh-server iproute2 git python3 python3-pip python3-venv slurm-wlm munge zsh chromium bubblewrap
  docker-registry skopeo umoci apache2-utils busybox-static docker.io)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "==> apt-get install ${missing[*]}"
    log=$(mktemp)
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
      >"$log" 2>&1 </dev/null; then
      cat "$log"; echo "error: apt-get install failed" >&2; exit 1
    fi
    rm -f "$log"
  else
    echo "warning: not root (or no apt-get); not installing: ${missing[*]}" >&2
  fi
fi

source scripts/python-env.sh

# An editable install as a plain .pth naming this folder ("compat"): setuptools' default one
# installs an import hook that every Python process then loads (it imports pathlib and
# importlib.util), and the suite starts about 4,000. With an older pip that has no
# --config-settings, the default install.
compat=()
pip_help=$(python3 -m pip install --help 2>/dev/null || true)
if [[ $pip_help == *--config-settings* ]]; then
  compat=(--config-settings editable_mode=compat)
fi
echo "==> pip install -e '.[test]'"
python3 -m pip install -q -e '.[test]' "${compat[@]}" </dev/null

echo "==> pytest"
rc=0
# Five workers (pytest-xdist): the tests wait on cores, agents and services far more than
# they compute, so 5 keep 2 cores busy (9 minutes here; 4 workers took 10). Slurm's tests
# share one worker (tests/conftest.py).
python3 -m pytest -q -n 5 --dist loadgroup "$@" </dev/null || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests - refusing to report success" >&2
  exit 1
fi
exit "$rc"
