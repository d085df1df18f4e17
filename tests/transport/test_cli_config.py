import os
import subprocess
import sys

import pytest

from worldcast.sessions.viewers import spectator_cap
from worldcast.transport.cli import build_parser
from worldcast.transport.config import ServerConfig


def test_serve_arguments() -> None:
    a = build_parser().parse_args(["serve", "--host", "0.0.0.0", "--port", "9000", "--ice-host", "10.1.2.3"])
    assert (a.host, a.port, a.ice_host) == ("0.0.0.0", 9000, ["10.1.2.3"])


def test_console_script_help_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "worldcast.transport.cli", "serve", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--ice-host" in out.stdout


@pytest.mark.parametrize("host,expected", [("127.0.0.1", ["127.0.0.1"]), ("::1", ["::1"]),
                                           ("localhost", ["127.0.0.1"]), ("0.0.0.0", None)])
def test_ice_is_pinned_to_loopback_binds(host: str, expected) -> None:  # type: ignore[no-untyped-def]
    assert ServerConfig.default_ice_hosts(host) == expected


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        ServerConfig(port=0)
    with pytest.raises(ValueError):
        ServerConfig(video_scale=0)


def test_memory_flags_and_the_old_budget_name() -> None:
    from worldcast.transport.cli import state_budget_bytes

    a = build_parser().parse_args(["serve", "--memory-fraction", "0.6", "--state-budget-mib", "512"])
    assert (a.memory_fraction, state_budget_bytes(a)) == (0.6, 512 * 2**20)
    old = build_parser().parse_args(["serve", "--kv-budget-mib", "256"])
    assert state_budget_bytes(old) == 256 * 2**20  # still works (and warns that it is the old name)
    assert state_budget_bytes(build_parser().parse_args(["serve"])) is None  # sized from the device's memory
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    for flag in ("--memory-fraction", "--state-budget-mib", "--ema", "--no-ema", "--lora", "--wan-preset", "--check"):
        assert flag in help_text


def test_serve_check_prints_the_memory_plan_and_refuses_a_device_too_small(capsys) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "causal-wan:tiny", "--check", "--log-level", "error"])
    out = capsys.readouterr().out
    assert e.value.code == 0, out
    assert "state pool:" in out and "per session" in out and "AttentionRingSpec" in out and "VAE decode:" in out
    assert "sessions that fit:" in out
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "causal-wan:tiny", "--check", "--state-budget-mib", "1", "--log-level", "error"])
    out = capsys.readouterr().out
    assert e.value.code == 2 and "cannot hold one session" in out and "--state-budget-mib" in out
def test_engine_flags_become_the_engine_layout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.cli import _server_config

    a = build_parser().parse_args(["serve", "--engines", "3", "--admin-token", "t" * 20, "--restart-backoff", "2"])
    cfg = _server_config(a, None, None)
    assert cfg.engine_devices == ["cpu"] * 3 and cfg.isolated and cfg.admin_token == "t" * 20
    assert cfg.restart.initial_backoff_s == 2.0
    a = build_parser().parse_args(["serve", "--devices", "cuda:0, cuda:1"])
    cfg = _server_config(a, None, None)
    assert cfg.engine_devices == ["cuda:0", "cuda:1"] and cfg.isolated
    one = _server_config(build_parser().parse_args(["serve"]), None, None)
    assert one.engine_devices == ["cpu"] and one.isolated  # a CPU engine runs in its own process (engine_processes)
    kept = _server_config(build_parser().parse_args(["serve", "--no-engine-process"]), None, None)
    assert kept.engine_devices == ["cpu"] and not kept.isolated
    gpu = _server_config(build_parser().parse_args(["serve", "--device", "cuda:0"]), None, None)
    assert gpu.engine_devices == ["cuda:0"] and not gpu.isolated  # one accelerator engine stays in the server
    forced = _server_config(build_parser().parse_args(["serve", "--engine-process"]), None, None)
    assert forced.isolated and forced.engine_devices == ["cpu"]


def test_spectator_flags_become_the_viewer_config() -> None:
    from worldcast.transport.cli import _server_config

    cfg = _server_config(build_parser().parse_args(["serve", "--max-spectators", "5", "--max-spectators-per-session",
                                                    "2", "--viewer-ttl", "60"]), None, None)
    assert (cfg.viewers.max_spectators, cfg.viewers.max_spectators_per_session, cfg.viewers.default_ttl_s) == (5, 2, 60)
    default = _server_config(build_parser().parse_args(["serve"]), None, None).viewers
    assert default.max_spectators is None, "derived from the measured cost"
    assert default.server_cap == spectator_cap(os.cpu_count() or 1)


@pytest.mark.parametrize("argv,message", [
    (["--viewer-ttl", "1"], "default_ttl_s"),
    (["--engines", "0"], "--engines must be >= 1"),
    (["--devices", "cuda:0,cuda:1", "--engines", "3"], "disagrees"),
    (["--restart-backoff", "0"], "--restart-backoff must be positive"),
    (["--admin-token", "short"], "admin_token must be at least 16"),
    (["--devices", ","], "give one or more devices"),
])
def test_bad_engine_flags_are_one_error_line(argv: list[str], message: str) -> None:
    out = subprocess.run([sys.executable, "-m", "worldcast.transport.cli", "serve", *argv],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_engine_config_validation() -> None:
    with pytest.raises(ValueError, match="engines must be >= 1"):
        ServerConfig(engines=0)
    with pytest.raises(ValueError, match="distinct"):
        ServerConfig(devices=("cuda:0", "cuda:0"))
