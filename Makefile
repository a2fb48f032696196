PY ?= .venv/bin/python

.PHONY: proto test bench
proto:  ## regenerate the stubs in services/pb from proto/*.proto (install.sh runs it once)
	$(PY) scripts/gen_proto.py

test:
	$(PY) -m pytest -q

bench:
	$(PY) bench/wire.py
