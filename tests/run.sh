#!/usr/bin/env bash
# The project's test command (README, CI). Installs what the tests need, then runs pytest.
# Needs root (or passwordless apt) the first time for openssh-server, shellcheck and prometheus; the first run
# also installs the real engine (about 5.5 GB, 5 to 15 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v shellcheck >/dev/null 2>&1 || need_apt+=(shellcheck)
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]} (Debian packages)"
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
mkdir -p /run/sshd 2>/dev/null || true

# exact versions from the lock (tools/lock.py writes it), so every machine tests what the last one did
python -m pip install -q -c requirements.lock -e '.[test]'
# the real engine (vLLM's CPU build with NIXL) in its own virtual environment, from its own lock: the
# tests/realengine tier runs the proxy and the checks against it, and must not be skipped here
python -m ascend_runtime engine status || python -m ascend_runtime engine install
export ASCEND_DEPLOY_REAL_ENGINE=required
exec python -m pytest -q -p no:cacheprovider "$@"
