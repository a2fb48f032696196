#!/usr/bin/env bash
# The trainer's GPU paths on a GPU machine with PyTorch and transformers but no meshrl and no
# network (bench/gpu_check.py says what runs). Bring along, beside the checkout:
#   .whl/        wheels of what that machine lacks, for its Python (pydantic, pydantic-core,
#                annotated-types, typing-inspection, typing-extensions, tensordict, pyvers,
#                grpcio and protobuf at least the stubs' versions); docs/trainer.md ("On a GPU") gives the command
#   services/pb/ the generated gRPC stubs (scripts/gen_proto.py writes them at install)
# Usage: bash scripts/gpu_check.sh [OUT_DIR] [--only SECTIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-/tmp/meshrl-gpu-check}"; shift || true
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/meshrl-site .whl/*.whl
export PYTHONPATH="$PWD:/tmp/meshrl-site" PYTHONUNBUFFERED=1
ls services/pb/*_pb2.py >/dev/null  # the stubs must have come along
exec python3 bench/gpu_check.py --out "$out" "$@"
