"""How the engine fits the machine: what warm-up measures and chooses, and the compiled steps it may choose.

`warmup.py` runs the measurements (`DeviceWorker.warmup`): the intra-op thread count (`threads.py`), the
precision and eager or compiled steps gated by frame quality (`precision.py`), then each batch bucket's costs.
Compiled steps are `compiled.py` (`StepCompiler`: a graph per batch bucket) and its ahead-of-time packages
`packages.py` (frozen weights, AOTInductor), built once by `precompile.py` (`make precompile`).
"""
