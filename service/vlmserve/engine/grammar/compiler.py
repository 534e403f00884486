"""What a request forces on the output -> an llguidance grammar, checked against the model. No MLX.

A request is constrained when it asks for JSON (`response_format` json_object / json_schema) or
when its tool choice must be enforced: REQUIRED or a named function (one valid call, several with
parallel calls, at most `max_tool_calls`), or AUTO with tools, where the text is free until the
model writes the family's call-start marker, and from there the call must name an offered tool
with valid arguments (a lazy trigger). NONE adds nothing (calls are not parsed at all).

Arguments follow the tool's `parameters`: exactly when the tool is `strict` (a schema llguidance
cannot compile is refused); otherwise leniently (keywords llguidance does not implement are
ignored), and when even that does not compile, any JSON object (what OpenAI promises for
non-strict tools), so a client's loose schema never fails a request. JSON is compact (", " and
": " separators, no other whitespace), so a weak model cannot fill its budget with blanks.

`GrammarCompiler` is built once per model (walking the vocabulary takes ~1 s on a 150k vocab);
`constraint_for` builds a request's grammar and refuses one llguidance cannot compile with
INVALID_ARGUMENT naming the contract field and llguidance's reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vlmserve.engine.request_errors import invalid_argument
from vlmserve.engine.toolcalls.call_grammars import LENIENT, FunctionSpec, schema_rule
from vlmserve.engine.toolcalls.registry import FORMATS
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = [
    "GrammarCompiler",
    "OutputConstraint",
    "after_thinking",
    "constraint_for",
]

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True, slots=True)
class OutputConstraint:
    """A request's grammar (llguidance Lark text), already compiled once against the model."""

    grammar: str
    # What it enforces, for logs: "json_schema", "tool_choice=required", ...
    summary: str
    # The prompt leaves the model thinking: the grammar binds from the token after this one.
    thinking_end_token_id: int | None = None


def after_thinking(
    constraint: OutputConstraint, compiler: GrammarCompiler, prompt_text: str, *, model_thinks: bool = False
) -> OutputConstraint:
    """`constraint`, waiting for `</think>` when the prompt opens thinking without closing it
    (Qwen3-VL-Thinking's generation prompt ends with an open `<think>`): constraints bind the answer.

    `model_thinks` (the template has a thinking switch) and the prompt opens nothing: the model
    opens `<think>` itself (GLM-4.5V/4.6V, Qwen3's hybrid templates), so the grammar lets the
    answer start with one `<think>…</think>` block. `<think>` is an added token there, which no
    text terminal matches: without this, offering tools (even with tool choice auto) stopped such
    a model from thinking at all. Not after an empty block the prompt closed (thinking off)."""
    opened, closed = prompt_text.rfind("<think>"), prompt_text.rfind("</think>")
    start, end = compiler.token_id("<think>"), compiler.token_id("</think>")
    if opened > closed and end is not None:
        return replace(constraint, thinking_end_token_id=end)
    if (
        model_thinks
        and start is not None
        and end is not None
        and not prompt_text.rstrip().endswith("</think>")
    ):
        return replace(constraint, grammar=_thought_first(constraint.grammar, start, end))
    return constraint


def _thought_first(grammar: str, start: int, end: int) -> str:
    """`grammar` with an optional thought block before its answer (`start:` renamed)."""
    lines = grammar.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith("start:"))
    answer = lines[index].removeprefix("start:").strip()
    lines[index : index + 1] = [
        "start: model_thought? model_answer",
        f"model_answer: {answer}",
        f"model_thought: /\\n?/ <[{start}]> /(.|\\n)*/ <[{end}]> /\\n*/",
    ]
    return "\n".join(lines) + "\n"


class GrammarCompiler:
    """The model's tokenizer in llguidance form, and grammar checks against it. Thread-safe."""

    def __init__(self, hf_tokenizer: Any, eos_token_ids: Iterable[int]) -> None:
        import llguidance.hf

        eos = sorted(set(eos_token_ids))
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, eos_token=eos or None)
        # Added tokens (e.g. Qwen's `<tool_call>`): llguidance treats them as special tokens,
        # which plain-text terminals never match, so markers that are one token are named by id.
        added: dict[str, int] = getattr(hf_tokenizer, "get_added_vocab", dict)()
        self._single_tokens: dict[str, int] = {str(text): int(i) for text, i in added.items()}

    def token_id(self, text: str) -> int | None:
        """The id of the added token that is exactly `text`, if there is one."""
        return self._single_tokens.get(text)

    def marker(self, text: str) -> str:
        """A Lark expression for a literal marker: its own token, or the same text spelled out."""
        literal = json.dumps(text, ensure_ascii=False)
        token = self.token_id(text)
        return f"(<[{token}]> | {literal})" if token is not None else literal

    def error(self, grammar: str) -> str:
        """llguidance's reason this grammar cannot be used with this model ("" when it can)."""
        from llguidance import LLMatcher

        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if not is_error or not messages:
            return ""
        # llguidance appends the grammar listing (our wrapping, not the caller's input) and a
        # position in it; the reason is what the caller can act on.
        reason = messages[0].split("\n   1 | ")[0]
        reason = re.sub(r"^at \d+\(\d+\): ", "", reason)
        return " ".join(line.strip() for line in reason.splitlines() if line.strip())


def _json_grammar(schema: Any) -> str:
    return f"%llguidance {{}}\nstart: answer\nanswer: {schema_rule(schema)}\n"


def _tool_grammar(
    compiler: GrammarCompiler,
    tool_call_format: str,
    tools: Sequence[FunctionSpec],
    *,
    mode: str,
    max_calls: int | None,
    answer_schema: Any | None,
) -> str:
    syntax = FORMATS[tool_call_format].grammar
    assert syntax is not None
    start_marker = syntax.start
    start = compiler.marker(start_marker) if start_marker else ""
    lines = ["%llguidance {}", *syntax.rules(compiler, tools, max_calls)]
    if mode in ("required", "function"):
        lines.append(f"start: {start} calls")
        return "\n".join(lines) + "\n"
    if answer_schema is not None:
        # AUTO with a JSON format: the JSON answer, or calls from the first token (free text
        # before a call would be neither).
        lines += [f"start: answer | {start} calls", f"answer: {schema_rule(answer_schema)}"]
        return "\n".join(lines) + "\n"
    if not start_marker:
        # The calls are the whole answer: free text is any answer that does not open with `{`
        # (the parser reads one that does as calls).
        lines += ["TEXT: /(\\s*[^{\\s](.|\\n)*)?/", "start: TEXT | calls"]
        return "\n".join(lines) + "\n"
    # AUTO: free text, or text that opens a call; once the marker is written the call is
    # enforced. Text ends lazily at the first marker spelled out in it; a marker that is its
    # own token ends it too (plain-text terminals never match one).
    choices = ["TEXT", "call_start calls"]
    token = compiler.token_id(start_marker)
    if token is not None:
        choices.append(f"TEXT <[{token}]> calls")
    lines += [
        "TEXT: /(.|\\n)*/",
        f"call_start[lazy]: TEXT {json.dumps(start_marker, ensure_ascii=False)}",
        f"start: {' | '.join(choices)}",
    ]
    return "\n".join(lines) + "\n"


def endless_reference(schema: Any) -> str | None:
    """The local `$ref` a schema can never stop following, or None.

    A schema that requires itself (`{"properties": {"child": {"$ref": "#"}}, "required":
    ["child"]}`: a required property, an item of a non-empty array, every branch of an `anyOf`,
    any of an `allOf`) has no finite instance. llguidance compiles it, then gives up at the
    first token of the output after about a second ("Too many items"): a failed response where
    the request could have been refused. Recursion that can end (an optional property, an
    `anyOf` with another branch) is fine. References this cannot follow count as ending.
    """
    refs: set[str] = set()
    _collect_refs(schema, refs)
    if not refs:
        return None
    # Least fixpoint: a reference ends once what it points to can end with what is known.
    ending: dict[str, bool] = dict.fromkeys(refs, False)
    try:
        changed = True
        while changed:
            changed = False
            for ref in refs:
                if not ending[ref] and _can_end(_resolve(schema, ref), ending):
                    ending[ref] = changed = True
        if _can_end(schema, ending):
            return None
    except RecursionError:
        return None
    return sorted(ref for ref, ends in ending.items() if not ends)[0]


def _collect_refs(node: Any, refs: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            refs.add(ref)
        for value in node.values():
            _collect_refs(value, refs)
    elif isinstance(node, list):
        for value in node:
            _collect_refs(value, refs)


_UNRESOLVED: dict[str, Any] = {}


def _resolve(schema: Any, ref: str) -> Any:
    """What a local reference ("#", "#/$defs/node") points to; an empty schema if nothing."""
    node = schema
    for token in ref[1:].split("/")[1:] if ref != "#" else []:
        key = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return _UNRESOLVED
    return node


def _can_end(node: Any, ending: dict[str, bool]) -> bool:
    """Whether `node` has a finite instance, given which references are known to end."""
    if not isinstance(node, dict):
        return node is not False
    ref = node.get("$ref")
    if isinstance(ref, str) and not ending.get(ref, True):
        return False
    if any(not _can_end(branch, ending) for branch in _branches(node, "allOf")):
        return False
    for key in ("anyOf", "oneOf"):
        branches = _branches(node, key)
        if branches and not any(_can_end(branch, ending) for branch in branches):
            return False
    properties = node.get("properties")
    required = node.get("required")
    if isinstance(properties, dict) and isinstance(required, list):
        for name in required:
            if isinstance(name, str) and name in properties and not _can_end(properties[name], ending):
                return False
    min_items = node.get("minItems")
    if isinstance(min_items, int) and min_items > 0:
        prefix = _branches(node, "prefixItems")
        firsts = prefix[:min_items]
        if any(not _can_end(item, ending) for item in firsts):
            return False
        items = node.get("items")
        if len(firsts) < min_items and isinstance(items, dict) and not _can_end(items, ending):
            return False
    return True


def _branches(node: dict[str, Any], key: str) -> list[Any]:
    value = node.get(key)
    return value if isinstance(value, list) else []


def _refuse_endless(schema: Any, where: str, what: str) -> None:
    ref = endless_reference(schema)
    if ref is not None:
        raise invalid_argument(
            f"{what} cannot be enforced (strict): it requires itself without end through "
            f"$ref {ref!r} (no finite JSON matches it); make the recursion optional",
            field=where,
        )


def _arguments_schema(compiler: GrammarCompiler, tool: FunctionSpec) -> FunctionSpec:
    """The tool with the schema its arguments will be held to (see the module docstring)."""
    if tool.strict:
        _refuse_endless(tool.parameters, tool.where, f"{tool.where} (tool {tool.name!r})")
        reason = compiler.error(_json_grammar(tool.parameters))
        if reason:
            raise invalid_argument(f"{tool.where} cannot be enforced (strict): {reason}", field=tool.where)
        return tool
    # Not strict: a schema that cannot be kept to (one that requires itself without end, one
    # llguidance cannot compile even leniently) holds the arguments to any object.
    if not isinstance(tool.parameters, dict) or endless_reference(tool.parameters) is not None:
        return replace(tool, parameters=_ANY_OBJECT)
    if compiler.error(_json_grammar({**tool.parameters, "x-guidance": LENIENT})):
        return replace(tool, parameters=_ANY_OBJECT)
    return tool


def _parse_tools(tools: Sequence[pb.Tool]) -> list[FunctionSpec]:
    parsed: list[FunctionSpec] = []
    for index, tool in enumerate(tools):
        if tool.WhichOneof("kind") != "function":
            continue  # prompt rendering refuses these with a precise message
        where = f"tools[{index}].function.parameters_json"
        parameters: Any = _ANY_OBJECT
        if tool.function.parameters_json:
            try:
                parameters = json.loads(tool.function.parameters_json)
            except ValueError:
                raise invalid_argument(f"{where} is not valid JSON", field=where) from None
        parsed.append(FunctionSpec(tool.function.name, parameters, tool.function.strict, where))
    return parsed


def _answer_schema(response_format: pb.ResponseFormat | None) -> tuple[Any | None, str]:
    """(schema the answer must match, or None for free text; its name for logs)."""
    kind = response_format.WhichOneof("format") if response_format is not None else None
    if response_format is None or kind in (None, "text"):
        return None, ""
    if kind == "json_object":
        return _ANY_OBJECT, "json_object"
    text = response_format.json_schema.schema_json
    if not text:
        return _ANY_OBJECT, "json_schema"
    try:
        schema = json.loads(text)
    except ValueError:
        raise invalid_argument(
            "response_format.json_schema.schema_json is not valid JSON",
            field="response_format.json_schema.schema_json",
        ) from None
    if not isinstance(schema, dict | bool):
        raise invalid_argument(
            "response_format.json_schema.schema_json must be a JSON object",
            field="response_format.json_schema.schema_json",
        )
    return schema, "json_schema"


def constraint_for(
    compiler: GrammarCompiler,
    *,
    tool_call_format: str,
    tools: Sequence[pb.Tool],
    tool_mode: str,
    forced_name: str | None,
    parallel_tool_calls: bool,
    max_tool_calls: int | None,
    response_format: pb.ResponseFormat | None,
) -> OutputConstraint | None:
    """The request's grammar, or None when nothing is enforced. `tool_mode`: none|auto|required|function."""
    answer_schema, format_name = _answer_schema(response_format)
    if answer_schema is not None and endless_reference(answer_schema) is not None:
        where = "response_format.json_schema.schema_json"
        if response_format is not None and response_format.json_schema.strict:
            _refuse_endless(answer_schema, where, where)
        # Not strict: best effort, as for a schema llguidance cannot compile (below).
        answer_schema = {}
    if answer_schema is not None:
        reason = compiler.error(_json_grammar(answer_schema))
        if reason and response_format is not None and not response_format.json_schema.strict:
            # json_schema with strict=false: best effort (OpenAI's promise), yet always JSON: the
            # schema without the keywords llguidance does not implement, else any JSON value
            # (the instruction in the prompt still carries the whole schema).
            lenient = {**answer_schema, "x-guidance": LENIENT} if isinstance(answer_schema, dict) else {}
            answer_schema = lenient if not compiler.error(_json_grammar(lenient)) else {}
        elif reason:
            raise invalid_argument(
                f"response_format.json_schema.schema_json cannot be enforced: {reason}",
                field="response_format.json_schema.schema_json",
            )
    parsed = _parse_tools(tools)
    # Only the registry's own families have call grammars (a name only mlx-vlm knows has none).
    record = FORMATS.get(tool_call_format)
    enforceable = record is not None and record.grammar is not None
    calls_possible = tool_mode != "none" and bool(parsed) and enforceable
    if not calls_possible:
        if tool_mode in ("required", "function"):
            raise invalid_argument(
                f"tool_choice cannot be enforced: this model's tool-call format "
                f"{tool_call_format or '(none)'!r} has no call grammar",
                field="tool_choice",
            )
        if answer_schema is None:
            return None
        return OutputConstraint(_json_grammar(answer_schema), format_name)
    assert record is not None
    if tool_mode == "auto" and record.auto_unconstrained and answer_schema is None:
        return None
    parsed = [_arguments_schema(compiler, tool) for tool in parsed]
    if tool_mode == "function":
        parsed = [tool for tool in parsed if tool.name == forced_name]
    max_calls = 1 if not parallel_tool_calls else max_tool_calls
    if max_tool_calls is not None and max_calls is not None:
        max_calls = min(max_calls, max_tool_calls)
    grammar = _tool_grammar(
        compiler,
        tool_call_format,
        parsed,
        mode=tool_mode,
        max_calls=max_calls,
        answer_schema=answer_schema if tool_mode == "auto" else None,
    )
    reason = compiler.error(grammar)
    if reason:
        raise invalid_argument(f"tools cannot be enforced: {reason}", field="tools")
    summary = f"tool_choice={tool_mode}" + (f", {format_name}" if format_name else "")
    return OutputConstraint(grammar, summary)
