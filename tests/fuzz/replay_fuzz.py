"""Fuzz `worldcast replay` with mutations of a real recorded log (issue: replay trusts nothing in a log).

Each case copies a recording's folder (made by a real server: `record_log`), mutates its `events.jsonl` the way
a hostile sender of logs would (`log_mutations`: one field of one line set to any JSON value, a path, a huge or
non-finite number; a line cut, dropped, duplicated or moved; raw text spliced in; a file of the folder swapped
for a link out of it) and replays it on the shipped model. A case passes when replay either reports or refuses
with `RecordingError`; anything else raised is a crash, and so is any file opened outside the case's folder
(`OpenWatch`, an audit hook on `open`). The process's peak RSS before and after is reported, not judged.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.harness import SurfaceResult, _quiet_random, _settings
from tests.fuzz.strategies import json_values

#: Values a hostile log puts where a number, a name or a hash belongs.
HOSTILE = st.sampled_from([
    "/etc/passwd", "../../outside.png", "..", "images/../../x", "\x00", "a" * 70, "f" * 64, 1e308, -1e308,
    2**64, -(2**63) - 1, 10**400, 0, -1, 1.5, True, None, [], {}, [[1e308] * 8], [[2.0] * 8], [["1"] * 8],
    "NaN",
])
#: Raw text spliced into a line (JSON's non-standard constants, deep nesting, a huge number, junk).
SPLICES = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "[" * 5000 + "]" * 5000, "9" * 5000, "\ufffd",
                           '{"type":"chunk"}', "\n", "\\u0000", '"'])


@st.composite
def log_mutations(draw: st.DrawFn, lines: list[str]) -> tuple[list[str], str | None]:
    """A mutated copy of `lines` (a log's lines, each ending in a newline), and which folder file, if any, to
    replace with a link out of the folder ("images", "snapshot", "video", "takes")."""
    out = list(lines)
    how = draw(st.sampled_from(["field", "field", "field", "nested", "drop", "duplicate", "move", "truncate",
                                "splice", "link", "long"]))
    i = draw(st.integers(0, len(out) - 1))
    if how in ("field", "nested"):
        obj = json.loads(out[i])
        keys = sorted(obj)
        key = draw(st.sampled_from([*keys, "extra"]))
        value = draw(HOSTILE | json_values)
        if how == "nested" and isinstance(obj.get(key), list) and obj[key]:
            row = obj[key][draw(st.integers(0, len(obj[key]) - 1))]
            if isinstance(row, list) and row:
                row[draw(st.integers(0, len(row) - 1))] = value
            else:
                obj[key][0] = value
        elif how == "nested" and isinstance(obj.get(key), dict) and obj[key]:
            sub = sorted(obj[key])
            obj[key][draw(st.sampled_from(sub))] = value
        else:
            obj[key] = value
        out[i] = json.dumps(obj, allow_nan=True) + "\n"
    elif how == "drop" and len(out) > 1:
        del out[i]
    elif how == "duplicate":
        out.insert(i, out[i])
    elif how == "move":
        j = draw(st.integers(0, len(out) - 1))
        out.insert(j, out.pop(i))
    elif how == "truncate":
        text = "".join(out)
        cut = draw(st.integers(0, len(text)))
        return [text[:cut]], None
    elif how == "splice":
        at = draw(st.integers(0, len(out[i]) - 1))
        out[i] = out[i][:at] + draw(SPLICES) + out[i][at:]
    elif how == "long":
        out[i] = out[i][:-2] + ',"pad":"' + "x" * (1 << 21) + '"}\n'
    elif how == "link":
        return out, draw(st.sampled_from(["images", "snapshot", "video", "takes"]))
    return out, None


class OpenWatch:
    """Every file `open`ed (Python's `open` audit event) while watching, outside the allowed folders.

    Allowed: the case's folder; Python's installation and this repository's source (lazy imports); what the
    program reads of its own at a model's load (/proc and /sys: memory and mounts; worldcast's cache folder under
    $XDG_CACHE_HOME: the prompt-embedding cache). Audit hooks cannot be removed, so one is installed per process
    and switched by `watching`.
    """

    _installed: OpenWatch | None = None

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.outside: list[str] = []
        self._thread = 0
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "worldcast"
        roots = {sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[2]), "/proc", "/sys", str(cache)}
        self.roots = tuple(os.path.realpath(r) + os.sep for r in roots)

    @classmethod
    def get(cls) -> OpenWatch:
        if cls._installed is None:
            cls._installed = cls()
            sys.addaudithook(cls._installed._hook)
        return cls._installed

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or self.folder is None or threading.get_ident() != self._thread:
            return
        path = args[0]
        if isinstance(path, int) or path is None:
            return
        p = os.path.realpath(os.fsdecode(path))
        if p.startswith(str(self.folder) + os.sep) or p == str(self.folder) or p.startswith(self.roots):
            return
        self.outside.append(p)

    @contextmanager
    def watching(self, folder: Path) -> Iterator[list[str]]:
        self.folder, self.outside, self._thread = Path(os.path.realpath(folder)), [], threading.get_ident()
        try:
            yield self.outside
        finally:
            self.folder = None


def _link_out(folder: Path, which: str, target: Path) -> None:
    """Replace the folder's `which` file with a symbolic link to `target` (outside the folder)."""
    if which == "images" or which == "takes":
        d = folder / which
        names = sorted(d.iterdir()) if d.is_dir() else []
        if not names:
            header = json.loads((folder / "events.jsonl").read_text().splitlines()[0])
            d.mkdir(exist_ok=True)
            digest = header.get("image_sha256") or "0" * 64
            names = [d / (f"{digest}.png" if which == "images" else f"{'0' * 64}.bin")]
        for n in names:
            n.unlink(missing_ok=True)
            n.symlink_to(target)
    else:
        f = folder / ("snapshot.bin" if which == "snapshot" else "video.mp4")
        f.unlink(missing_ok=True)
        f.symlink_to(target)


def fuzz_replay(recording: Path, model: Any, cases: int, seed: int = 0) -> SurfaceResult:
    """Replay `cases` mutations of the recording in folder `recording` on `model`; see the module docstring."""
    from worldcast.sessions.recording import RecordingError
    from worldcast.sessions.replay import replay

    res, t0 = SurfaceResult("replay", "pure"), time.monotonic()
    lines = (recording / "events.jsonl").read_text().splitlines(keepends=True)
    watch = OpenWatch.get()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory(prefix="replay-fuzz-") as tmp:
        outside = Path(tmp) / "outside.png"
        outside.write_bytes(b"\x89PNG not one")
        n = 0

        @_settings(cases, seed)
        @given(m=log_mutations(lines))
        def case(m: tuple[list[str], str | None]) -> None:
            nonlocal n
            n += 1
            folder = Path(tmp) / f"case{n}"
            shutil.copytree(recording, folder)
            try:
                mutated, link = m
                (folder / "events.jsonl").write_text("".join(mutated), encoding="utf-8", errors="surrogatepass")
                if link is not None:
                    _link_out(folder, link, outside)
                res.cases += 1
                with watch.watching(folder) as opened:
                    try:
                        report = replay(folder / "events.jsonl", model=model)
                        res.outcomes["exact" if report.exact else "reported"] += 1
                    except RecordingError as e:
                        res.outcomes["refused: " + _kind(str(e))] += 1
                    except Exception as e:  # noqa: BLE001 - a crash: what the fuzz looks for
                        res.crash(f"{type(e).__name__}: {e}\n{''.join(traceback.format_exc(limit=-4))}")
                if opened:
                    res.crash(f"opened outside the log's folder: {opened[:3]}")
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        _quiet_random(case)()
    res.seconds = time.monotonic() - t0
    res.watcher = {"peak_rss_mib_before": rss0 / 1024,
                   "peak_rss_mib_after": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    return res


def _kind(message: str) -> str:
    """A refusal's reason without its line number and values, to count refusals by kind."""
    text = message.split(": ", 1)[-1] if message.startswith("events.jsonl line") else message
    return " ".join(w for w in text.split()[:5] if not any(c.isdigit() for c in w))[:60]


async def _drive(url: str) -> str:
    """A short recorded session: a key, a gamepad axis, a prompt, a flush; returns its id (closed)."""
    import httpx

    from worldcast.transport.clients.stream import StreamClient

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"record": True, "seed": 5, "prompt": "a green meadow"})
        assert r.status_code == 201, r.text
        sid, token = r.json()["session_id"], r.json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        c = await StreamClient.attach(url, sid, token, model=r.json()["model"])
        try:
            for i in range(4):
                await c.send_action(keys=["d"], axes={"look_x": 0.5} if i % 2 else None)
                await c.next_frame()
            await c.rpc("set_prompt", {"prompt": "molten lava"})
            await c.rpc("flush")
            for _ in range(3):
                await c.send_action(keys=["w", "shift"])
                await c.next_frame()
        finally:
            await c.aclose(delete=False)
        assert (await http.delete(f"/v1/sessions/{sid}", headers=auth)).status_code == 204
        return sid


def record_log(model: Any, into: Path) -> Path:
    """Record one short session through a real server on loopback; returns its folder (a copy in `into`)."""
    from tests.conftest import _serve, server_config

    cfg = server_config()
    serving = _serve(cfg, model)
    server = next(serving)
    try:
        sid = asyncio.run(_drive(server.url))
    finally:
        serving.close()
    assert cfg.recordings is not None
    keep = into / sid
    shutil.copytree(cfg.recordings.directory / sid, keep)
    return keep
