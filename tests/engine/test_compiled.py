"""Compiled steps: the mode chosen per device, buckets and padding, the eager fallback, and compiled equals eager
on the real model (TorchInductor on this CPU; the CUDA-graph mode is selected, not run, without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldcast.engine.tuning.compiled import (
    CompiledStep,
    StepCompiler,
    bucket_for,
    compile_mode_for,
    compile_options,
    configure_cache,
)


def test_the_mode_follows_the_device_and_the_switch() -> None:
    assert compile_mode_for(torch.device("cpu")) == "inductor"
    assert compile_mode_for(torch.device("cuda", 0)) == "cudagraphs"  # selection only: no GPU needed
    assert compile_mode_for(torch.device("meta")) == "eager"
    assert compile_mode_for(torch.device("cpu"), enabled=False) == "eager"
    assert compile_mode_for(torch.device("cuda"), enabled=False) == "eager"
    assert StepCompiler(torch.device("cuda"), enabled=True).mode == "cudagraphs"
    assert compile_options("cudagraphs") == {"mode": "reduce-overhead"}  # CUDA graphs behind the same interface
    assert compile_options("inductor") == {}
    with pytest.raises(ValueError, match="positive"):
        StepCompiler(torch.device("cpu"), buckets=(0, 2))


def test_a_batch_runs_in_the_smallest_bucket_that_holds_it() -> None:
    assert [bucket_for(b, (1, 2, 4)) for b in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, None]
    assert bucket_for(1, ()) is None


def test_an_eager_step_is_the_function_itself() -> None:
    calls = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return x + 1

    step = StepCompiler(torch.device("cpu"), enabled=False).wrap("add", fn)
    assert torch.equal(step(torch.zeros(3, 2)), torch.ones(3, 2)) and calls == [3]


def test_the_cache_goes_where_it_is_told(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    d = configure_cache(tmp_path / "cc")
    assert d.is_dir() and str(d) == __import__("os").environ["TORCHINDUCTOR_CACHE_DIR"]


def _affine(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.tanh(torch.bmm(x[:, None], w)[:, 0]) * 2 + 1  # (B, K) x (B, K, N) -> (B, N)
    return y, y.sum(-1)


def test_padded_buckets_match_eager_and_a_recompile_while_serving_falls_back_to_eager() -> None:
    torch.manual_seed(0)
    w = torch.randn(8, 8)
    step = CompiledStep("affine", _affine, "inductor", (1, 4))
    x3 = torch.randn(3, 8)
    with torch.no_grad():
        step.compiling, step.enabled = True, {1, 4}
        y, s = step(x3, w.expand(3, 8, 8))  # batch 3 runs in bucket 4, padded with its last row
        step.compiling = False
        ey, es = _affine(x3, w.expand(3, 8, 8))
        assert y.shape == (3, 8) and s.shape == (3,)
        torch.testing.assert_close(y, ey, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s, es, rtol=1e-5, atol=1e-5)
        # a shape the graph was not built for, outside warm-up: no compile while serving, eager from now on
        x_wide = torch.randn(4, 16)
        out, _ = step(x_wide, torch.randn(16, 8).expand(4, 16, 8))
        assert out.shape == (4, 8) and 4 in step.failed and 4 not in step.enabled
        assert step._bucket(3) is None  # batch 3 now runs eager


@pytest.fixture(scope="module")
def fresh_model():  # type: ignore[no-untyped-def]
    """A TinyWorld of its own (the shared `model` fixture stays eager float32)."""
    from worldcast.models.tinyworld import TinyWorldModel

    return TinyWorldModel.from_pretrained()


@pytest.mark.slow
def test_compiled_tinyworld_chunks_equal_eager_chunks(fresh_model) -> None:  # type: ignore[no-untyped-def]
    """Compiled equals eager: the same sessions (seed, noise, actions) give the same frames, at batch 1 and at
    batch 3 run in bucket 4 (float32; bfloat16 is checked against float32 at every warm-up,
    `engine/tuning/warmup.py`)."""
    from worldcast.engine.tuning.warmup import ChunkRunner

    m = fresh_model
    compiler = StepCompiler(m.device, buckets=(1, 4))
    m.set_precision(torch.float32)
    assert set(m.compile_steps(compiler.wrap)) == {"denoise", "commit", "decode"}
    try:
        for batch in (1, 3):
            compiler.enable(())
            eager = ChunkRunner(m, batch=batch)
            want = [eager.chunk() for _ in range(3)]
            eager.close()
            compiled = ChunkRunner(m, batch=batch)
            with compiler.compiling((1, 4)):
                got = [compiled.chunk() for _ in range(3)]
            compiled.close()
            assert not compiler.failed, compiler.failed
            for a, b in zip(want, got, strict=True):
                for fa, fb in zip(a, b, strict=True):
                    assert np.abs(fa.astype(int) - fb.astype(int)).max() <= 1, f"batch {batch}: compiled differs"
    finally:
        m.compile_steps(None)


def test_the_steps_in_use_follow_the_precision_served(fresh_model) -> None:  # type: ignore[no-untyped-def]
    """After a warm-up measures float32, then bfloat16, then serves float32 again, the compiler's steps in use
    (what packages, digests and enabled buckets are looked up on) are the float32 wrappers the model runs,
    not the last ones made."""
    from worldcast.engine.tuning.warmup import use_way

    m = fresh_model
    compiler = StepCompiler(m.device, buckets=(1, 2))
    try:
        use_way(m, compiler, torch.float32, compiled=False)
        fp32 = dict(compiler.steps)
        use_way(m, compiler, torch.bfloat16, compiled=False)
        bf16 = dict(compiler.steps)
        assert all(bf16[n] is not fp32[n] for n in fp32)
        use_way(m, compiler, torch.float32, compiled=(2,))
        for name in ("denoise", "commit", "decode"):
            assert compiler.steps[name] is m._steps[name] is fp32[name]
        assert compiler.enabled_buckets() == (2,)
        assert all(s.enabled == {2} for s in compiler.steps.values())
    finally:
        m.compile_steps(None)
        m.set_precision(torch.float32)
