"""Which models a facade serves: `--engine`, `--model-alias`, `--models-file` (settings/model_routes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmserve.facade.settings.model_routes import (
    ModelRoute,
    model_routes,
    parse_engine_flags,
    read_models_file,
)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["a=h:1"], [("a", "h:1")]),
        # The settings split a flag's value on commas: addresses continue the entry before.
        (["a=h1:1", "h2:1", "b=h3:1"], [("a", "h1:1,h2:1"), ("b", "h3:1")]),
        (
            ["a=unix:/run/a.sock", "b=dns:///b.internal:50051"],
            [("a", "unix:/run/a.sock"), ("b", "dns:///b.internal:50051")],
        ),
        ([" a = h:1 ", ""], [("a", "h:1")]),
    ],
)
def test_engine_flags(values: list[str], expected: list[tuple[str, str]]) -> None:
    assert parse_engine_flags(values) == expected


@pytest.mark.parametrize("values", [["h:1"], ["=h:1"], ["a="]])
def test_engine_flags_refused(values: list[str]) -> None:
    with pytest.raises(ValueError, match="MODEL_ID=ADDRESS"):
        parse_engine_flags(values)


def test_one_engine_address_is_one_model_known_by_its_engine() -> None:
    assert model_routes(engine_address="127.0.0.1:50051") == [
        ModelRoute(None, "127.0.0.1:50051", ("default",))
    ]


def test_first_model_is_the_default_unless_an_alias_says_otherwise() -> None:
    routes = model_routes(engine_address="unused", engines=["squares=h:1", "tiny=h:2"])
    assert [(r.id, r.aliases) for r in routes] == [("squares", ("default",)), ("tiny", ())]
    routes = model_routes(
        engine_address="unused",
        engines=["squares=h:1", "tiny=h:2"],
        aliases=["default=tiny", "small=tiny", "counter=squares"],
    )
    # The default comes first (what requests without `model` use).
    assert [(r.id, r.target, r.aliases) for r in routes] == [
        ("tiny", "h:2", ("default", "small")),
        ("squares", "h:1", ("counter",)),
    ]


@pytest.mark.parametrize(
    ("engines", "aliases", "message"),
    [
        (["a=h:1", "a=h:2"], [], "'a' is given to 'a' and to 'a'"),
        (["a=h:1", "b=h:2"], ["b=a"], "'b' is given to 'a' and to 'b'"),
        (["a=h:1"], ["x=nope"], "no model 'nope'"),
        (["a=h:1"], ["broken"], "ALIAS=MODEL_ID"),
        ([], ["x=a"], "--model-alias needs models"),
    ],
)
def test_names_refused(engines: list[str], aliases: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        model_routes(engine_address="unused", engines=engines, aliases=aliases)


def test_models_file_toml_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        """
[[models]]
id = "screens"
engines = ["10.0.0.5:50051", "10.0.0.6:50051"]
aliases = ["fast"]
limits = { max_images_per_request = 4, max_output_tokens = 2048 }

[[models]]
id = "reasoner"
engines = ["dns:///reasoner.internal:50051"]
aliases = ["default"]
""",
        encoding="utf-8",
    )
    routes = model_routes(engine_address="unused", engines=["extra=h:9"], models_file=read_models_file(path))
    assert [(r.id, r.target, r.aliases, dict(r.limits)) for r in routes] == [
        ("reasoner", "dns:///reasoner.internal:50051", ("default",), {}),
        (
            "screens",
            "10.0.0.5:50051,10.0.0.6:50051",
            ("fast",),
            {"max_images_per_request": 4, "max_output_tokens": 2048},
        ),
        ("extra", "h:9", (), {}),
    ]


def test_models_file_json(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    path.write_text('{"models": [{"id": "a", "engines": ["h:1"]}]}', encoding="utf-8")
    assert model_routes(engine_address="unused", models_file=read_models_file(path)) == [
        ModelRoute("a", "h:1", ("default",))
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[models]]\nid = "a"\nengines = ["h:1"]\nlimits = { max_headers = 3 }\n',
            "cannot be set per model",
        ),
        ('[[models]]\nid = "a"\n', "no engines"),
        ('[[models]]\nid = "a"\nengines = ["h:1"]\ncolour = "red"\n', "colour"),
        ("models = []\n", "at least 1"),
        ("[[models]\n", "models file"),
    ],
)
def test_models_file_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "models.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        model_routes(engine_address="unused", models_file=read_models_file(path))
