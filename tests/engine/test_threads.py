"""Thread-count choice by measurement (engine/tuning/threads.py), with a chunk timer scripted per count."""

from __future__ import annotations

import pytest
import torch

from worldcast.engine.tuning.threads import candidate_threads, choose_threads, eligible_threads


@pytest.fixture(autouse=True)
def _restore_threads():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _timer(seconds_by_threads: dict[int, float], calls: list[int]):  # type: ignore[no-untyped-def]
    def time_chunk() -> float:
        n = torch.get_num_threads()
        calls.append(n)
        return seconds_by_threads[n]
    return time_chunk


def test_the_fastest_eligible_count_is_kept_and_left_set() -> None:
    calls: list[int] = []
    choice = choose_threads(_timer({1: 0.030, 2: 0.012, 3: 0.020, 4: 0.025}, calls), cores=4, reserved_cores=1,
                            repeats=3)
    assert choice.threads == 2
    assert torch.get_num_threads() == 2
    assert choice.chunk_s == {1: 0.030, 2: 0.012, 3: 0.020, 4: 0.025}
    # one untimed chunk per count, then `repeats` interleaved rounds
    assert calls == [1, 2, 3, 4] + [1, 2, 3, 4] * 3


def test_a_count_that_leaves_no_core_for_the_transport_is_timed_but_never_chosen() -> None:
    choice = choose_threads(_timer({1: 0.030, 2: 0.010}, []), cores=2, reserved_cores=1)
    assert choice.threads == 1, "2 threads on 2 cores would leave the event loop and encoders nothing"
    assert set(choice.chunk_s) == {1, 2}
    assert "2: 10.0 ms" in choice.describe()


def test_one_slow_outlier_does_not_decide() -> None:
    seq = iter([0.01, 0.02,  # untimed
                0.010, 0.020, 0.900, 0.020, 0.010, 0.020])  # 1 thread has one 900 ms hiccup
    choice = choose_threads(lambda: next(seq), cores=2, reserved_cores=0, repeats=3)
    assert choice.threads == 1  # median, not mean


def test_candidates_and_eligibility() -> None:
    assert candidate_threads(2) == [1, 2]
    assert candidate_threads(64)[:4] == [1, 2, 3, 4] and candidate_threads(64)[-1] == 64
    assert len(candidate_threads(64)) <= 8
    assert eligible_threads(2, 1) == 1 and eligible_threads(1, 1) == 1 and eligible_threads(16, 2) == 14
