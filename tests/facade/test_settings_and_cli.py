"""Settings from defaults, the environment and the command line; the launcher's commands."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmserve.facade import launch
from vlmserve.facade.cli import server_shutdown_timeout_s, settings_from_args
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
    """The launcher takes every facade flag (declared once, in FacadeSettings) and passes the ones
    given on to the facade; the engine gets the address, the shutdown grace and the model."""
    settings, facade_flags = launch.parse_args(
        [
            *("--engine-address", "unix:/tmp/e.sock", "--model", "models/x", "--port", "8001"),
            *("--store-path", "s.db", "--max-images", "3", "--shutdown-grace", "4"),
        ],
        {"VLMSERVE_FACADE_HOST": "127.0.0.2"},
    )
    assert (settings.facade.host, settings.facade.port, settings.facade.limits.max_images_per_request) == (
        "127.0.0.2",
        8001,
        3,
    )
    engine = launch.engine_command(settings)
    assert engine[0].endswith("vlmserve-engine")
    assert engine[1:] == [
        *("--address", "unix:/tmp/e.sock", "--drain-seconds", "4.0", "--model", "models/x"),
        *("--log-format", "text"),
    ]
    json_logs, _ = launch.parse_args(["--log-format", "json"], {})
    assert launch.engine_command(json_logs)[-2:] == ["--log-format", "json"]
    facade = launch.facade_command(facade_flags)
    assert facade[0].endswith("vlmserve-facade")
    assert facade[1:] == [
        *("--engine-address", "unix:/tmp/e.sock", "--port", "8001", "--store-path", "s.db"),
        *("--shutdown-grace", "4", "--max-images", "3"),
    ]
    # The facade itself parses what it is given to the same settings (the host from the environment).
    passed_on = settings_from_args(facade[1:], {"VLMSERVE_FACADE_HOST": "127.0.0.2"})
    assert passed_on == settings.facade
    # One setting drives every shutdown deadline: the launcher outwaits the facade's own.
    timeouts = launch.stop_timeouts(settings.facade)
    assert timeouts["facade"] > server_shutdown_timeout_s(settings.facade) > 4
    assert timeouts["engine"] > 4


def test_a_validated_copy_keeps_keys_from_a_file_once(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("sk-from-the-file-0123456789\n", encoding="utf-8")
    settings = settings_from_args(
        ["--api-keys-file", str(key_file)], {"VLMSERVE_API_KEYS": "sk-env-0123456789"}
    )
    assert len(settings.api_keys.digests) == 2
    copy = settings.replace(port=9001)
    assert copy.port == 9001 and copy.api_keys == settings.api_keys


def test_the_launcher_gives_the_trace_endpoint_to_both_processes() -> None:
    endpoint = "http://127.0.0.1:4318/v1/traces"
    settings, facade_flags = launch.parse_args(["--otlp-endpoint", endpoint], {})
    engine = launch.engine_command(settings)
    assert engine[engine.index("--otlp-endpoint") + 1] == endpoint
    assert settings_from_args(launch.facade_command(facade_flags)[1:], {}).otlp_endpoint == endpoint
    assert "--otlp-endpoint" not in launch.engine_command(launch.parse_args([], {})[0])
