#!/usr/bin/env bash
# Quick start: install, then run the demo job. (Until the full job lands, this runs the
# DataProto wire demo and the wire benchmark.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/meshrl demo
exec .venv/bin/python bench/wire.py
