# Sourced by the set-up scripts: choose where pip installs, never into your interpreter's own
# packages. An active virtualenv ($VIRTUAL_ENV) is used as it is; otherwise ./.venv, made on
# first use, on any Python (a system one, pyenv, conda). CI (CI=true: a throwaway machine,
# see .ci/run) installs into its python3 itself, the one its SSH test hosts run too.
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python3" ]; then
  export PATH="$VIRTUAL_ENV/bin:$PATH"
elif [ "${CI:-}" = "true" ]; then
  export PIP_BREAK_SYSTEM_PACKAGES=1  # Debian's python3 refuses pip otherwise (PEP 668)
else
  if [ ! -x .venv/bin/python3 ]; then
    echo "==> creating ./.venv (with $(command -v python3))"
    python3 -m venv .venv || {
      echo "error: python3 -m venv failed; on Debian/Ubuntu: apt-get install python3-venv" >&2
      exit 1
    }
  fi
  export VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"
  hash -r
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
