import subprocess
import sys

import pytest

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
