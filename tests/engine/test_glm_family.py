"""GLM-4.5V / 4.6V (`glm4v`, `glm4v_moe`): what its row in docs/models.md claims beyond the
per-family tests (test_families.py and the others run it as every row) — its reasoning and its
tool calls as the model writes them, and its thinking switch.

GLM's generation prompt ends at `<|assistant|>`: the model opens `\\n<think>` itself, closes it,
then answers or calls a tool in the `<tool_call>NAME` + `<arg_key>`/`<arg_value>` form."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest
from transformers import AutoTokenizer

from tests._family_models import family_models  # noqa: F401  (fixture)
from vlmserve.engine.grammar.compiler import GrammarCompiler, after_thinking, constraint_for
from vlmserve.engine.output.assembler import OutputAssembler
from vlmserve.engine.prep.prompt import render_prompt
from vlmserve.engine.v1 import engine_pb2 as pb

from ._family_engine import greedy, running_engine, text, user

TOOLS = [{"type": "function", "function": {"name": "click", "parameters": {"type": "object"}}}]
CALL = "<tool_call>click\n<arg_key>x</arg_key>\n<arg_value>120</arg_value>\n</tool_call>"


@pytest.mark.parametrize(
    ("chunks", "reasoning", "visible", "calls"),
    [
        (
            ["\n<think>The button is top left.</think>\nIt is the OK button."],
            "The button is top left.",
            "It is the OK button.",
            [],
        ),
        # Streamed in pieces that split the markers.
        (["\n<th", "ink>Look first.</thi", "nk>\n", CALL], "Look first.", "", [("click", {"x": 120})]),
        # Thinking off (`enable_thinking` false): the prompt closed an empty block, plain answer.
        (["Done."], "", "Done.", []),
    ],
)
def test_glm_output_splits_into_reasoning_text_and_calls(
    chunks: list[str], reasoning: str, visible: str, calls: list[tuple[str, object]]
) -> None:
    assembler = OutputAssembler(stop=[], tool_call_format="glm47", tools=TOOLS)
    for chunk in chunks:
        assembler.feed(chunk)
    assembler.finish()
    assert "".join(assembler.reasoning) == reasoning
    assert "".join(assembler.text).strip() == visible
    assert [(call.name, json.loads(call.arguments)) for call in assembler.tool_calls] == calls


@pytest.mark.needs_model
def test_the_thinking_switch_and_a_replayed_thought(family_models: dict[str, Path]) -> None:  # noqa: F811
    """The engine reports GLM's template as thinking; `enable_thinking: false` reaches it (its
    `/nothink` and closed empty block: the prompt is the template's own); a thought replayed in
    the turn after the last user turn (an agent's tool loop) is rendered, as the template does."""
    model = family_models["glm4v"]
    tokenizer: Any = AutoTokenizer.from_pretrained(str(model))
    question = "Where is the OK button?"
    with running_engine(model) as (_, stub):
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        assert (info.thinking, info.tool_call_format) == (True, "glm47")
        for switch in (None, False):
            request = greedy([user(text(question))], max_tokens=4)
            if switch is not None:
                request.enable_thinking = switch
            counted = stub.CountTokens(pb.CountTokensRequest(request=request), timeout=60).input_tokens
            expected = tokenizer.apply_chat_template(
                [{"role": "user", "content": question}],
                add_generation_prompt=True,
                tokenize=False,
                **({} if switch is None else {"enable_thinking": switch}),
            )
            assert counted == len(tokenizer.encode(expected, add_special_tokens=False)), switch
    assert expected.endswith(question + "/nothink<|assistant|>\n<think></think>")
    replayed = render_prompt(
        [
            user(text(question)),
            pb.Message(
                role=pb.ROLE_ASSISTANT,
                reasoning_text="Take a screenshot first.",
                tool_calls=[pb.ToolCall(id="call_1", name="click", arguments='{"x": 120}')],
            ),
            pb.Message(
                role=pb.ROLE_TOOL,
                tool_output=pb.ToolOutput(call_id="call_1", parts=pb.PartList(parts=[text("ok")])),
            ),
        ],
        template=tokenizer,
        tools=[pb.Tool(function=pb.FunctionTool(name="click", parameters_json='{"type": "object"}'))],
        tool_call_format="glm47",
    )
    assert (
        "<|assistant|>\n<think>Take a screenshot first.</think>\n<tool_call>click\n<arg_key>x</arg_key>"
        in replayed.text
    )
    assert replayed.text.endswith("<|observation|>\n<tool_response>\nok\n</tool_response><|assistant|>")


PROMPT = "[gMASK]<sop><|user|>\nClick OK.<|assistant|>"
CLICK = pb.Tool(
    function=pb.FunctionTool(
        name="click",
        parameters_json='{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}',
        strict=True,
    )
)


@pytest.mark.needs_model
@pytest.mark.parametrize(
    ("mode", "prompt_end", "output", "allowed"),
    [
        # Tools offered (auto, an agent's default): the model may think, then answer or call.
        ("auto", "", "\n<think>OK is at the top.</think>\nIt is there.", True),
        ("auto", "", "\n<think>Click it.\nNow.</think>\n" + CALL, True),
        ("auto", "", "It is there.", True),
        # A forced call: one thought at most, then the call; never text.
        ("required", "", "\n<think>Click it.</think>\n" + CALL, True),
        ("required", "", CALL, True),
        ("required", "", "\n<think>Click it.</think>\nNo.", False),
        ("required", "", "<think>a</think><think>b</think>" + CALL, False),
        # Thinking off: the prompt closed an empty block, no other thought.
        ("required", "\n<think></think>", "\n<think>Click it.</think>\n" + CALL, False),
        ("required", "\n<think></think>", CALL, True),
    ],
)
def test_the_grammar_lets_glm_think_before_it_answers(
    family_models: dict[str, Path],  # noqa: F811
    mode: str,
    prompt_end: str,
    output: str,
    allowed: bool,
) -> None:
    """GLM opens `<think>` itself, and `<think>` is an added token no text terminal matches: with
    tools offered the grammar refused it, so the model could not think at all in an agent loop."""
    tokenizer: Any = AutoTokenizer.from_pretrained(str(family_models["glm4v"]))
    compiler = GrammarCompiler(tokenizer, [tokenizer.convert_tokens_to_ids("<|user|>")])
    constraint = constraint_for(
        compiler,
        tool_call_format="glm47",
        tools=[CLICK],
        tool_mode=mode,
        forced_name=None,
        parallel_tool_calls=True,
        max_tool_calls=None,
        response_format=None,
    )
    assert constraint is not None
    constraint = after_thinking(constraint, compiler, PROMPT + prompt_end, model_thinks=True)
    matcher = llguidance.LLMatcher(compiler.tokenizer, constraint.grammar)
    accepted = all(matcher.consume_token(t) for t in tokenizer.encode(output, add_special_tokens=False))
    assert (accepted and matcher.is_accepting()) is allowed


@pytest.mark.needs_model
def test_each_image_is_encoded_on_its_own(family_models: dict[str, Path]) -> None:  # noqa: F811
    """GLM-4V's tower attends within each image (transformers' `cu_seqlens` blocks). mlx-vlm
    0.7.10's splits its attention into at most three blocks (`mx.split` at the first two
    lengths), so from the third image of a request on, images attend to each other: with four
    images, its features for images 3 and 4 differ from each image's own. The engine encodes every image alone
    (its vision cache's path, `loop/vision_cache.py`), so a request's images are seen as
    transformers sees them; a clip's frames (here, images) too."""
    import mlx.core as mx

    from vlmserve.engine.config import EngineConfig
    from vlmserve.engine.jobs import JobKind
    from vlmserve.engine.loop.model_inputs import build_model_inputs, prompt_image_spans
    from vlmserve.engine.loop.vision_cache import VisionFeatureCache
    from vlmserve.engine.model import load_model
    from vlmserve.engine.prep.preparer import RequestPreparer

    from ._family_engine import SYSTEM, image, png

    config = EngineConfig(model=str(family_models["glm4v"]))
    loaded = load_model(
        config.model, max_output_tokens=16, image_limits=config.image_limits, max_images_per_request=4
    )
    preparer = RequestPreparer(loaded, max_request_pixels=1 << 24, decode_slots=1)
    screens = [image(png(64, 48, seed=seed)) for seed in (81, 82, 83, 84)]
    request = preparer.prepare(greedy([SYSTEM, user(text("Compare"), *screens)]), kind=JobKind.GENERATE)
    arrays = request.image_arrays()
    pixels, grids = mx.array(arrays["pixel_values"]), mx.array(arrays["image_grid_thw"])
    tower = loaded.model.vision_tower
    rows = [int(t * h * w) for t, h, w in arrays["image_grid_thw"].tolist()]
    starts = [sum(rows[:i]) for i in range(len(rows))]
    alone = mx.concatenate(
        [
            tower(pixels[s : s + n], grids[i : i + 1], output_hidden_states=False)
            for i, (s, n) in enumerate(zip(starts, rows, strict=True))
        ]
    )
    together = tower(pixels, grids, output_hidden_states=False)
    first_two = sum(rows[:2]) // 4  # features: 2 x 2 patches merged
    assert mx.allclose(together[:first_two], alone[:first_two], atol=1e-5).item()
    assert not mx.allclose(together[first_two:], alone[first_two:], atol=1e-4).item()  # mlx-vlm's
    # The engine always has a vision cache (0 MiB: it keeps nothing, the encoding path is the same).
    cache = VisionFeatureCache(0, namespace="glm4v")
    inputs = build_model_inputs(loaded, request, prompt_image_spans(loaded, request), vision_cache=cache)
    positions = [
        i for i, token in enumerate(request.prompt_ids) if token == loaded.model.config.image_token_id
    ]
    assert mx.allclose(inputs.embeds[0][mx.array(positions)], alone, atol=1e-5).item()


@pytest.mark.needs_model
@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_prompt_lookup_on_glm_changes_no_token(
    family_models: dict[str, Path],  # noqa: F811
    temperature: float,
) -> None:
    """`--speculative lookup` on GLM-4V (M-RoPE positions carried per row, an image in context):
    each request's tokens equal those without speculation, alone and in a mixed batch."""
    from vlmserve.engine.jobs import JobKind

    from ._family_engine import image, png
    from ._runs import run, run_each_alone
    from .test_speculative_decoding import _counter, _generator, _requests

    settings = {"prefill_chunk_tokens": 32, "step_tokens": 48, "speculative_position_cost": 0.01}
    plain = _generator("off", family_models["glm4v"], **settings)
    speculative = _generator("lookup", family_models["glm4v"], **settings)
    try:
        requests = _requests(plain, temperature)
        assert plain.preparer is not None
        look = pb.GenerateRequest(
            request_id="image",
            messages=[user(image(png(64, 48, seed=91)), text("Repeat: red blue red blue red blue red blue"))],
            sampling=pb.SamplingParams(max_tokens=24, temperature=temperature, seed=6),
        )
        requests["image"] = plain.preparer.prepare(look, kind=JobKind.GENERATE)
        verified = _counter(speculative, "speculative_verified_rows")
        expected = run_each_alone(plain, requests, f"glm-alone-{temperature}")
        alone = run_each_alone(speculative, requests, f"glm-spec-alone-{temperature}")
        together = run(speculative, requests, f"glm-mixed-{temperature}")
        for name in requests:
            assert alone[name].token_ids == expected[name].token_ids, name
            assert together[name].token_ids == expected[name].token_ids, name
        assert _counter(speculative, "speculative_verified_rows") > verified
    finally:
        plain.stop()
        speculative.stop()
