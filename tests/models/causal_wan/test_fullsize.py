"""`make fullsize-check`'s steps at the tiny config: every layout written, covered key by key, loaded through
the factory (EMA, LoRA, presets by file name), one chunk run; the last line is the report (JSON)."""

from __future__ import annotations

import json

import pytest

from worldcast.models.causal_wan.fullsize import main


@pytest.mark.slow  # about 30 s on the 2-core VM
def test_every_layout_is_written_covered_loaded_and_run(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    report = main(["--tiny", "--tmp", str(tmp_path)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == report
    assert len(report["formats"]) >= 5 and report["ok"] is True
    assert all(v is True for k, v in report["checks"].items() if isinstance(v, bool))
    assert report["keys_checked"]["self-forcing .pt (generator + generator_ema) generator_ema"] == \
        report["keys_checked"]["diffusers transformer"]
    assert report["chunk_ms"] > 0 and report["checks"]["chunk frames"] == [1, 9, 64, 64, 3]
    ll, sf = report["state_bytes_per_session"]["longlive"], report["state_bytes_per_session"]["self-forcing"]
    assert ll["total"] == sum(v for k, v in ll.items() if k != "total")
    assert sf["AttentionRingSpec"] == 2 * ll["AttentionRingSpec"]  # 18 recent frames against 3 sinks + 6 recent
    assert list(tmp_path.iterdir()) == [], "the generated checkpoints are removed"
