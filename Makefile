PY ?= .venv/bin/python

.PHONY: proto test bench
proto:  ## regenerate services/pb from proto/*.proto
	$(PY) -m services.pb._gen

test:
	$(PY) -m pytest -q

bench:
	$(PY) bench/wire.py
