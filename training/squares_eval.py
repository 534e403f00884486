"""Accuracy of a squares model per conversation shape, by real generation (no server).

Each conversation goes the way inference takes it: `lower_messages`, the engine's
`render_prompt`, the images decoded from their PNG bytes by `vlmserve.common.images.decode_image`, then
greedy `mlx_vlm.generate`; tool calls are read with the engine's Hermes parser.

    python -m training.squares_eval --model models/qwen2-vl-squares --n 50
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from training.squares import SquaresSample, make_samples
from training.squares_conversations import (
    SCREENSHOT_ARGUMENTS,
    SCREENSHOT_TOOL_NAME,
    Conversation,
    agent_first_turn,
    agent_follow_up,
    agent_tool_result,
    image_in_turn,
    png_image_part,
    user_image,
)
from vlmserve.common.images import decode_image
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.prep.prompt import render_prompt
from vlmserve.engine.toolcalls.parsers import TextPiece, ToolCallPiece
from vlmserve.engine.toolcalls.registry import HERMES_FORMAT, make_parser
from vlmserve.engine.v1 import engine_pb2 as pb

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "models" / "qwen2-vl-squares"
# Not the training seed (0) nor its in-training eval seed (777001).
DEFAULT_EVAL_SEED = 424_242

ConversationFor = Callable[[SquaresSample, bool], Conversation]


def _image(
    sample: SquaresSample, present: bool, detail: pb.ImageDetail.ValueType = pb.IMAGE_DETAIL_UNSPECIFIED
) -> pb.Part | None:
    return png_image_part(sample.png_bytes(), detail) if present else None


# shape -> (sample, image present?) -> the conversation a client would send.
SHAPES: dict[str, ConversationFor] = {
    "user_image": lambda s, present: user_image(_image(s, present), s.answer),
    "user_image_text_first": lambda s, present: user_image(_image(s, present), s.answer, text_first=True),
    "agent_tool_text_image": lambda s, present: agent_tool_result(_image(s, present), s.answer),
    "agent_tool_image_only": lambda s, present: agent_tool_result(
        _image(s, present), s.answer, with_text=False
    ),
    "agent_tool_detail_high": lambda s, present: agent_tool_result(
        _image(s, present, pb.IMAGE_DETAIL_HIGH), s.answer, with_text=False
    ),
    "assistant_image": lambda s, present: image_in_turn(_image(s, present), s.answer),
    "assistant_image_only": lambda s, present: image_in_turn(_image(s, present), s.answer, with_text=False),
    "system_image": lambda s, present: image_in_turn(_image(s, present), s.answer, role=pb.ROLE_SYSTEM),
    "agent_follow_up": lambda s, present: agent_follow_up(
        _image(s, present), s.answer, previous_answer=s.answer
    ),
}


def generate_reply(model: Any, processor: Any, conversation: Conversation, max_tokens: int = 40) -> str:
    """The model's raw reply text (tool-call markup included), greedy."""
    from mlx_vlm.generate.dispatch import generate as _generate

    generate: Any = _generate  # its annotations say image paths; it takes PIL images too
    rendered = render_prompt(
        lower_messages(conversation.messages), template=processor.tokenizer, tools=conversation.tools
    )
    images = [decode_image(image.part.data) for image in rendered.images]
    result = generate(
        model,
        processor,
        rendered.text,
        image=images or None,
        max_tokens=max_tokens,
        temperature=0.0,
        verbose=False,
    )
    return str(result.text)


def is_screenshot_call(reply: str) -> bool:
    """Exactly one `screenshot` call with `{}` arguments, and no visible text."""
    parser = make_parser(HERMES_FORMAT)
    pieces = [*parser.feed(reply), *parser.finish()]
    calls = [piece.call for piece in pieces if isinstance(piece, ToolCallPiece)]
    text = "".join(piece.text for piece in pieces if isinstance(piece, TextPiece)).strip()
    return (
        len(calls) == 1
        and calls[0].name == SCREENSHOT_TOOL_NAME
        and calls[0].arguments.replace(" ", "") == SCREENSHOT_ARGUMENTS
        and not text
    )


def is_correct(conversation: Conversation, reply: str) -> bool:
    if conversation.tool_call is not None:
        return is_screenshot_call(reply)
    return reply.strip() == conversation.answer


def evaluate(model: Any, processor: Any, samples: Sequence[SquaresSample]) -> dict[str, float]:
    """Accuracy per shape with the image, per shape's control without it, and the agent's call."""
    accuracy: dict[str, float] = {}
    for shape, build in SHAPES.items():
        for present, name in ((True, shape), (False, f"control_{shape}")):
            hits = [
                is_correct(c, generate_reply(model, processor, c))
                for c in (build(s, present) for s in samples)
            ]
            accuracy[name] = sum(hits) / len(hits)
    first_turn = agent_first_turn()
    accuracy["agent_call"] = float(is_correct(first_turn, generate_reply(model, processor, first_turn)))
    return accuracy


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--n", type=int, default=50, help="images per shape")
    parser.add_argument("--seed", type=int, default=DEFAULT_EVAL_SEED)
    args = parser.parse_args(argv)
    from mlx_vlm.utils import load

    model, processor = load(str(args.model))
    for name, value in evaluate(model, processor, make_samples(args.seed, args.n)).items():
        print(f"{name:40s} {value:.3f}", flush=True)


if __name__ == "__main__":
    main()
