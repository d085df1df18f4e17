"""What warm-up measured is exported at /metrics: every dtype's chunk time and quality, buckets, phases."""

from __future__ import annotations

import math

from worldcast.engine.tuning.precision import Trial, choose
from worldcast.engine.tuning.warmup import BucketTiming, WarmupReport
from worldcast.transport.http.metrics import _warmup_metrics


def test_every_measured_way_and_bucket_is_a_sample() -> None:
    choice = choose([Trial("float32", 0.026, 0.020), Trial("bfloat16", 0.022, 0.012, 41.5, 40.2)], min_psnr_db=30.0)
    report = WarmupReport(precision=choice, compile_mode="inductor",
                          buckets=(BucketTiming(1, 0.022, 0.012, True), BucketTiming(2, 0.035, 0.036, False)),
                          phases_s={"threads": 1.0, "precision": 20.0, "total": 30.0})
    fams = {f.name: f for f in _warmup_metrics(report)}
    served = [(s.labels, s.value) for s in fams["worldcast_device_precision"].samples]
    assert served == [({"dtype": "bfloat16", "mode": "inductor"}, 1.0)]
    samples = fams["worldcast_device_precision_chunk_seconds"].samples
    chunk = {(s.labels["dtype"], s.labels["mode"]): s.value for s in samples}
    assert chunk == {("float32", "eager"): 0.026, ("float32", "compiled"): 0.020, ("bfloat16", "eager"): 0.022,
                     ("bfloat16", "compiled"): 0.012}
    psnr = {(s.labels["dtype"], s.labels["mode"]): s.value for s in fams["worldcast_device_precision_psnr_db"].samples}
    assert psnr[("bfloat16", "compiled")] == 40.2 and math.isinf(psnr[("float32", "eager")])
    compiled = {s.labels["batch"]: s.value for s in fams["worldcast_device_compiled_bucket"].samples}
    assert compiled == {"1": 1.0, "2": 0.0}
    assert {s.labels["phase"] for s in fams["worldcast_warmup_seconds"].samples} == {"threads", "precision", "total"}
    assert report.compiled_buckets == (1,) and "bfloat16" in report.describe()
