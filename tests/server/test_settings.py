"""Settings declared once (vlmserve.server.settings): names, help, precedence and errors are all
derived from the field, for a toy model and for the real engine, facade and launcher."""

from __future__ import annotations

import argparse
from typing import Annotated, ClassVar, Literal

import pytest
from pydantic import Field

from vlmserve.engine.cli import EngineCommand
from vlmserve.engine.cli import _parse_args as engine_args
from vlmserve.facade import launch
from vlmserve.facade.cli import build_parser as facade_parser
from vlmserve.facade.cli import settings_from_args
from vlmserve.facade.settings import FacadeSettings
from vlmserve.server.settings import DeclaredSettings, Option, SettingsError, add_arguments, declared, load


class Inner(DeclaredSettings):
    """Inner things

    More text that is not the group title."""

    depth: int = Field(3, ge=1, description="how deep")
    names: tuple[str, ...] = Field((), description="some names")


class Toy(DeclaredSettings):
    ENV_PREFIX: ClassVar[str] = "TOY_"

    size: int = Field(10, ge=1, description="a size in %")
    ratio: float | None = Field(None, description="a ratio")
    loud: bool = Field(False, description="be loud")
    secret: Annotated[str, Option(flag=None, env="TOY_SECRET_VALUE")] = Field("", description="a secret")
    renamed: Annotated[int, Option(flag="--old-name", env="TOY_OLD")] = Field(1, description="kept names")
    inner: Inner = Field(default_factory=Inner, description="inner")


def parse(argv: list[str], environ: dict[str, str]) -> Toy:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_arguments(parser, Toy)
    return load(Toy, environ=environ, args=parser.parse_args(argv))


def test_names_are_derived_from_the_field() -> None:
    names = {setting.dest: (setting.flag, setting.env) for setting in declared(Toy)}
    assert names == {
        "size": ("--size", "TOY_SIZE"),
        "ratio": ("--ratio", "TOY_RATIO"),
        "loud": ("--loud", "TOY_LOUD"),
        "secret": (None, "TOY_SECRET_VALUE"),
        "renamed": ("--old-name", "TOY_OLD"),
        "inner.depth": ("--depth", "TOY_DEPTH"),
        "inner.names": ("--names", "TOY_NAMES"),
    }


def test_help_shows_default_variable_and_group() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_arguments(parser, Toy)
    text = " ".join(parser.format_help().split())
    assert "a size in % (default: 10; $TOY_SIZE)" in text
    assert "Inner things:" in text and "More text" not in text
    assert "--secret" not in text and "$TOY_SECRET_VALUE: a secret" in text


def test_defaults_then_environment_then_command_line() -> None:
    assert parse([], {}) == Toy()
    env = {"TOY_SIZE": "20", "TOY_RATIO": "0.5", "TOY_LOUD": "yes", "TOY_NAMES": "a, b", "TOY_OLD": "7"}
    from_env = parse([], env)
    assert (from_env.size, from_env.ratio, from_env.loud, from_env.inner.names, from_env.renamed) == (
        20,
        0.5,
        True,
        ("a", "b"),
        7,
    )
    flags = parse(["--size", "30", "--ratio", "none", "--no-loud", "--names", "c", "--names", "d"], env)
    assert (flags.size, flags.ratio, flags.loud, flags.inner.names) == (30, None, False, ("c", "d"))
    assert parse([], {"TOY_SECRET_VALUE": "s3cret"}).secret == "s3cret"
    assert parse([], {"TOY_SIZE": ""}).size == 10  # an empty variable is unset


def test_a_bad_value_names_where_it_came_from() -> None:
    with pytest.raises(SettingsError, match=r"\$TOY_SIZE"):
        parse([], {"TOY_SIZE": "big"})
    with pytest.raises(SettingsError, match="--depth"):
        parse(["--depth", "0"], {})
    with pytest.raises(SettingsError, match=r"--size.*greater than or equal to 1"):
        parse(["--size", "0"], {"TOY_SIZE": "5"})


class Choices(DeclaredSettings):
    ENV_PREFIX: ClassVar[str] = "CHOICE_"

    bits: Literal[4, 8] | None = Field(None, description="bits")
    mode: Literal["fast", "slow"] = Field("fast", description="mode")


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        ([], {"CHOICE_BITS": "8", "CHOICE_MODE": "slow"}, (8, "slow")),
        (["--bits", "4"], {"CHOICE_BITS": "8"}, (4, "fast")),
        (["--bits", "none"], {}, (None, "fast")),
    ],
)
def test_a_literal_of_ints_is_read_from_text(
    argv: list[str], environ: dict[str, str], expected: tuple[int | None, str]
) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_arguments(parser, Choices)
    loaded = load(Choices, environ=environ, args=parser.parse_args(argv))
    assert (loaded.bits, loaded.mode) == expected
    assert "--bits {4,8}" in parser.format_help()


@pytest.mark.parametrize("raw", ["3", "08x", "-4", "four"])
def test_a_literal_of_ints_refuses_other_text(raw: str) -> None:
    with pytest.raises(SettingsError, match=r"\$CHOICE_BITS: Input should be 4 or 8"):
        load(Choices, environ={"CHOICE_BITS": raw})


def test_a_setting_without_help_is_refused() -> None:
    class Undocumented(DeclaredSettings):
        size: int = 1

    with pytest.raises(TypeError, match="description"):
        declared(Undocumented)


@pytest.mark.parametrize("model", [FacadeSettings, EngineCommand, launch.LaunchSettings])
def test_real_settings_have_unique_names(model: type[DeclaredSettings]) -> None:
    settings = declared(model)
    flags = [setting.flag for setting in settings if setting.flag]
    envs = [setting.env for setting in settings]
    assert len(set(flags)) == len(flags) and len(set(envs)) == len(envs)


# --- prefixes are not abbreviations (`--store postgresql://...` was read as --store-path) ------


def test_facade_refuses_an_abbreviated_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        settings_from_args(["--store-pa", "elsewhere.sqlite3"], {})
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --store-pa" in capsys.readouterr().err
    assert facade_parser().allow_abbrev is False


def test_facade_store_is_a_postgresql_url_or_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    settings = settings_from_args(["--store", "postgresql://db.example/vlm"], {})
    assert settings.store == "postgresql://db.example/vlm"
    assert settings_from_args([], {}).store is None
    with pytest.raises(SystemExit):
        settings_from_args(["--store", "var/facade.sqlite3"], {})
    assert "postgresql://" in capsys.readouterr().err


def test_engine_refuses_an_abbreviated_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        engine_args(["--max-tok", "5"], {})
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --max-tok" in capsys.readouterr().err


def test_launcher_refuses_an_abbreviated_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        launch.parse_args(["--store-pa", "elsewhere.sqlite3"], {})
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --store-pa" in capsys.readouterr().err


def test_engine_command_line() -> None:
    command = engine_args(
        ["--max-tokens", "64", "--host", "127.0.0.2", "--port", "6000", "--no-warmup"],
        {"VLMSERVE_MODEL": "models/x", "VLMSERVE_ENGINE_MAX_QUEUE": "3"},
    )
    assert command.listen_address == "127.0.0.2:6000"
    engine = command.engine
    assert (engine.model, engine.max_output_tokens, engine.max_queue, engine.warmup) == (
        "models/x",
        64,
        3,
        False,
    )
    assert engine.image_limits.max_bytes == engine.max_image_bytes
    with pytest.raises(SystemExit):
        engine_args(["--max-active", "0"], {})
    with pytest.raises(SystemExit):
        engine_args(["--dtype", "float8"], {})


def test_the_configuration_doc_lists_every_setting() -> None:
    """docs/configuration.md holds the tables derived from the declarations, as they are now."""
    from scripts.settings_reference import DOC, rendered

    text = DOC.read_text(encoding="utf-8")
    assert rendered(text) == text, "stale: run .venv/bin/python -m scripts.settings_reference"
    for model in (EngineCommand, FacadeSettings):
        for setting in declared(model):
            assert f"`{setting.env}`" in text


def test_every_argument_parser_in_the_repository_refuses_abbreviations() -> None:
    """Each `argparse.ArgumentParser(...)` in our sources says allow_abbrev=False."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = []
    for folder in ("service", "facade", "clients", "bench", "training", "tests", "scripts"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            # A call to it names it (an alias is imported by its name): the others are not parsed.
            if "ArgumentParser" not in text:
                continue
            for node in ast.walk(ast.parse(text)):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute | ast.Name)
                    and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
                    == "ArgumentParser"
                ):
                    flags = {kw.arg: kw.value for kw in node.keywords}
                    value = flags.get("allow_abbrev")
                    if not (isinstance(value, ast.Constant) and value.value is False):
                        offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders
