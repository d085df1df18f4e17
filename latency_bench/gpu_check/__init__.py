"""The prepared device check: what to run first when a GPU is lent (`make gpu-check`; `make gpu-rehearsal` here).

    python -m worldcast.latency_bench.gpu_check --help

`runner.py` runs each part of `parts.py` in a process of its own within a time budget and writes the report;
`engine.py` times a model's served path chunk by chunk for the parts; `launch.py` is run as a plain file on a
Python without worldcast installed (the lent machine's image): it puts this checkout and the carried wheels on
the path, then runs the check. Nothing here imports the network edge.
"""
