"""Call grammars of formats no fixture family uses (Qwen3-Coder XML, GLM, Kimi K2, gpt-oss harmony):
the grammar allows exactly valid calls to offered tools, and the format's parser (mlx-vlm's, in
our streaming wrapper; harmony through the output splitter) reads what it allows as that call.

Checked with the random fixture's tokenizer, where these formats' markers are spelled out as
text (on their own models most are single tokens; `GrammarCompiler.marker` takes either)."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pytest
from transformers import AutoTokenizer

from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.engine.grammar.compiler import GrammarCompiler, OutputConstraint, constraint_for
from vlmserve.engine.output.assembler import OutputAssembler
from vlmserve.engine.toolcalls.registry import tool_format
from vlmserve.engine.v1 import engine_pb2 as pb

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    pb.Tool(function=pb.FunctionTool(name="weather", parameters_json=json.dumps(WEATHER), strict=True)),
    pb.Tool(function=pb.FunctionTool(name="shell", parameters_json='{"type": "object"}')),
]
TEMPLATE_TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}]


def build(compiler: GrammarCompiler, tool_format: str, mode: str, **options: Any) -> OutputConstraint | None:
    settings: dict[str, Any] = {
        "tools": TOOLS,
        "forced_name": None,
        "parallel_tool_calls": True,
        "max_tool_calls": None,
        "response_format": None,
    }
    settings.update(options)
    return constraint_for(compiler, tool_call_format=tool_format, tool_mode=mode, **settings)


def accepts(
    compiler: GrammarCompiler, tokenizer: Any, constraint: OutputConstraint | None, text: str
) -> bool:
    assert constraint is not None
    matcher = llguidance.LLMatcher(compiler.tokenizer, constraint.grammar)
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not matcher.consume_token(token):
            return False
    return bool(matcher.is_accepting())


def parsed(tool_format: str, text: str) -> list[tuple[str, Any]]:
    assembler = OutputAssembler(stop=[], tool_call_format=tool_format, tools=TEMPLATE_TOOLS)
    assembler.feed(text)
    assembler.finish()
    return [(call.name, json.loads(call.arguments)) for call in assembler.tool_calls]


def xml(name: str, **parameters: str) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def glm(name: str, **parameters: str) -> str:
    body = "".join(
        f"<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n" for key, value in parameters.items()
    )
    return f"<tool_call>{name}\n{body}</tool_call>"


def kimi(*calls: tuple[str, Any]) -> str:
    body = "".join(
        f"<|tool_call_begin|>functions.{name}:{n}<|tool_call_argument_begin|>{json.dumps(arguments)}<|tool_call_end|>"
        for n, (name, arguments) in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def harmony(name: str, arguments: Any, *, thinking: str | None = None) -> str:
    analysis = (
        f"<|channel|>analysis<|message|>{thinking}<|end|><|start|>assistant" if thinking is not None else ""
    )
    header = f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
    return analysis + header + json.dumps(arguments)


CASES = [
    # (format, mode, text, the calls it parses to, or None when the grammar refuses it)
    (
        "qwen3_coder",
        "required",
        xml("weather", city="Oslo", days="3"),
        [("weather", {"city": "Oslo", "days": 3})],
    ),
    (
        "qwen3_coder",
        "required",
        xml("weather", city="New\nYork", days="2", unit="f"),
        [("weather", {"city": "New\nYork", "days": 2, "unit": "f"})],
    ),
    ("qwen3_coder", "required", xml("weather", city="Oslo"), None),  # `days` is required
    ("qwen3_coder", "required", xml("weather", city="Oslo", days="three"), None),
    ("qwen3_coder", "required", xml("weather", city="Oslo", days="3", unit="k"), None),  # not in the enum
    ("qwen3_coder", "required", xml("nope", a="1"), None),
    ("qwen3_coder", "required", xml("shell", cmd="ls -l"), [("shell", {"cmd": "ls -l"})]),
    ("qwen3_coder", "required", "Sure.", None),
    ("qwen3_coder", "auto", "Just words.", []),
    (
        "qwen3_coder",
        "auto",
        "Looking. " + xml("weather", city="Oslo", days="1"),
        [("weather", {"city": "Oslo", "days": 1})],
    ),
    ("qwen3_coder", "auto", "Looking. " + xml("nope", a="1"), None),
    (
        "kimi_k2",
        "required",
        kimi(("weather", {"city": "Oslo", "days": 3})),
        [("weather", {"city": "Oslo", "days": 3})],
    ),
    ("kimi_k2", "required", kimi(("shell", {}), ("shell", {"x": 1})), [("shell", {}), ("shell", {"x": 1})]),
    ("glm47", "required", glm("weather", city="Oslo", days="3"), [("weather", {"city": "Oslo", "days": 3})]),
    (
        "glm47",
        "required",
        glm("weather", city="Oslo", days="3", unit="c") + "\n" + glm("shell", cmd="ls"),
        [("weather", {"city": "Oslo", "days": 3, "unit": "c"}), ("shell", {"cmd": "ls"})],
    ),
    ("glm47", "required", glm("weather", city="Oslo", days="x"), None),
    ("glm47", "required", glm("weather", days="3"), None),
    ("glm47", "required", glm("nope"), None),
    ("glm47", "auto", "Let me check. " + glm("shell", cmd="pwd"), [("shell", {"cmd": "pwd"})]),
    ("kimi_k2", "required", kimi(("weather", {"city": "Oslo"})), None),
    ("kimi_k2", "required", kimi(("nope", {})), None),
    ("kimi_k2", "auto", "Words.", []),
    (
        "harmony",
        "required",
        harmony("weather", {"city": "Oslo", "days": 3}),
        [("weather", {"city": "Oslo", "days": 3})],
    ),
    (
        "harmony",
        "required",
        harmony("shell", {"cmd": "ls"}, thinking="List the files."),
        [("shell", {"cmd": "ls"})],
    ),
    ("harmony", "required", harmony("weather", {"city": "Oslo"}), None),
    ("harmony", "required", harmony("nope", {}), None),
    ("harmony", "required", "<|channel|>final<|message|>No call.", None),
]


@pytest.mark.parametrize(
    ("tool_format", "mode", "text", "calls"), CASES, ids=[f"{c[0]}-{c[1]}-{n}" for n, c in enumerate(CASES)]
)
def test_the_grammar_allows_valid_calls_and_the_parser_reads_them(
    compiler: GrammarCompiler, tokenizer: Any, tool_format: str, mode: str, text: str, calls: Any
) -> None:
    constraint = build(compiler, tool_format, mode)
    assert accepts(compiler, tokenizer, constraint, text) is (calls is not None)
    if calls is not None:
        assert parsed(tool_format, text) == calls


def test_a_named_choice_allows_only_that_tool(compiler: GrammarCompiler, tokenizer: Any) -> None:
    for format_name, good, other in [
        ("qwen3_coder", xml("shell"), xml("weather", city="a", days="1")),
        ("glm47", glm("shell"), glm("weather", city="a", days="1")),
        ("kimi_k2", kimi(("shell", {})), kimi(("weather", {"city": "a", "days": 1}))),
        ("harmony", harmony("shell", {}), harmony("weather", {"city": "a", "days": 1})),
    ]:
        constraint = build(compiler, format_name, "function", forced_name="shell")
        assert accepts(compiler, tokenizer, constraint, good), format_name
        assert not accepts(compiler, tokenizer, constraint, other), format_name


def test_one_call_when_parallel_calls_are_off(compiler: GrammarCompiler, tokenizer: Any) -> None:
    constraint = build(compiler, "kimi_k2", "required", parallel_tool_calls=False)
    assert accepts(compiler, tokenizer, constraint, kimi(("shell", {})))
    assert not accepts(compiler, tokenizer, constraint, kimi(("shell", {}), ("shell", {})))
    constraint = build(compiler, "qwen3_coder", "required", parallel_tool_calls=False)
    assert not accepts(compiler, tokenizer, constraint, xml("shell") + "\n" + xml("shell"))


@pytest.mark.parametrize(
    ("strict", "city", "allowed"),
    [
        (True, "Oslo", True),
        (True, "Bergen", False),  # over maxLength
        (True, "O", False),  # under minLength
        (True, "Ås\nX", True),  # any characters, newlines included, counted as characters
        (False, "Bergen", True),  # a tool that is not strict: the call's shape only
    ],
)
def test_text_values_keep_the_schema_length_bounds(
    compiler: GrammarCompiler, tokenizer: Any, strict: bool, city: str, allowed: bool
) -> None:
    # Raw-text values (GLM, Qwen3-Coder) are not JSON strings: their bounds are the grammar's own.
    bounded = {**WEATHER, "properties": {"city": {"type": "string", "minLength": 2, "maxLength": 4}}}
    bounded["required"] = ["city"]
    function = pb.FunctionTool(name="weather", parameters_json=json.dumps(bounded), strict=strict)
    tools = [pb.Tool(function=function)]
    calls = [("glm47", glm("weather", city=city)), ("qwen3_coder", xml("weather", city=city))]
    for format_name, text in calls:
        constraint = build(compiler, format_name, "required", tools=tools)
        assert accepts(compiler, tokenizer, constraint, text) is allowed, format_name


def test_harmony_auto_is_left_free(compiler: GrammarCompiler) -> None:
    # Its answer runs through channels; calls are still parsed, names are not enforced.
    assert build(compiler, "harmony", "auto") is None


def test_text_arguments_are_typed_by_the_offered_tools() -> None:
    # mlx-vlm's parsers type text values by the tool's schema: without the tools "3" stays text.
    weather = [("weather", {"city": "Oslo", "days": 3})]
    assert parsed("qwen3_coder", xml("weather", city="Oslo", days="3")) == weather
    assert parsed("glm47", glm("weather", city="Oslo", days="3")) == weather
    assert parsed("glm47", glm("weather", city="12", days="3")) == [("weather", {"city": "12", "days": 3})]


def test_inner_markers_survive_detokenization() -> None:
    # Single tokens in their own vocabularies, often special: the detokenizer must keep them.
    kimi_markers = {"<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"}
    assert kimi_markers <= set(tool_format("kimi_k2").markers)
    assert {"<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"} <= set(tool_format("glm47").markers)
    assert '<|"|>' in tool_format("gemma4").markers


@pytest.fixture(scope="module")
def marker_tokens() -> tuple[Any, GrammarCompiler]:
    """The fixture tokenizer with these formats' markers as special tokens, as on their models."""
    tokenizer = AutoTokenizer.from_pretrained(str(RANDOM_MODEL_PATH))
    markers = ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<|channel|>", "<|message|>"]
    markers += ["<|end|>", "<|start|>", "<|constrain|>", "<|tool_call_begin|>", "<|tool_call_end|>"]
    markers += ["<|tool_call_argument_begin|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"]
    markers += ['<|"|>', "<|tool_call>", "<tool_call|>", "<|tool_call_start|>", "<|tool_call_end|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": markers})
    return tokenizer, GrammarCompiler(tokenizer, [tokenizer.eos_token_id])


@pytest.mark.parametrize(
    ("tool_format", "text", "calls"),
    [
        ("glm47", glm("weather", city="Oslo", days="3"), [("weather", {"city": "Oslo", "days": 3})]),
        ("glm47", glm("shell", cmd="a b"), [("shell", {"cmd": "a b"})]),
        ("kimi_k2", kimi(("shell", {"x": 1})), [("shell", {"x": 1})]),
        ("harmony", harmony("shell", {"x": 1}, thinking="Hmm."), [("shell", {"x": 1})]),
        ("gemma4", '<|tool_call>call:shell{cmd:<|"|>ls<|"|>}<tool_call|>', [("shell", {"cmd": "ls"})]),
        ("pythonic", '<|tool_call_start|>[shell(cmd="ls")]<|tool_call_end|>', [("shell", {"cmd": "ls"})]),
    ],
)
def test_markers_that_are_tokens(
    marker_tokens: tuple[Any, GrammarCompiler], tool_format: str, text: str, calls: Any
) -> None:
    tokenizer, compiler = marker_tokens
    assert len(tokenizer.encode("<arg_value>", add_special_tokens=False)) == 1
    assert accepts(compiler, tokenizer, build(compiler, tool_format, "required"), text)
    assert parsed(tool_format, text) == calls


NESTED = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1},
        "exact": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
        "mode": {"enum": ["fast", "slow", None]},
    },
    "required": ["query", "limit"],
}
SEARCH = pb.Tool(function=pb.FunctionTool(name="search", parameters_json=json.dumps(NESTED), strict=True))
LOOSE = pb.Tool(function=pb.FunctionTool(name="poke", parameters_json='{"type": "object"}'))
Q = '<|"|>'


def gemma(name: str, members: str) -> str:
    return f"<|tool_call>call:{name}{{{members}}}<tool_call|>"


LITERAL_CASES = [
    # (format, text, the arguments it parses to, or None when the grammar refuses it)
    ("gemma4", gemma("search", f"query:{Q}cats, dogs{Q},limit:3"), {"query": "cats, dogs", "limit": 3}),
    (
        "gemma4",
        gemma(
            "search",
            f"query:{Q}a{Q},limit:1,exact:true,tags:[{Q}x{Q},{Q}y{Q}],where:{{x:1.5}},mode:{Q}slow{Q}",
        ),
        {"query": "a", "limit": 1, "exact": True, "tags": ["x", "y"], "where": {"x": 1.5}, "mode": "slow"},
    ),
    ("gemma4", gemma("search", f"query:{Q}a{Q},limit:1,mode:null"), {"query": "a", "limit": 1, "mode": None}),
    ("gemma4", gemma("search", f"query:{Q}a{Q}"), None),  # `limit` is required
    ("gemma4", gemma("search", f"query:{Q}a{Q},limit:0"), None),  # minimum 1
    ("gemma4", gemma("search", f"limit:1,query:{Q}a{Q}"), None),  # the schema's order
    ("gemma4", gemma("search", f"query:{Q}a{Q},limit:1,mode:{Q}medium{Q}"), None),
    (
        "gemma4",
        gemma("poke", f"anything:{{deep:[1,{Q}two{Q},false]}}"),
        {"anything": {"deep": [1, "two", False]}},
    ),
    ("gemma4", gemma("nope", ""), None),
    (
        "pythonic",
        '<|tool_call_start|>[search(query="cats, dogs", limit=3)]<|tool_call_end|>',
        {"query": "cats, dogs", "limit": 3},
    ),
    (
        "pythonic",
        '<|tool_call_start|>[search(query="a\\"b", limit=2, exact=False, tags=["x"], '
        'where={"x": 2}, mode=None)]<|tool_call_end|>',
        {"query": 'a"b', "limit": 2, "exact": False, "tags": ["x"], "where": {"x": 2}, "mode": None},
    ),
    ("pythonic", '<|tool_call_start|>[search(query="a")]<|tool_call_end|>', None),
    (
        "pythonic",
        '<|tool_call_start|>[search(query="a", limit=true)]<|tool_call_end|>',
        None,
    ),  # Python's True
    (
        "pythonic",
        '<|tool_call_start|>[poke(x={"k": [1, None, True]})]<|tool_call_end|>',
        {"x": {"k": [1, None, True]}},
    ),
]


@pytest.mark.parametrize(
    ("tool_format", "text", "arguments"),
    LITERAL_CASES,
    ids=[f"{c[0]}-{n}" for n, c in enumerate(LITERAL_CASES)],
)
def test_literal_syntax_calls(
    compiler: GrammarCompiler, tokenizer: Any, tool_format: str, text: str, arguments: Any
) -> None:
    constraint = build(compiler, tool_format, "required", tools=[SEARCH, LOOSE])
    assert accepts(compiler, tokenizer, constraint, text) is (arguments is not None)
    if arguments is not None:
        (call,) = parsed(tool_format, text)
        assert call[1] == arguments


def test_parallel_literal_calls(compiler: GrammarCompiler, tokenizer: Any) -> None:
    two = gemma("poke", "") + gemma("poke", "a:1")
    assert accepts(compiler, tokenizer, build(compiler, "gemma4", "required", tools=[LOOSE]), two)
    assert parsed("gemma4", two) == [("poke", {}), ("poke", {"a": 1})]
    pythonic = "<|tool_call_start|>[poke(), poke(a=1)]<|tool_call_end|>"
    assert accepts(compiler, tokenizer, build(compiler, "pythonic", "required", tools=[LOOSE]), pythonic)
    assert parsed("pythonic", pythonic) == [("poke", {}), ("poke", {"a": 1})]
    single = build(compiler, "pythonic", "required", tools=[LOOSE], parallel_tool_calls=False)
    assert not accepts(compiler, tokenizer, single, pythonic)
