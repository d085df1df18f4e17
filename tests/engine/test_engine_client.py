"""EngineClient with real engine processes (spawned, TinyWorld built by name): frames through shared memory,
death noticed at once and restarted, sessions moved between processes byte for byte."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from worldcast.engine.conditioner import ConditionerState, InputDelta, SessionConditioner
from worldcast.engine.device_worker import EngineConfig
from worldcast.engine.engine_handle import EngineHandle
from worldcast.engine.errors import EngineUnavailable
from worldcast.engine.local_engine import LocalEngine
from worldcast.engine.process.client import EngineClient, EngineLaunch, RestartPolicy
from worldcast.engine.step_output import FrameOut

pytestmark = pytest.mark.timeout(600)

FRAMES = 12


def state(model, held: tuple[str, ...] = ("d",)) -> ConditionerState:  # type: ignore[no-untyped-def]
    prompt = np.eye(model.spec.conditioning.tensors[0][1][0], dtype=np.float32)[0]
    return ConditionerState(epoch=0, wants_frames=True, context_version=0, context={"prompt": prompt}, held=held)


class Recorder:
    def __init__(self) -> None:
        self.frames: dict[str, dict[int, FrameOut]] = {}
        self.lost: list[tuple[float, list[str], str]] = []
        self.errors: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def attach(self, e: EngineHandle) -> None:
        e.on_frames = self.on_frames
        e.on_error = lambda sid, r: self.errors.append((sid, r))
        e.on_lost = lambda eng, sids, r: self.lost.append((time.monotonic(), sids, r))

    def on_frames(self, frames: list[FrameOut]) -> None:
        with self.lock:
            for f in frames:
                self.frames.setdefault(f.session_id, {})[f.frame_index] = f

    def count(self, sid: str) -> int:
        with self.lock:
            return len(self.frames.get(sid, {}))


async def until(cond, timeout_s: float = 120.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, f"{what} not met within {timeout_s} s"
        await asyncio.sleep(0.01)


def launch(model, **kw) -> EngineLaunch:  # type: ignore[no-untyped-def]
    cfg = EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session() * 2, max_batch=1, torch_threads=1)
    return EngineLaunch(model="tinyworld", weights=kw.pop("weights", None), options={}, device="cpu", config=cfg,
                        log_level=logging.WARNING, **kw)


async def twin_frames(model, held: tuple[str, ...], seed: int, n: int) -> dict[int, np.ndarray]:  # type: ignore[no-untyped-def]
    """The same session on an engine in this process, given the same messages through the same contract."""
    rec = Recorder()
    e = LocalEngine(0, model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session(), max_batch=1,
                                           torch_threads=1))
    rec.attach(e)
    await e.start(warmup=False)
    try:
        e.add_session("twin", state(model, held), seed=seed)
        await until(lambda: rec.count("twin") >= n, what="the twin's frames")
    finally:
        await e.aclose()
    with rec.lock:
        return {i: f.image.copy() for i, f in rec.frames["twin"].items()}


async def test_frames_come_through_shared_memory_as_the_in_process_engine_makes_them(model) -> None:  # type: ignore[no-untyped-def]
    twin = await twin_frames(model, ("d",), 7, FRAMES)
    rec = Recorder()
    c = EngineClient(0, launch(model), spec=model.spec)
    rec.attach(c)
    await c.start(warmup=False)
    try:
        assert c.state == "ready" and c.pid is not None and c.pid != os.getpid() and c.num_slots == 2
        assert c.frozen_objects > 10_000, "the engine process froze its start-up objects out of collection"
        c.add_session("s", state(model), seed=7)
        await until(lambda: rec.count("s") >= FRAMES, what="frames")
        with rec.lock:
            got = dict(rec.frames["s"])
        for i in range(FRAMES):
            assert np.array_equal(got[i].image, twin[i]), f"frame {i} differs from the in-process engine's"
        t = [got[i].present_at_s for i in range(FRAMES)]
        assert all(b > a for a, b in zip(t, t[1:]))
        assert c.info()["sessions"] == ["s"] and c.free_slots == 1
        await until(lambda: c.snapshot.steps_run > 0, what="a status report")
        c.remove_session("s")
        await until(lambda: c.snapshot.slots_used == 0, what="the slot freed")
    finally:
        await c.aclose()
    assert c.state == "stopped" and not rec.errors


async def test_a_killed_engine_is_noticed_at_once_names_its_sessions_and_comes_back(model) -> None:  # type: ignore[no-untyped-def]
    rec = Recorder()
    c = EngineClient(0, launch(model), spec=model.spec, restart=RestartPolicy(initial_backoff_s=0.2))
    states: list[str] = []
    c.on_state = lambda e: states.append(e.state)
    rec.attach(c)
    await c.start(warmup=False)
    try:
        c.add_session("a", state(model), seed=1)
        c.add_session("b", state(model), seed=2)
        await until(lambda: rec.count("a") >= 3 and rec.count("b") >= 3, what="frames")
        await until(lambda: bool(c.snapshot.cost.snapshot()), what="measured costs")
        old = c.pid
        assert old is not None
        t_kill = time.monotonic()
        os.kill(old, signal.SIGKILL)
        await until(lambda: bool(rec.lost), timeout_s=30, what="the loss")
        at, sids, reason = rec.lost[0]
        assert sorted(sids) == ["a", "b"] and "SIGKILL" in reason, reason
        assert c.losses == 1 and c.session_ids == set()
        with pytest.raises(EngineUnavailable):
            c.add_session("c", state(model), seed=3)  # admission places nothing on a lost engine
        logging.getLogger(__name__).info("kill -> lost in %.3f s", at - t_kill)
        await until(lambda: c.state == "ready", what="the restart")
        assert c.pid not in (None, old) and c.restarts == 1
        assert states == ["ready", "lost", "restarting", "ready"], states
        n = rec.count("c")
        c.add_session("c", state(model), seed=3)
        await until(lambda: rec.count("c") >= n + 3, what="frames from the restarted engine")
    finally:
        await c.aclose()


@pytest.mark.parametrize("source", ["process", "local"])
async def test_a_session_moves_between_engines_byte_for_byte_and_goes_on_as_its_twin(model, source) -> None:  # type: ignore[no-untyped-def]
    """Between two engine processes, and from an engine in this process to an engine process: one contract and
    one state format, so the moved session's frames are its unmoved twin's."""
    twin = await twin_frames(model, ("w", "d"), 11, FRAMES)
    rec = Recorder()
    a: EngineHandle = (EngineClient(0, launch(model), spec=model.spec) if source == "process" else
                       LocalEngine(0, model, launch(model).config))
    b = EngineClient(1, launch(model), spec=model.spec)
    rec.attach(a)
    rec.attach(b)
    await asyncio.gather(a.start(warmup=False), b.start(warmup=False))
    try:
        src = state(model, ("w", "d"))
        a.add_session("m", src, seed=11)
        a.push_input("m", InputDelta(held=("w", "d"), seq=0))  # a seq for the same keys: nothing changes
        await until(lambda: rec.count("m") >= 4, what="frames on A")
        blob = await a.export_session("m")
        n_a = rec.count("m")
        assert a.session_ids == set() and not a.holds("m")
        restored = await b.import_session("m", src, seed=0, blob=blob, verify=True)
        assert restored == blob, "B's state right after the restore differs from what left A"
        assert b.holds("m")
        await until(lambda: rec.count("m") >= FRAMES, what="frames on B")
    finally:
        await asyncio.gather(a.aclose(), b.aclose())
    with rec.lock:
        got = rec.frames["m"]
    assert sorted(got)[:FRAMES] == list(range(FRAMES)) and 0 < n_a < FRAMES
    differ = [i for i in range(FRAMES) if not np.array_equal(got[i].image, twin[i])]
    assert not differ, f"frames {differ} differ from the unmoved twin's (moved after frame {n_a - 1})"


async def test_an_engine_that_cannot_start_says_why(model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c = EngineClient(0, launch(model, weights=tmp_path / "missing.safetensors"), spec=model.spec)
    with pytest.raises(EngineUnavailable, match="missing.safetensors"):
        await c.start(warmup=False)
    await c.aclose()


def test_a_session_conditioner_counts_the_inputs_it_is_pushed(model) -> None:  # type: ignore[no-untyped-def]
    """The engine's owner of a session's inputs answers `input_version` as one per action message (a `clear` is not
    an input), read together with the actions a chunk samples; a state update keeps it; a stale message (held
    None) moves the mouse and leaves the keys."""
    cond = SessionConditioner(model, dataclasses.replace(state(model, held=()), input_version=5))
    assert cond.input_version() == 5
    cond.push(InputDelta(held=("d",), seq=0))
    cond.push(InputDelta(held=None, seq=0, moves=(("pan_x", 2.0),)))  # reordered: movement only
    assert cond.conditioner_state().held == ("d",) and cond.conditioner_state().moves == (("pan_x", 2.0),)
    cond.push(InputDelta(held=(), seq=1, clear=True))  # the client left: keys released, not an input
    assert cond.input_version() == 7 and cond.conditioner_state().moves == ()
    assert cond.sample_chunk(model.spec.frames_per_chunk).input_version == 7
    cond.update(dataclasses.replace(state(model), epoch=1, context=None))
    assert cond.input_version() == 7 and cond.current_epoch() == 1
    assert cond.conditioner_state().input_version == 7, "a move carries the count"


def test_an_engine_launch_pins_the_compile_cache_for_every_incarnation(model, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Once a torch.compile wrapper exists in the server's process, TorchInductor sets TORCHINDUCTOR_CACHE_DIR to
    its own default, which a restarted engine process would inherit (a cold cache, no packages): the launch
    resolves the cache when made and hands every incarnation that path."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ours"))
    la = launch(model)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torch-default"))  # set later by torch
    assert la.config.compile_cache_dir == tmp_path / "ours"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert launch(model).config.compile_cache_dir == tmp_path / "xdg" / "worldcast" / "torch-compile"
    cfg = EngineConfig(state_budget_bytes=2**26, compile_cache_dir=tmp_path / "given")
    assert EngineLaunch(model="tinyworld", weights=None, options={}, device="cpu",
                        config=cfg).config.compile_cache_dir == tmp_path / "given"
