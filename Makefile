PY ?= .venv/bin/python

.PHONY: proto test bench
proto:  ## regenerate the committed stubs in services/pb from proto/*.proto
	$(PY) scripts/gen_proto.py

test:
	$(PY) -m pytest -q

bench:
	$(PY) bench/wire.py
