"""`--transport fmp4`: the WebSocket stream (fMP4) measured side by side with WebRTC, on one server.

Three measurements, each read from the frame stamps in the decoded pixels
(sessions created with `stamp_frames`, transport/media/stamp.py):

- motion-to-photon over the WebSocket: `StreamProbe` is `SessionProbe` on a
  `StreamClient` (actions on the same socket; frames from fMP4 decoded with
  PyAV), so the metrics are computed exactly as for WebRTC (`probe.measure`);
- direction-to-first-frame: a directing session gets a new open-ended
  direction every `interval_s`, each cutting the segment playing; the latency
  is from sending the direction to the first decoded frame whose stamped index
  is past the cut segment's last frame (named by the ack), and the run counts
  frames of the old direction that arrived after the ack (there must be none);
- the WebRTC counterpart, prompt-change-to-first-frame: `set_prompt` then
  `flush` on the control channel; from sending `set_prompt` to the first
  decoded frame at or past the first frame index of the flush's epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from typing import Any

from worldcast.latency_bench import stats
from worldcast.latency_bench.probe import CLOSE_TIMEOUT_S, FrameRecord, SessionMetrics, SessionProbe, model_fps
from worldcast.transport.clients.stream import StreamClient
from worldcast.transport.media.stamp import cell_px_for_width, read_stamp

#: Directions cycled by the direction run (TinyWorld's themes).
PROMPTS = ("a snowy landscape", "rivers of glowing molten lava", "a green meadow", "a sandy desert at noon")


class _StreamView:
    """The face of a `StreamClient` that `SessionProbe.measure` reads (named as on `WebRTCClient`)."""

    def __init__(self, c: StreamClient) -> None:
        self.c = c

    @property
    def session_id(self) -> str:
        return self.c.session_id

    @property
    def answered_at(self) -> float:
        """When the stream opened (its stream_start arrived), s: TTFF counts from here."""
        return self.c.opened_s or float("nan")

    @property
    def frame_events(self) -> list[dict[str, Any]]:
        """The media events, with `received_at` as on the WebRTC control channel."""
        return [e | {"received_at": e["received_s"]} for e in list(self.c.events) if e["event"] == "media"]

    @property
    def seq(self) -> int:
        return self.c.seq

    @property
    def sent_at(self) -> dict[int, float]:
        return self.c.sent_at


class StreamProbe(SessionProbe):
    """A benchmark session over the WebSocket stream. Create with `open`."""

    def __init__(self, stream: StreamClient, *, stamped: bool) -> None:
        super().__init__(_StreamView(stream), stamped=stamped)  # type: ignore[arg-type]
        self.stream = stream

    @classmethod
    async def open(cls, url: str, *, seed: int, stamped: bool = True,  # type: ignore[override]
                   mode: str = "interactive") -> StreamProbe:
        """Create a session, open its stream and start reading frames.

        Raises:
            httpx.HTTPStatusError: creation refused.
        """
        c = await StreamClient.connect(url, seed=seed, stamp_frames=stamped, mode=mode)  # type: ignore[arg-type]
        p = cls(c, stamped=stamped)
        p._reader = asyncio.create_task(p._read(), name=f"stream-probe-{c.session_id}")
        return p

    async def _read(self) -> None:
        async for f in self.stream.frames():
            s = None
            if self.stamped:
                luma = f.luma
                s = read_stamp(luma, cell_px=cell_px_for_width(luma.shape[1]))
            self.frames.append(FrameRecord(f.decoded_s, f.pts, s.frame_index if s else None,
                                           s.action_seq if s else None))

    async def act_async(self) -> int:
        """Send the next action (cycling through the model's first declared keys) on the stream; returns its seq."""
        seq = await self.stream.send_action(keys=self._keys[(self.stream.seq + 1) % len(self._keys)])
        self.actions.append((seq, self.stream.sent_at[seq]))
        return seq

    async def act_for(self, seconds: float, action_hz: float) -> None:
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            await self.act_async()
            await asyncio.sleep(min(1.0 / action_hz, max(0.0, end - now)))

    async def close(self) -> None:
        self._closing = True
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.wait({self._reader}, timeout=2.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.stream.aclose(), CLOSE_TIMEOUT_S)


async def run_mtp(url: str, *, sessions: int, seconds: float, action_hz: float,
                  start_buffer_ms: float = 100.0) -> list[SessionMetrics]:
    """`mtp.run` over the WebSocket stream: N concurrent interactive sessions."""
    fps = await model_fps(url)

    async def one(seed: int) -> SessionMetrics:
        p = await StreamProbe.open(url, seed=seed)
        try:
            await p.first_frame(30.0)
            t0 = time.monotonic()
            await p.act_for(seconds, action_hz)
            await asyncio.sleep(0.5)  # let the last actions show up
            return p.measure([(t0, t0 + seconds)], frame_period_s=1.0 / fps, start_buffer_ms=start_buffer_ms)
        finally:
            await p.close()

    return list(await asyncio.gather(*(asyncio.wait_for(one(i), seconds + 90.0) for i in range(sessions))))


async def _first_frame_past(p: SessionProbe, index: int, after_s: float, timeout_s: float = 30.0) -> FrameRecord:
    """The first decoded frame arriving after `after_s` whose stamped index is > `index`."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while True:
        for f in p.frames[seen:]:
            if f.frame_index is not None and f.frame_index > index and f.arrival_s >= after_s:
                return f
        seen = len(p.frames)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no frame past index {index} within {timeout_s:g} s")
        await asyncio.sleep(0.002)


async def run_directions(url: str, *, count: int = 8, interval_s: float = 1.5, seed: int = 0) -> dict[str, Any]:
    """Direction-to-first-frame over the WebSocket: `count` directions, each cutting the segment playing."""
    p = await StreamProbe.open(url, seed=seed, mode="directing")
    try:
        await p.stream.direct(PROMPTS[-1], open_ended=True)
        await p.first_frame(30.0)
        lat, from_ack, old_after_ack = [], [], 0
        for i in range(count):
            await asyncio.sleep(interval_s)
            _, fut, sent = await p.stream.send_direction(PROMPTS[i % len(PROMPTS)], open_ended=True)
            ack = await asyncio.wait_for(fut, 10)
            cut = ack.get("cut") or {}
            last = cut.get("last_frame_index")
            if last is None:
                last = max((f.frame_index for f in p.frames if f.frame_index is not None), default=-1)
            f = await _first_frame_past(p, last, sent)
            lat.append((f.arrival_s - sent) * 1e3)
            from_ack.append((f.arrival_s - ack["received_s"]) * 1e3)
            old_after_ack += sum(1 for g in p.frames if g.arrival_s > ack["received_s"] and g.frame_index is not None
                                 and g.frame_index <= last)
        encode = [e["encode_ms"] for e in p.client.frame_events if "encode_ms" in e]
        return {"direction_to_first_frame_ms": stats.percentiles(lat), "ack_to_first_frame_ms":
                stats.percentiles(from_ack), "directions": count, "old_frames_after_ack": old_after_ack,
                "encode_ms_p50": statistics.median(encode) if encode else float("nan"), "samples_ms": lat}
    finally:
        await p.close()


async def run_prompt_changes(url: str, *, count: int = 8, interval_s: float = 1.5, seed: int = 0) -> dict[str, Any]:
    """The WebRTC counterpart: set_prompt + flush on the control channel, to the first frame of the new epoch."""
    p = await SessionProbe.open(url, seed=seed, stamped=True)
    try:
        await p.first_frame(30.0)
        lat, from_ack = [], []
        for i in range(count):
            await asyncio.sleep(interval_s)
            sent = time.monotonic()
            await p.client.rpc("set_prompt", {"prompt": PROMPTS[i % len(PROMPTS)]})
            epoch = (await p.client.rpc("flush"))["epoch"]
            acked = time.monotonic()
            deadline = time.monotonic() + 30
            while not (evs := [e for e in list(p.client.frame_events) if e["epoch"] >= epoch]):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no frame of epoch {epoch} within 30 s")
                await asyncio.sleep(0.002)
            f = await _first_frame_past(p, evs[0]["frame_index"] - 1, sent)
            lat.append((f.arrival_s - sent) * 1e3)
            from_ack.append((f.arrival_s - acked) * 1e3)
        return {"direction_to_first_frame_ms": stats.percentiles(lat), "ack_to_first_frame_ms":
                stats.percentiles(from_ack), "directions": count, "samples_ms": lat}
    finally:
        await p.close()


def side_by_side(url: str, *, profile: str, sessions: int, seconds: float, action_hz: float,
                 directions: int = 8) -> list[dict[str, Any]]:
    """The runs of `mtp --transport fmp4` against `url`: MTP over WebRTC and the WebSocket, then the
    direction runs over both; one report dict each (`kind` mtp or direction)."""
    from worldcast.latency_bench import mtp as mtp_mod

    out: list[dict[str, Any]] = []
    for transport, fn in (("webrtc", mtp_mod.run), ("fmp4", run_mtp)):
        res = asyncio.run(fn(url, sessions=sessions, seconds=seconds, action_hz=action_hz))  # type: ignore[operator]
        out.append({"kind": "mtp", "profile": profile, "transport": transport, "summary": mtp_mod.report(res),
                    "samples_ms": [x for r in res for x in r.mtp_ms]})
    for transport, dfn in (("webrtc", run_prompt_changes), ("fmp4", run_directions)):
        d = asyncio.run(dfn(url, count=directions))
        samples = d.pop("samples_ms")
        out.append({"kind": "direction", "profile": profile, "transport": transport, "summary": d,
                    "samples_ms": samples})
    return out
