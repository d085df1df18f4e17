"""`worldcast direct`: script parsing, and a real run against a server that writes a playable film."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import av
import pytest

from worldcast.transport.clients.direct import parse_line, parse_script, plan_length_s

pytestmark = pytest.mark.timeout(240)


def test_scripts_take_text_and_json_lines() -> None:
    got = parse_script(["# a comment", "", "0 a green meadow", '{"at_s": 2.5, "prompt": "snow", "duration_s": 1}',
                        "4.0   rivers of lava  "])
    assert [(d.at_s, d.prompt, d.duration_s, d.line) for d in got] == [
        (0.0, "a green meadow", None, 3), (2.5, "snow", 1.0, 4), (4.0, "rivers of lava", None, 5)]
    assert plan_length_s(got) == 9.0
    assert parse_line("a prompt read from stdin", 1, require_time=False).at_s is None  # type: ignore[union-attr]


@pytest.mark.parametrize("lines,needle", [
    (["a prompt without a time"], "line 1: expected 'AT_S PROMPT'"),
    (["0 a", "-1 b"], "line 2: at_s"),
    (["2 a", "1 b"], "line 2: at_s 1 comes before line 1"),
    (['{"at_s": 0, "prompt": "a", "duration_s": 0}'], "duration_s"),
    (['{"at_s": 0, "prompt": 3}'], "prompt must be a string"),
    (['{"at_s": 0, "prompt": "a", "colour": 1}'], "line 1: expected"),
    (["{broken"], "not valid JSON"),
    (["0 " + "x" * 501], "501 characters"),
    (["0 bad\u0007bell"], "control character"),
    (["# only comments"], "no directions"),
])
def test_bad_scripts_name_the_line(lines, needle) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=needle):
        parse_script(lines)


def run_cli(args: list[str], *, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "worldcast.transport.cli", "direct", *args], input=stdin,
                          capture_output=True, text=True, timeout=180, env=env)


def test_direct_plays_a_script_cuts_where_asked_and_writes_a_playable_film(live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "directions.txt"
    script.write_text('{"at_s": 0, "prompt": "a green meadow", "duration_s": 20}\n'
                      '{"at_s": 1.0, "prompt": "rivers of glowing molten lava", "duration_s": 0.5}\n')
    film = tmp_path / "film.mp4"
    r = run_cli(["--url", live_server.url, "--script", str(script), "--out", str(film), "--seed", "3"])
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("segment")]
    assert len(lines) == 2, r.stdout
    assert "segment   0 [d1] TTFF" in lines[0] and "CUT" in lines[0]
    assert "segment   1 [d2] TTFF" in lines[1] and "finished" in lines[1] and "  10 frames" in lines[1]
    total = int(r.stdout.split("film: ")[1].split("(")[1].split(" frames")[0])
    assert "film" in r.stderr, "a progress bar on stderr"
    with av.open(str(film)) as c:
        st = c.streams.video[0]
        frames = list(c.decode(st))
        assert st.duration is not None and st.duration > 0, "a regular MP4 with a duration"
    assert len(frames) == total and all(b.pts > a.pts for a, b in zip(frames, frames[1:]))


def test_direct_reads_directions_from_stdin(live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    film = tmp_path / "film.mp4"
    r = run_cli(["--url", live_server.url, "--out", str(film), "--no-progress", "--fragmented"],
                stdin='{"prompt": "a snowy landscape", "duration_s": 0.3}\n')
    assert r.returncode == 0, r.stderr
    assert "segment   0 [d1] TTFF" in r.stdout and "finished" in r.stdout and "   6 frames" in r.stdout
    with av.open(str(film)) as c:
        assert len(list(c.decode(video=0))) == 6


def test_direct_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("soon a prompt\n")
    r = run_cli(["--script", str(bad), "--out", str(tmp_path / "x.mp4")])
    assert r.returncode != 0 and r.stderr.strip() == "worldcast direct: line 1: expected 'AT_S PROMPT' (seconds, " \
        "then the direction)"
    r = run_cli(["--url", "http://127.0.0.1:9", "--script", "-", "--out", str(tmp_path / "x.mp4")], stdin="0 a\n")
    assert r.returncode != 0 and r.stderr.startswith("worldcast direct: http://127.0.0.1:9") and \
        len(r.stderr.strip().splitlines()) == 1
