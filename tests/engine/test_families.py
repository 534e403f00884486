"""Every model family on the real engine: output token-identical to mlx-vlm on the same prompt.

One engine per family (training/families fixtures, random weights; tests/engine/_family_engine.py).
The reference for each request is mlx-vlm's own generation loop (`mlx_vlm.stream_generate`) on
a second copy of the model, loaded and cast exactly as the engine loads it, fed the prompt the
engine renders (`render_prompt`) and the images it decodes (`decode_image`). Random weights make the
greedy output an arbitrary but fixed token sequence, so any difference in positions, caches
(sliding windows, chunked attention), image token counts or eos handling shows as different text.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.engine._family_engine import (
    CONVERSATIONS,
    MAX_TOKENS,
    FamilyEngine,
    family,
    greedy,
    png,
    prompt_adds_special_tokens,
    reference_generate,
    reference_tokens,
    running_engine,
    text,
    user,
)
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.prep.prompt import render_prompt
from vlmserve.engine.v1 import engine_pb2 as pb

pytestmark = pytest.mark.needs_model

__all__ = ["family"]  # the fixture, imported for this module


def generated(result: pb.GenerateResult) -> str:
    """All the text generated: the thinking family's output is reasoning (its prompt opens
    `<think>` and the random-weight model never closes it), the others' is text."""
    return result.reasoning_text + result.text


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_greedy_output_matches_mlx_vlm(family: FamilyEngine, conversation: str) -> None:
    messages = CONVERSATIONS[conversation]
    result = family.stub.GenerateUnary(pb.GenerateUnaryRequest(request=greedy(messages)), timeout=120).result
    expected_text, expected_prompt_tokens = reference_generate(family.reference, messages, MAX_TOKENS)
    assert generated(result) == expected_text
    assert result.usage.input_tokens == expected_prompt_tokens
    assert result.finish_reason == pb.FINISH_REASON_LENGTH
    assert result.usage.output_tokens == MAX_TOKENS


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_count_tokens_matches_generate(family: FamilyEngine, conversation: str) -> None:
    request = greedy(CONVERSATIONS[conversation], max_tokens=1)
    counted = family.stub.CountTokens(pb.CountTokensRequest(request=request), timeout=60)
    result = family.stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=60).result
    assert counted.input_tokens == result.usage.input_tokens
    lowered = lower_messages(request.messages)  # tool-output images counted where they land
    images = [p for m in lowered for p in m.parts if p.WhichOneof("kind") == "image"]
    assert counted.image_count == result.usage.image_count == len(images)


def test_context_length_is_the_checkpoints(family: FamilyEngine) -> None:
    info = family.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.architecture == family.reference.info.architecture
    assert info.context_length == 4096  # max_position_embeddings of every fixture
    long_text = " ".join(["word"] * 5000)
    with pytest.raises(grpc.RpcError) as refused:
        family.stub.GenerateUnary(
            pb.GenerateUnaryRequest(request=greedy([user(text(long_text))])), timeout=60
        )
    assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE


def test_prompt_starts_with_one_bos(family: FamilyEngine) -> None:
    """Templates that write the BOS token must not get a second one from the tokenizer."""
    tokenizer = family.reference.tokenizer
    bos = tokenizer.bos_token
    request = greedy(CONVERSATIONS["text"], max_tokens=1)
    counted = family.stub.CountTokens(pb.CountTokensRequest(request=request), timeout=60).input_tokens
    assert family.reference.template is not None
    prompt = render_prompt(request.messages, template=family.reference.template).text
    ids = tokenizer.encode(prompt, add_special_tokens=prompt_adds_special_tokens(prompt, tokenizer))
    if bos:
        assert ids.count(tokenizer.bos_token_id) == 1
    assert counted == len(ids)


# Gemma 3's sliding-window layers keep a rotating cache that cannot be trimmed once past its
# window; Llama 4's chunked layers keep only their last chunk of keys, so a shared prefix that
# ends inside a kept state cannot be continued (such states serve only a prompt that extends all
# of them: test_prefix_cache_windowed.py). These prompts part inside it: prefilled afresh.
# Qwen3.5's Gated DeltaNet layers keep a recurrent state (an ArraysCache) that cannot be cut back
# to an arbitrary shared prefix: it is kept only at turn boundaries (the end of a prompt, of a
# generated turn: test_prefix_cache_hybrid.py, and the next-turn test below), and these prompts
# part elsewhere.
PREFIX_CACHE_UNSUPPORTED = frozenset({"gemma3", "gemma4", "llama4", "qwen3_5", "qwen3_5_moe"})

LONG_SYSTEM = pb.Message(
    role=pb.ROLE_SYSTEM,
    parts=[text("You describe pictures for a museum catalogue. " * 12 + "Keep every answer short.")],
)


def test_a_shared_prefix_reuses_the_cache_without_changing_output(family: FamilyEngine) -> None:
    """Sliding-window (gemma3) and chunked (llama4) caches must survive the prefix-cache trim."""
    first = [LONG_SYSTEM, user(text("Describe a calm harbour at noon."))]
    second = [LONG_SYSTEM, user(text("Describe a busy market in the rain."))]
    family.stub.GenerateUnary(pb.GenerateUnaryRequest(request=greedy(first)), timeout=120)
    result = family.stub.GenerateUnary(pb.GenerateUnaryRequest(request=greedy(second)), timeout=120).result
    expected_text, _ = reference_generate(family.reference, second, MAX_TOKENS)
    assert generated(result) == expected_text
    if family.name in PREFIX_CACHE_UNSUPPORTED:
        assert result.usage.cached_tokens == 0
    else:
        assert result.usage.cached_tokens > 16


def test_every_configured_eos_token_ends_the_turn(
    family: FamilyEngine, family_models: dict[str, Path], tmp_path: Path
) -> None:
    """The eos set is generation_config's list (Gemma's <end_of_turn>, Llama 4's <|eot|> and
    <|eom|> ...): a token in it ends the turn with STOP and is not shown. A greedy token of this
    model is made an eos token in a copy of the checkpoint, so the model really emits one."""
    import json
    import shutil

    messages = CONVERSATIONS["text"]
    tokens, _ = reference_tokens(family.reference, messages, 6)
    # The first token that did not occur before (stopping at an earlier occurrence would
    # stop sooner); a model repeating one token stops at once.
    stop_at = next((i for i in range(1, 6) if tokens[i] not in tokens[:i]), 0)
    copy = tmp_path / family.name
    shutil.copytree(family_models[family.name], copy)
    generation = json.loads((copy / "generation_config.json").read_text())
    configured = generation["eos_token_id"]
    configured = configured if isinstance(configured, list) else [configured]
    generation["eos_token_id"] = [*configured, tokens[stop_at]]
    (copy / "generation_config.json").write_text(json.dumps(generation))
    assert set(configured) <= family.reference.eos_token_ids  # the real set, all of it

    with running_engine(copy) as (_, stub):
        result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=greedy(messages)), timeout=120).result
    assert result.finish_reason == pb.FINISH_REASON_STOP
    assert result.usage.output_tokens == stop_at + 1  # the eos token counts as generated
    assert generated(result) == family.reference.tokenizer.decode(tokens[:stop_at], skip_special_tokens=True)


def test_a_short_shared_prefix_after_a_long_prompt(family: FamilyEngine) -> None:
    """Llama 4's chunked layers have dropped a short shared prefix by the end of a long prompt:
    the engine must notice the trim fell short and prefill afresh (it used to continue from the
    wrong keys)."""
    first = [LONG_SYSTEM, user(text("Describe a calm harbour at noon."))]
    short = pb.Message(
        role=pb.ROLE_SYSTEM,
        parts=[text("You describe pictures for a museum catalogue. " * 2 + "Use French.")],
    )
    second = [short, user(text("Describe a busy market in the rain."))]
    family.stub.GenerateUnary(pb.GenerateUnaryRequest(request=greedy(first)), timeout=120)
    result = family.stub.GenerateUnary(pb.GenerateUnaryRequest(request=greedy(second)), timeout=120).result
    expected_text, _ = reference_generate(family.reference, second, MAX_TOKENS)
    assert generated(result) == expected_text
    if family.name in PREFIX_CACHE_UNSUPPORTED:
        assert result.usage.cached_tokens == 0
    else:
        assert result.usage.cached_tokens > 16


def test_requests_running_together_match_each_alone(family: FamilyEngine) -> None:
    """Several requests in flight at once (interleaved or batched by the engine) each produce
    exactly the tokens they produce alone: rows must not leak into each other (positions, caches,
    image features, masks)."""
    names = ["text", "one_image", "two_images"]
    futures = [
        family.stub.GenerateUnary.future(
            pb.GenerateUnaryRequest(request=greedy(CONVERSATIONS[name])), timeout=180
        )
        for name in names
    ]
    results = [future.result().result for future in futures]
    for name, result in zip(names, results, strict=True):
        expected_text, expected_prompt_tokens = reference_generate(
            family.reference, CONVERSATIONS[name], MAX_TOKENS
        )
        got = (name, generated(result), result.usage.input_tokens)
        assert got == (name, expected_text, expected_prompt_tokens)


# Families whose processor has a cheaper view for `detail: low`: Qwen's pixel budget
# (image_inputs.DynamicResolution), SmolVLM without tiles, Llama 4 with one tile, Pixtral at half
# the longest edge, GLM-4V at its smallest pixel budget. Gemma 3 has a fixed token count per image.
DETAIL_CHANGES_TOKENS = frozenset(
    {
        "qwen2_5_vl",
        "qwen3_vl",
        "qwen3_vl_thinking",
        "qwen3_vl_moe",
        "qwen3_5",
        "qwen3_5_moe",
        "idefics3",
        "mistral3",
        "llama4",
        "glm4v",
        "glm4v_moe",
    }
)


@pytest.mark.parametrize("size", [(400, 100), (160, 320)])
def test_detail_low_looks_at_fewer_image_tokens(family: FamilyEngine, size: tuple[int, int]) -> None:
    data = png(*size, seed=3)

    def request(detail: pb.ImageDetail.ValueType) -> pb.GenerateRequest:
        part = pb.Part(image=pb.ImagePart(data=data, media_type="image/png", detail=detail))
        return greedy([user(part, text("What is this?"))], max_tokens=4)

    counts = {
        detail: family.stub.CountTokens(
            pb.CountTokensRequest(request=request(detail)), timeout=60
        ).input_tokens
        for detail in (pb.IMAGE_DETAIL_LOW, pb.IMAGE_DETAIL_AUTO, pb.IMAGE_DETAIL_HIGH)
    }
    low, auto, high = counts[pb.IMAGE_DETAIL_LOW], counts[pb.IMAGE_DETAIL_AUTO], counts[pb.IMAGE_DETAIL_HIGH]
    if family.name in DETAIL_CHANGES_TOKENS:
        assert low < auto <= high
    else:
        assert low == auto == high
    # The low view really runs: the model takes its arrays and the count is what it prefilled.
    result = family.stub.GenerateUnary(
        pb.GenerateUnaryRequest(request=request(pb.IMAGE_DETAIL_LOW)), timeout=120
    )
    assert result.result.usage.input_tokens == low
    assert result.result.usage.output_tokens == 4


def test_an_agents_next_turn_reuses_the_previous_one(family: FamilyEngine) -> None:
    """The agent loop: the next request repeats the conversation so far (the answer included)
    and adds a turn. It reuses the cache of the previous one (plain KV: the shared prefix;
    Qwen3.5's recurrent state, sliding-window and chunked caches: their snapshot at the end of the
    previous prompt or turn, or of its last message) and generates what a fresh prefill generates."""
    first = [LONG_SYSTEM, user(text("Describe a calm harbour at noon."))]
    answer = family.stub.GenerateUnary(pb.GenerateUnaryRequest(request=greedy(first)), timeout=120).result
    second = [
        *first,
        pb.Message(role=pb.ROLE_ASSISTANT, parts=[text(answer.text or "A harbour.")]),
        user(text("And at night?")),
    ]
    result = family.stub.GenerateUnary(pb.GenerateUnaryRequest(request=greedy(second)), timeout=120).result
    expected_text, _ = reference_generate(family.reference, second, MAX_TOKENS)
    assert generated(result) == expected_text
    # At least 90 % of the previous prompt (a thinking template renders the earlier turn without
    # the `<think>` its prompt ended with, Gemma 4's without its empty thought channel: the last
    # few tokens differ, and Gemma 4 keeps the end of the last message, loop/message_end.py).
    assert result.usage.cached_tokens >= 0.9 * answer.usage.input_tokens
