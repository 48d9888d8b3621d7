# Sourced by the set-up scripts: pick a Python that pip may install into.
# Debian's system python3 refuses pip installs (PEP 668). In CI the machine is throwaway, so
# override that; elsewhere, outside a virtualenv, use ./.venv instead of touching the system.
if python3 -c 'import sys, sysconfig, os; sys.exit(not (sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))'; then
  if [ "${CI:-}" = "true" ]; then
    export PIP_BREAK_SYSTEM_PACKAGES=1
  else
    [ -x .venv/bin/python3 ] || { echo "==> creating .venv"; python3 -m venv .venv; }
    export VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"
  fi
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
