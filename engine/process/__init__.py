"""The engine process: one engine core (`DeviceWorker`) in a process of its own, and the server's side of it.

Server side: `client.py` (`EngineClient`, the `EngineHandle` of a process: crash detection, restart, moves)
starts each incarnation through `launch.py` (settings, restart policy, multiprocessing's spawn). Engine side:
`main.py` (`engine_main`, the process's whole life) and `conditioner.py` (`MirrorConditioner`, its copy of each
session's inputs). Between them: `messages.py` (the pipe's commands and events) and `shm_frames.py` (frames
through a ring in shared memory).
"""
