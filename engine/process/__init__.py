"""The engine process: one engine core (`DeviceWorker`) in a process of its own, and the server's side of it.

Server side: `client.py` (`EngineClient`, the `EngineHandle` of a process: crash detection, restart, moves)
starts each incarnation through `launch.py` (settings, restart policy, multiprocessing's spawn). Engine side:
`main.py` (`engine_main`, the process's whole life; the engine core itself, `engine/core.py`, is the same as in
the server's process). Between them: `messages.py` (what only a process says over its pipe, beside the engine
contract's commands and events, `engine/messages.py`) and `shm_frames.py` (frames through a ring in shared
memory).
"""
