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

.PHONY: serve test setup demo precompile train evaluate bench gpu-check fullsize-check livekit-server fuzz cycles flood soak attack rss

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --upgrade pip
	$(VENV)/bin/pip install -e '.[test,livekit]'
	touch $@

demo: web_demo/dist/index.html

web_demo/dist/index.html: web_demo/package.json web_demo/package-lock.json web_demo/index.html web_demo/direct.html $(wildcard web_demo/src/*.ts) web_demo/vite.config.ts
	npm --prefix web_demo ci --no-audit --no-fund
	npm --prefix web_demo run build

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
	$(PY) -m worldcast.engine.precompile

test: $(VENV)/.installed web_demo/dist/index.html /usr/bin/chromium $(LIVEKIT_SERVER)
	$(PY) -m pytest

# Reproduce the shipped weights (about 60-70 min on 2 CPU cores) and their evaluation report.
train: $(VENV)/.installed
	$(PY) -m worldcast.models.tinyworld.train --seed 0 --ae-steps 1000 --tf-steps 1300 --rollout-steps 500

evaluate: $(VENV)/.installed
	$(PY) -m worldcast.models.tinyworld.evaluate

# The latency benchmark's default profile (under 3 minutes on 2 CPU cores): motion-to-photon,
# then the shipped duty-cycle trace on the shared scheduler and on the one-at-a-time baseline.
bench: $(VENV)/.installed
	$(PY) -m worldcast.latency_bench default

# On a machine with a CUDA device: gpu-marked tests, the causal-Wan 1.3B engine path per batch size, TinyWorld's bench.
gpu-check: $(VENV)/.installed
	$(PY) -m worldcast.engine.gpu_check --out gpu_results

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

# RSS after repeated peaks of 8 sessions (4 WebRTC, 4 WebSocket stream), each deleted (about 2 minutes).
rss: $(VENV)/.installed
	$(PY) -m worldcast.latency_bench.rss --peaks 6 --sessions 8
