# tiermesh: the commands a newcomer runs. `make setup` first, then `make run` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROTO_SRC := $(wildcard protos/tiermesh/v1/*.proto)

.PHONY: setup protos run test lint fmt bench models clean

setup: $(BIN)/tiermesh protos  ## create .venv and install everything (CPU torch)

$(BIN)/tiermesh: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	# xds-protos ships its own opentelemetry/proto files; put the exporter's own copy back on top
	$(BIN)/python -m pip install --quiet --force-reinstall --no-deps \
		"opentelemetry-proto==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	$(BIN)/python -c "from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter"
	touch $(BIN)/tiermesh

protos: $(BIN)/tiermesh  ## generate the Python package tiermesh.v1 (+ .pyi stubs) from protos/
	$(BIN)/python -m grpc_tools.protoc -I protos --python_out=protos --pyi_out=protos \
		--grpc_python_out=protos $(PROTO_SRC)
	touch protos/tiermesh/__init__.py protos/tiermesh/v1/__init__.py

run: setup  ## start the three tiers and the router, show one streamed answer, serve until Ctrl-C
	$(BIN)/tiermesh run

test: setup  ## the suite CI runs
	$(BIN)/python -m pytest -q

lint: setup  ## ruff (lint + format check) and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

fmt: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

models: setup  ## train the built-in model family, then routing labels and the predictor (CPU)
	$(BIN)/tiermesh models train
	$(BIN)/tiermesh route label --splits train --limit 1500
	$(BIN)/tiermesh route label --splits dev,test
	$(BIN)/tiermesh route train

bench: setup  ## router-hop and tracing latency, engine batching, hybrid vs single
	$(BIN)/python scripts/hop_latency.py
	$(BIN)/tiermesh bench engine
	$(BIN)/tiermesh bench --scenario long-tail --out report/

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache .tiermesh
	find protos -name '*_pb2*.py*' -delete
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
