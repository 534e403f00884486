"""Settings from defaults, the environment and the command line; the launcher's commands."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmserve.facade import launch
from vlmserve.facade.cli import settings_from_args
from vlmserve.facade.settings import FacadeSettings


def test_defaults_are_loopback_and_safe() -> None:
    settings = FacadeSettings.from_env({})
    assert (settings.host, settings.port, settings.engine_address) == ("127.0.0.1", 8000, "127.0.0.1:50051")
    assert settings.store_path.name == "facade.sqlite3"
    assert settings.timeouts.generate > 0 and settings.limits.max_request_bytes > 0


def test_environment_overrides_defaults() -> None:
    settings = FacadeSettings.from_env(
        {
            "VLMSERVE_FACADE_PORT": "9000",
            "VLMSERVE_FACADE_ENGINE_ADDRESS": "unix:/tmp/engine.sock",
            "VLMSERVE_FACADE_MAX_OUTPUT_TOKENS": "256",
            "VLMSERVE_FACADE_GENERATE_TIMEOUT_S": "30",
        }
    )
    assert settings.port == 9000 and settings.engine_address == "unix:/tmp/engine.sock"
    assert settings.limits.max_output_tokens == 256 and settings.timeouts.generate == 30.0


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="VLMSERVE_FACADE_PORT"):
        FacadeSettings.from_env({"VLMSERVE_FACADE_PORT": "eighty"})


def test_command_line_overrides_environment(tmp_path: Path) -> None:
    settings = settings_from_args(
        ["--engine-address", "127.0.0.1:6000", "--port", "8100", "--store-path", str(tmp_path / "s.db")],
        {"VLMSERVE_FACADE_PORT": "9000", "VLMSERVE_FACADE_HOST": "127.0.0.2"},
    )
    assert settings.port == 8100 and settings.host == "127.0.0.2"
    assert settings.engine_address == "127.0.0.1:6000" and settings.store_path == tmp_path / "s.db"


def test_launcher_commands() -> None:
    args = launch.build_parser().parse_args(
        [
            "--engine-address",
            "unix:/tmp/e.sock",
            "--model",
            "models/x",
            "--port",
            "8001",
            "--store-path",
            "s.db",
        ]
    )
    engine = launch.engine_command(args)
    assert engine[0].endswith("vlmserve-engine") and engine[1:] == [
        "--address",
        "unix:/tmp/e.sock",
        "--model",
        "models/x",
    ]
    facade = launch.facade_command(args)
    assert facade[0].endswith("vlmserve-facade")
    assert facade[1:] == [
        "--engine-address",
        "unix:/tmp/e.sock",
        "--host",
        "127.0.0.1",
        "--port",
        "8001",
        "--log-level",
        "info",
        "--store-path",
        "s.db",
    ]
