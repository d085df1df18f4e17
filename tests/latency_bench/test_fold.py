"""The commit fold (`models/tinyworld/fold.py`): one forward equals the commit pass plus the first step."""

from __future__ import annotations

import pytest
import torch

from worldcast.latency_bench.fold import CHECK_TOLERANCE, FoldCase, check, main, make_case


@pytest.fixture
def case(model):  # type: ignore[no-untyped-def]
    c = make_case(model, batch=2, warm_chunks=6)  # the ring is full: the window rule drops a frame
    yield c
    c.runner.close()


def test_the_folded_forward_is_the_commit_pass_and_the_first_step(case: FoldCase) -> None:
    dx0, dkv = check(case)
    assert dx0 < CHECK_TOLERANCE and dkv < CHECK_TOLERANCE
    assert case.ref_x0.abs().max() > 0.1 and case.ref_k.abs().max() > 0.1  # real values, not zeros


@pytest.mark.parametrize("how", ["new frame blind to the committed one", "committed frame sees the new one",
                                 "new frame sees the ring by the committed frame's window"])
def test_the_check_fails_for_a_fold_that_gets_the_mask_wrong(case: FoldCase, how: str) -> None:
    T = case.runner.model.cfg.tokens_per_frame
    L = case.k_ring.shape[2]
    good = case.mask
    bad = good.clone()
    if how == "new frame blind to the committed one":
        bad[:, :, T:, L:L + T] = float("-inf")
    elif how == "committed frame sees the new one":
        bad[:, :, :T, L + T:] = 0.0
    else:
        bad[:, :, T:, :L] = good[:, :, :T, :L]
    assert not torch.equal(bad, good)
    case.mask = bad
    dx0, dkv = check(case)
    assert max(dx0, dkv) > 2 * CHECK_TOLERANCE, "the bench's check would call this fold correct"


def test_the_bench_prints_both_ways_and_writes_json(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    main(["--batches", "1", "--repeats", "2", "--json", str(tmp_path / "fold.json")])
    line = capsys.readouterr().out
    assert "batch 1 (float32): check max |dx0|" in line and "within 0.0001" in line and "folded step" in line
    import json

    (r,) = json.loads((tmp_path / "fold.json").read_text())["results"]
    assert r["batch"] == 1 and r["max_abs_x0"] < 1e-4 and r["folded_ms"] > 0 and r["unfolded_ms"] > 0
