"""Servers to benchmark: named profiles, each run as its own `worldcast serve` process.

A profile is a set of `worldcast serve` flags. The benchmark starts the
server in a child process on a free loopback port (ICE pinned to 127.0.0.1)
so the server's device worker and encoders do not share the benchmark
clients' interpreter lock, waits for `/readyz`, and stops it with SIGINT
(uvicorn's graceful shutdown) when done.

Profiles are written `name` (a preset) or `name:key=value,key=value`
(a preset, or `shared` when the name is new, with overrides). Keys:
max_batch, admission, max_sessions, target_utilization, min_observation,
threads, video_scale, engines, engine_process, model (a registered
`NAME[:VARIANT]`, e.g. `static:model=matrix-game-2:tiny`; the benchmark's
`--model` sets it too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

#: How long a server may take to load the model, warm up and report ready, s.
READY_TIMEOUT_S = 900.0  # a cold compile cache builds every step graph first (minutes on 2 vCPUs)


@dataclass(frozen=True)
class ServerProfile:
    """`worldcast serve` settings of one benchmarked server.

    Attributes:
        name: label in reports.
        max_batch: sessions per batched step; 1 is the one-session-at-a-time baseline.
        admission: admission policy (static, always-on, duty-cycle).
        max_sessions: hard cap on open sessions.
        target_utilization: largest share of a chunk period one batched chunk may take, in (0, 1].
        max_overload: duty-cycle admission's largest share of time with more sessions generating than fit.
        min_observation: s a session is observed before its own duty cycle counts fully.
        threads: torch threads of the device worker (None: torch's default).
        video_scale: integer upscale of the published video.
        model: the served model, `NAME[:VARIANT]` from the registry (None: the server's default).
        engines: engine cores (`--engines`; more than one run in processes of their own).
        engine_process: 1: `--engine-process` (even one engine in its own process), 0: `--no-engine-process`,
            -1: the server's default.
    """

    name: str
    max_batch: int = 8
    admission: str = "static"
    max_sessions: int = 16
    target_utilization: float = 0.85
    max_overload: float = 0.05
    min_observation: float = 20.0
    threads: int | None = None
    video_scale: int = 4
    model: str | None = None
    engines: int = 1
    engine_process: int = -1

    def __post_init__(self) -> None:
        if self.engines < 1 or self.engine_process not in (-1, 0, 1):
            raise ValueError(f"profile {self.name!r}: engines must be >= 1 and engine_process -1, 0 or 1")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", self.name):
            raise ValueError(f"profile name {self.name!r}: use 1-40 letters, digits, '_', '.', '-'")
        if not all(math.isfinite(x) for x in (self.target_utilization, self.max_overload, self.min_observation)):
            raise ValueError(f"profile {self.name!r}: target_utilization, max_overload and min_observation "
                             "must be finite")
        if self.max_batch < 1 or self.max_sessions < 1:
            raise ValueError(f"profile {self.name!r}: max_batch and max_sessions must be >= 1")
        if self.admission not in ("static", "always-on", "duty-cycle"):
            raise ValueError(f"profile {self.name!r}: admission must be static, always-on or duty-cycle, "
                             f"not {self.admission!r}")
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"profile {self.name!r}: target_utilization must lie in (0, 1]")
        if not 0 <= self.max_overload < 1:
            raise ValueError(f"profile {self.name!r}: max_overload must lie in [0, 1)")
        if self.min_observation < 0:
            raise ValueError(f"profile {self.name!r}: min_observation must be >= 0")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"profile {self.name!r}: threads must be >= 1")
        if not 1 <= self.video_scale <= 8:
            raise ValueError(f"profile {self.name!r}: video_scale must lie in 1..8")

    def flags(self) -> list[str]:
        """The `worldcast serve` flags for this profile."""
        f = ["--max-batch", str(self.max_batch), "--admission", self.admission,
             "--max-sessions", str(self.max_sessions), "--target-utilization", str(self.target_utilization),
             "--max-overload", str(self.max_overload), "--min-observation", str(self.min_observation),
             "--video-scale", str(self.video_scale)]
        if self.threads:
            f += ["--threads", str(self.threads)]
        if self.model:
            f += ["--model", self.model]
        if self.engines != 1:
            f += ["--engines", str(self.engines)]
        if self.engine_process != -1:
            f += ["--engine-process" if self.engine_process else "--no-engine-process"]
        return f

    @classmethod
    def parse(cls, text: str) -> ServerProfile:
        """Parse a preset `name`, or `name:key=value,...` (a preset's settings changed, or, for a name that is
        no preset, a profile of that name on "shared"'s settings).

        Raises:
            ValueError: a bare name that is no preset (a typo would otherwise run "shared"), an unknown
                key, or a value of the wrong type.
        """
        name, _, rest = text.partition(":")
        if not rest and name not in PRESETS:
            raise ValueError(f"no profile preset {name!r} (presets: {', '.join(PRESETS)}; name:key=value,... "
                             "names a profile of your own)")
        base = PRESETS.get(name, dataclasses.replace(PRESETS["shared"], name=name))
        if not rest:
            return base
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw: dict[str, object] = {}
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if not eq or key not in fields or key == "name":
                raise ValueError(f"profile {text!r}: expected key=value with key in "
                                 f"{sorted(set(fields) - {'name'})}, got {item!r}")
            try:
                kw[key] = (str(value) if key in ("admission", "model") else float(value) if key in (
                    "target_utilization", "max_overload", "min_observation") else int(value))
            except ValueError:
                raise ValueError(f"profile {text!r}: bad value for {key}: {value!r}") from None
        return dataclasses.replace(base, name=name, **kw)  # type: ignore[arg-type]


#: Named profiles.
#: - shared: the shared step scheduler (cross-session batching) with duty-cycle admission;
#: - baseline: one session's step at a time (no cross-session batching, as realtime servers that
#:   serve each session's requests alone do), same admission policy, so its measured costs decide;
#: - duty-cycle / always-on: the shared scheduler under each admission policy;
#: - static: the shared scheduler admitting up to 16 sessions whatever they cost (overload tests).
#: Admission trusts a measured duty cycle after 10 s here (the server's default is 20 s), so the
#: one-minute shipped trace exercises it.
PRESETS: dict[str, ServerProfile] = {
    "shared": ServerProfile("shared", max_batch=8, admission="duty-cycle", min_observation=10.0),
    "baseline": ServerProfile("baseline", max_batch=1, admission="duty-cycle", min_observation=10.0),
    "duty-cycle": ServerProfile("duty-cycle", max_batch=8, admission="duty-cycle", min_observation=10.0),
    "always-on": ServerProfile("always-on", max_batch=8, admission="always-on"),
    "static": ServerProfile("static", max_batch=8, admission="static"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def spawn(profile: ServerProfile, *, log_dir: str | None = None, extra_flags: list[str] | None = None,
          python_args: list[str] | None = None) -> Iterator[str]:
    """Run a server for `profile` in a child process (with `extra_flags` too); yields its base URL.

    Args:
        python_args: interpreter arguments before `-m worldcast.transport.cli`, e.g.
            `["-m", "cProfile", "-o", PATH]` to profile the server's event loop (its main thread).

    Raises:
        RuntimeError: the server exited or was not ready within READY_TIMEOUT_S (its log is quoted).
    """
    with serve_process([*profile.flags(), *(extra_flags or [])], name=profile.name, log_dir=log_dir,
                       python_args=python_args) as url:
        yield url


@contextlib.contextmanager
def serve_process(flags: list[str], *, name: str = "server", log_dir: str | None = None,
                  python_args: list[str] | None = None, ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[str]:
    """`worldcast serve --host 127.0.0.1 --port FREE --ice-host 127.0.0.1 --log-level warning FLAGS` in a child
    process; yields its base URL once `/readyz` answers 200, and stops it with SIGINT (then SIGKILL after 20 s).

    The log of a server that failed is kept (its path is in the error).

    Raises:
        RuntimeError: the server exited or was not ready within `ready_timeout_s` (its log is quoted).
    """
    port = _free_port()
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the child's lifetime
        "w+", prefix=f"worldcast-bench-{name}-", suffix=".log", dir=log_dir, delete=False)
    cmd = [sys.executable, *(python_args or []), "-m", "worldcast.transport.cli", "serve", "--host", "127.0.0.1",
           "--port", str(port), "--ice-host", "127.0.0.1", "--log-level", "warning", *flags]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server {name} exited ({proc.returncode}), log {log.name}: "
                                   f"{_tail(log.name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server {name} not ready after {ready_timeout_s:.0f} s: {_tail(log.name)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
        failed = False
    except BaseException:
        failed = True
        raise
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        if not failed:  # keep the log of a server that failed (its path is in the error)
            os.unlink(log.name)


def _tail(path: str, chars: int = 2000) -> str:
    with open(path) as f:
        return f.read()[-chars:]


#: Resident memory of engine cores in processes of their own (`transport/http/metrics.py`), one sample per engine.
ENGINE_RSS = "worldcast_engine_process_resident_memory_bytes"


def resident_bytes(samples: dict[str, list[float]]) -> float:
    """The server's resident memory with its engine processes', bytes, from /metrics samples by name (every
    sample of each name): `process_resident_memory_bytes` plus each `ENGINE_RSS` sample (NaN without the former)."""
    own = samples.get("process_resident_memory_bytes")
    return own[0] + sum(samples.get(ENGINE_RSS, [])) if own else float("nan")


async def metric_samples(url: str) -> dict[str, list[float]]:
    """Every sample of the server's `/metrics`, by name (labelled samples in the order exported).

    Raises:
        httpx.HTTPError: the server did not answer.
    """
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        text = (await http.get("/metrics")).text
    out: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, []).append(float(sample.value))
    return out


async def process_metric(url: str, name: str) -> float:
    """One unlabelled sample of the server's own `/metrics` (Prometheus text format), e.g.
    `process_cpu_seconds_total` (s) or `process_resident_memory_bytes` (bytes).

    Raises:
        RuntimeError: the server exports no sample of that name.
        httpx.HTTPError: the server did not answer.
    """
    found = (await metric_samples(url)).get(name)
    if not found:
        raise RuntimeError(f"no {name} on {url}/metrics")
    return found[0]
