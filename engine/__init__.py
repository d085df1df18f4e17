"""The engine: sessions' chunks on one device, by deadline, in batches, with every session's state in a pool.

At the top, the core:
- `device_worker.py` (`DeviceWorker`: the one thread that owns a device), driving `step_scheduler.py`
  (`StepScheduler`: which steps run next, EDF and batching) through `step_runner.py` (`StepRunner`: a plan
  carried out on the device, failures isolated per session); their contract is `step_output.py`.
- `rollout.py` (`ChunkRollout`: one session's chunks as staged transactions; the `Conditioner` a session
  answers), `state_pool.py` (`StatePool`: every session's declared state in fixed slots), `memory.py` (the
  pool's budget from the machine), `session_state.py` (a session's state as bytes, for moves).
- Scheduling policy: `cost_model.py` (measured step costs) and `admission.py` (whether a new session fits);
  `timing.py` (device time without syncing), `scripted.py` (a scripted conditioner), `errors.py` (every engine error).
- The engine contract: `messages.py` (what the server tells an engine core of its sessions and what the core
  answers), `core.py` (`EngineCore`: applies it to a device worker, the same in either kind of engine),
  `conditioner.py` (`SessionConditioner`: the one owner of a session's inputs); `engine_handle.py`
  (`EngineHandle`: what the server holds of an engine core, sending the contract) and `local_engine.py`
  (`LocalEngine`: the core on a thread of the server's process).

Beside it:
- `tuning/`: what warm-up measures and chooses (threads, precision, compiled steps, ahead-of-time packages).
- `process/`: an engine core in a process of its own (`EngineClient`, the engine process, what only a
  process says over its pipe, frames through shared memory).

Dependencies point down: `process/` imports the core and `tuning/`, never the reverse; nothing here imports
sessions, the network edge or the benchmarks (`latency_bench/`, where the engine's benchmarks and the device
check live).
"""
