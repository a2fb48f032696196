#!/usr/bin/env bash
# Quick start: install into ./.venv, then train the tiny local model on single-digit
# addition with GRPO (warm start, then RL), all on this machine. Last line:
#   quickstart reward_start=<A> reward_end=<B> steps=<N> minutes=<M>
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/meshrl quickstart "$@"
