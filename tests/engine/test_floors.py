"""The engine's floors (docs/architecture.md): each top-level module and each subpackage is a
unit on one floor; a module imports only from its own unit or from units on lower floors (units
on one floor never import each other). No exceptions: an upward import is a layering to fix,
not one to list. The graph counts every import, function-level ones too (tests/engine/_engine_graph.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine._engine_graph import ENGINE, engine_imports

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

# Lowest first.
FLOORS: list[tuple[str, ...]] = [
    # Leaves: they import nothing else of the engine.
    ("request_errors", "process_group", "metrics", "kv", "toolcalls", "load_progress", "token_choice"),
    # settings and the sampler; the computer tool in the model's terms; bounded clip decoding
    ("sampling", "computer", "media"),
    ("grammar", "output"),  # constrained output and the output side, both on the tool-call formats
    ("jobs",),  # a request as the generation thread sees it: grammar and sampling settings
    ("template_fit",),  # what a chat template renders; the registry's tool prompt text
    ("model",),  # a loaded model: its template, tool format, grammar tokenizer, KV layout
    ("prep",),  # a contract request -> a PreparedRequest for a model
    ("model_lifecycle",),
    ("config",),  # the engine's settings: the choices of the floors below
    ("speculation",),  # drafts, acceptance, rollback on the KV
    ("loop",),  # the generation thread
    ("distributed",),
    ("rpc",),
    ("cli",),
]
FLOOR = {unit: index for index, units in enumerate(FLOORS) for unit in units}
GRAPH = engine_imports()


def unit_of(module: str) -> str:
    """`vlmserve.engine.loop.batch` -> `loop`; `vlmserve.engine.sampling` -> `sampling`."""
    return module.removeprefix("vlmserve.engine.").split(".", 1)[0]


def upward(module: str, imported: str) -> str | None:
    """Why `module` may not import `imported`, or None when it may."""
    own, target = unit_of(module), unit_of(imported)
    if own == target:
        return None
    if FLOOR[target] > FLOOR[own]:
        return f"{module} ({own}, floor {FLOOR[own]}) imports up: {imported} ({target}, {FLOOR[target]})"
    if FLOOR[target] == FLOOR[own]:
        return f"{module} ({own}) imports {imported} ({target}), a unit on its own floor"
    return None


def test_every_unit_is_on_one_floor() -> None:
    units = {unit_of(module) for module in GRAPH}
    named = [unit for floor in FLOORS for unit in floor]
    assert len(named) == len(set(named)), "a unit named on two floors"
    assert units - set(named) == set(), f"give them a floor: {sorted(units - set(named))}"
    assert set(named) - units == set(), f"no such unit: {sorted(set(named) - units)}"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_go_down(module: str) -> None:
    wrong = [reason for imported in sorted(GRAPH[module]) if (reason := upward(module, imported))]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("module", "imported", "refused"),
    [
        ("vlmserve.engine.kv.views", "vlmserve.engine.kv.layout", False),  # within a unit
        ("vlmserve.engine.loop.batch", "vlmserve.engine.kv.merge", False),  # down
        ("vlmserve.engine.kv.layout", "vlmserve.engine.loop.batch", True),  # up
        ("vlmserve.engine.model", "vlmserve.engine.prep.prompt", True),  # up one floor
        ("vlmserve.engine.grammar.compiler", "vlmserve.engine.output.assembler", True),  # sideways
        ("vlmserve.engine.kv.layout", "vlmserve.engine.request_errors", True),  # leaves stay leaves
    ],
)
def test_the_check_refuses_what_it_should(module: str, imported: str, refused: bool) -> None:
    assert (upward(module, imported) is not None) is refused


def test_the_graph_sees_function_level_imports() -> None:
    # model.py imports the assembler inside a function: the floors count it all the same.
    assert "vlmserve.engine.output.assembler" in GRAPH["vlmserve.engine.model"]


def rendered_floors() -> str:
    """The floors as docs/architecture.md writes them: `kv/` for a package, `jobs.py` for a module."""

    def name(unit: str) -> str:
        return f"`{unit}/`" if (ENGINE / unit).is_dir() else f"`{unit}.py`"

    return " → ".join(", ".join(name(unit) for unit in floor) for floor in FLOORS)


def test_the_architecture_doc_lists_these_floors() -> None:
    doc = " ".join(DOC.read_text(encoding="utf-8").split())
    assert rendered_floors() in doc, f"list the engine's floors in docs/architecture.md: {rendered_floors()}"
