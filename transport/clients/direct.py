"""`worldcast direct`: play timed directions against a server and write the film to an MP4 file.

    worldcast direct --url http://127.0.0.1:8000 --script directions.txt --out film.mp4
    printf '0 a green meadow\\n4 a snowy field\\n' | worldcast direct --script - --out film.mp4

A script holds one direction per line, either text, `AT_S PROMPT` (AT_S:
seconds from the start of the run; from stdin a line may omit it and is sent
when read), or JSON, `{"at_s": 0, "prompt": "...", "duration_s": 5}`. Blank
lines and lines starting with `#` are skipped. Each direction is sent at its
time over a directing session's stream (docs/streaming.md); one that arrives
during the previous segment cuts it. The run ends when the last direction's
segment has finished. The film is the stream's own fMP4, remuxed into a
regular MP4 (with `--fragmented`, kept as received); per segment the command
prints its time to first frame (direction sent -> its first frame received)
and whether it was cut.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import av
from tqdm import tqdm

from worldcast.transport.clients.stream import StreamClient
from worldcast.transport.schemas import MAX_PROMPT_CHARS, MAX_SEGMENT_S, check_prompt

#: Segment length of a direction that names none, s (the server's default).
DEFAULT_DURATION_S = 5.0


@dataclass(frozen=True)
class TimedDirection:
    """One line of a script.

    Attributes:
        at_s: when to send it, s from the start of the run (None: as soon as it is read).
        prompt: the direction's text.
        duration_s: its segment length, s (None: DEFAULT_DURATION_S).
        line: its line number in the script.
    """

    at_s: float | None
    prompt: str
    duration_s: float | None
    line: int


def parse_line(text: str, line: int, *, require_time: bool = True) -> TimedDirection | None:
    """Parse one script line (None: blank or a comment).

    Raises:
        ValueError: the line is not a direction (the message names the line and the problem).
    """
    s = text.strip()
    if not s or s.startswith("#"):
        return None
    at: float | None
    duration: float | None = None
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except ValueError as e:
            raise ValueError(f"line {line}: not valid JSON: {e}") from None
        except RecursionError:
            raise ValueError(f"line {line}: JSON nested too deeply") from None
        if not isinstance(obj, dict) or set(obj) - {"at_s", "prompt", "duration_s"}:
            raise ValueError(f"line {line}: expected {{\"at_s\", \"prompt\", \"duration_s\"?}}")
        at, prompt, duration = obj.get("at_s"), obj.get("prompt"), obj.get("duration_s")
        if not isinstance(prompt, str):
            raise ValueError(f"line {line}: prompt must be a string")
        for name, v in (("at_s", at), ("duration_s", duration)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise ValueError(f"line {line}: {name} must be a number")
    else:
        head, _, rest = s.partition(" ")
        try:
            at, prompt = float(head), rest.strip()
        except ValueError:
            at, prompt = None, s
    if at is None and require_time:
        raise ValueError(f"line {line}: expected 'AT_S PROMPT' (seconds, then the direction)")
    if at is not None and not (math.isfinite(at) and at >= 0):
        raise ValueError(f"line {line}: at_s must be a finite number >= 0")
    if duration is not None and not (math.isfinite(duration) and 0 < duration <= MAX_SEGMENT_S):
        raise ValueError(f"line {line}: duration_s must lie in (0, {MAX_SEGMENT_S:g}]")
    try:
        check_prompt(prompt)
    except ValueError as e:
        raise ValueError(f"line {line}: {e}") from None
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"line {line}: prompt has {len(prompt)} characters, over {MAX_PROMPT_CHARS}")
    return TimedDirection(None if at is None else float(at), prompt, None if duration is None else float(duration),
                          line)


def parse_script(lines: Iterable[str]) -> list[TimedDirection]:
    """Every direction of a script file, in time order.

    Raises:
        ValueError: a bad line, times going backwards, or no direction at all.
    """
    out = [d for i, t in enumerate(lines, 1) if (d := parse_line(t, i)) is not None]
    if not out:
        raise ValueError("the script has no directions")
    for a, b in zip(out, out[1:]):
        if b.at_s < a.at_s:  # type: ignore[operator]
            raise ValueError(f"line {b.line}: at_s {b.at_s:g} comes before line {a.line}'s {a.at_s:g}")
    return out


async def stdin_directions(stream: IO[str]) -> AsyncIterator[TimedDirection]:
    """Directions read from a text stream as they come (lines without a time are sent when read)."""
    loop = asyncio.get_running_loop()
    line = 0
    while True:
        text = await loop.run_in_executor(None, stream.readline)
        if not text:
            return
        line += 1
        d = parse_line(text, line, require_time=False)
        if d is not None:
            yield d


async def listed(items: list[TimedDirection]) -> AsyncIterator[TimedDirection]:
    for d in items:
        yield d


@dataclass
class SegmentReport:
    """What the run saw of one segment (times in ms)."""

    segment: int
    direction_id: str
    prompt: str
    sent_s: float
    ttff_ms: float | None = None  #: direction sent -> its first frame received
    frames: int = 0
    end: str | None = None  #: finished, cut or stopped

    def line(self) -> str:
        ttff = "no frame" if self.ttff_ms is None else f"TTFF {self.ttff_ms:6.0f} ms"
        return (f"segment {self.segment:3d} [{self.direction_id}] {ttff}, {self.frames:4d} frames, "
                f"{'CUT' if self.end == 'cut' else self.end}: {self.prompt[:48]!r}")


async def run_direct(url: str, directions: AsyncIterator[TimedDirection], *, out: Path, seed: int | None = None,
                     fragmented: bool = False, total_s: float | None = None, progress: bool = True,
                     echo: IO[str] = sys.stdout) -> list[SegmentReport]:
    """Play `directions` against the server at `url`; write the film to `out`.

    Args:
        total_s: the film's planned length, s, for the progress bar (None: unknown).

    Returns:
        one report per segment, in order.

    Raises:
        httpx.HTTPStatusError: the server refused the session.
        StreamError: the server refused a direction.
    """
    tmp = tempfile.NamedTemporaryFile(prefix="worldcast-film-", suffix=".mp4", delete=False)  # noqa: SIM115
    reports: dict[int, SegmentReport] = {}
    sent: dict[str, tuple[str, float]] = {}  #: direction id -> (prompt, sent at s)
    try:
        c = await StreamClient.connect(url, mode="directing", seed=seed, decode=False, record=tmp)
        fps = float(c.events[0]["fps"])
        bar = tqdm(total=None if total_s is None else round(total_s * fps), unit="frame", disable=not progress,
                   file=sys.stderr, desc="film")
        t0 = time.monotonic()
        last_segment: int | None = None

        def on_event(e: dict[str, Any]) -> bool:  # called for every event, in stream order: keeps the reports
            kind = e["event"]
            if kind == "direction_ack" and e.get("id") in sent:
                prompt, at = sent[e["id"]]
                reports[e["segment"]] = SegmentReport(e["segment"], e["id"], prompt, at)
            elif kind == "media" and e.get("segment") in reports:
                r = reports[e["segment"]]
                r.frames += 1
                if r.ttff_ms is None:
                    r.ttff_ms = (e["received_s"] - r.sent_s) * 1e3
                bar.update(1)
            elif kind == "segment_complete" and e["segment"] in reports:
                r = reports[e["segment"]]
                r.end = e["end"]
                bar.write(r.line(), file=echo)
            return False

        watcher = asyncio.ensure_future(c.wait_event(on_event, timeout_s=10**9))
        try:
            n = 0
            async for d in directions:
                if d.at_s is not None:
                    await asyncio.sleep(max(0.0, t0 + d.at_s - time.monotonic()))
                n += 1
                did = f"d{n}"
                sent[did] = (d.prompt, time.monotonic())
                _, fut, _ = await c.send_direction(d.prompt, duration_s=d.duration_s, direction_id=did)
                ack = await asyncio.wait_for(fut, 30)
                if ack["event"] == "error":
                    raise ValueError(f"line {d.line}: the server refused the direction: {ack['message']}")
                last_segment = ack["segment"]
            if last_segment is not None:
                await c.wait_event(lambda e: e["event"] == "segment_complete" and e["segment"] == last_segment,
                                   timeout_s=MAX_SEGMENT_S + 60, past=True)
        finally:
            watcher.cancel()
            bar.total = bar.n  # the film's actual length (cuts shorten it)
            bar.close()
            await c.aclose()
        tmp.close()
        write_film(Path(tmp.name), out, fragmented=fragmented)
    finally:
        tmp.close()
        Path(tmp.name).unlink(missing_ok=True)
    return [reports[k] for k in sorted(reports)]


def write_film(fmp4: Path, out: Path, *, fragmented: bool) -> None:
    """Write the recorded fMP4 stream to `out`: as is, or remuxed (no re-encode) into a regular MP4.

    Raises:
        ValueError: nothing was recorded (no frame arrived).
    """
    if fmp4.stat().st_size == 0:
        raise ValueError("no video arrived: nothing to write")
    out.parent.mkdir(parents=True, exist_ok=True)
    if fragmented:
        out.write_bytes(fmp4.read_bytes())
        return
    with av.open(str(fmp4)) as src, av.open(str(out), "w", format="mp4", options={"movflags": "faststart"}) as dst:
        ins = src.streams.video[0]
        outs = dst.add_stream_from_template(ins)
        for pkt in src.demux(ins):
            if pkt.dts is None:
                continue
            pkt.stream = outs
            dst.mux(pkt)


def plan_length_s(directions: list[TimedDirection]) -> float:
    """The film's planned length, s: the last direction's time plus its segment."""
    last = directions[-1]
    return float(last.at_s or 0.0) + (last.duration_s or DEFAULT_DURATION_S)
