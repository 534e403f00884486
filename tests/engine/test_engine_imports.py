"""The engine's modules import each other without cycles (read with ast, nothing imported):
the layers can be read bottom-up, and a function-level import is no way around it."""

from __future__ import annotations

from tests.engine._engine_graph import engine_imports


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_engine_has_no_import_cycle() -> None:
    graph = engine_imports()
    assert "vlmserve.engine.loop.generator" in graph  # the walk sees the subpackages
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
