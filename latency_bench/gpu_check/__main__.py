"""`python -m worldcast.latency_bench.gpu_check`: the device check's command line (`runner.py`)."""

from worldcast.latency_bench.gpu_check.runner import main

raise SystemExit(main())
