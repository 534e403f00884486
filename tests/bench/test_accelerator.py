"""bench/accelerator.py and bench/accelerator_pack.py, so the device script cannot rot between the
sessions that are lent a card: the published sizes laid over the fixtures, the bytes a decode step
reads, the output head's kept rows, the kernel images kept for the H100/H200; and (slow) the whole
path on this CPU with the fixtures' tiny shapes (`--smoke`)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.accelerator import (
    SHAPES,
    active_bytes,
    fraction,
    head_rows_kept,
    is_expert,
    main,
    published_config,
    text_fields,
)
from bench.accelerator_pack import ELF_IMAGE, FATBIN_MAGIC, elf_section, tree_bytes, zero_other_images
from bench.boundary_weight import CONFIGS
from training.families import FAMILIES
from training.families.vocab import build_tokenizer


def fixture_config(family: str) -> dict[str, object]:
    return FAMILIES[family].files(build_tokenizer(FAMILIES[family].tokenizer)).config


def test_qwen2_5_vl_7b_takes_the_published_sizes_at_the_top_level() -> None:
    fixture = fixture_config("qwen2_5_vl")
    before = json.dumps(fixture, sort_keys=True)
    config = published_config(fixture, SHAPES["qwen2_5_vl_7b"])
    assert json.dumps(fixture, sort_keys=True) == before  # the fixture is left as it was
    assert "text_config" not in config
    sizes = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads")
    assert [config[key] for key in sizes] == [3584, 28, 18944, 28]
    assert (config["num_key_value_heads"], config["vocab_size"]) == (4, 152064)
    assert config["rope_scaling"]["mrope_section"] == [16, 24, 24]
    assert config["vision_config"]["depth"] == 32
    assert config["vision_config"]["out_hidden_size"] == 3584
    # What the tokenizer decides stays the fixture's: its ids fit its tokenizer.
    assert config["eos_token_id"] == fixture["eos_token_id"]
    assert config["image_token_id"] == fixture["image_token_id"]


def test_qwen3_6_takes_boundary_weights_figures_inside_text_config() -> None:
    fixture = fixture_config("qwen3_5_moe")
    config = published_config(fixture, SHAPES["qwen3_6_35b_a3b"])
    text = text_fields(config)
    assert text is config["text_config"]
    for key, value in CONFIGS["Qwen3.6-35B-A3B"].items():  # one copy of those figures
        assert text[key] == value
    assert (text["hidden_size"], text["num_experts"], text["num_experts_per_tok"]) == (2048, 256, 8)
    assert text["model_type"] == "qwen3_5_moe_text"
    assert text["eos_token_id"] == fixture["text_config"]["eos_token_id"]  # type: ignore[index]
    assert config["vision_config"]["out_hidden_size"] == 2048
    assert "num_experts" not in config  # nothing leaks to the top level


@pytest.mark.parametrize(
    ("name", "published"),
    [("qwen2_5_vl_7b", 8.29e9), ("qwen3_6_35b_a3b", 35.1e9)],  # the model cards' counts
)
def test_the_shapes_have_the_published_parameter_counts(name: str, published: float) -> None:
    """mlx-vlm's Model at the laid-over sizes, its parameters lazy (nothing is allocated)."""
    from mlx.utils import tree_flatten

    from training.families.build import random_model

    shape = SHAPES[name]
    model = random_model(published_config(fixture_config(shape.family), shape), 0)
    flat: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    parameters = sum(value.size for _, value in flat)
    assert parameters == pytest.approx(published, rel=0.01)


def test_the_routed_experts_are_found_by_name() -> None:
    """is_expert finds mlx-vlm's stacked experts: 40 layers x 256 x (gate, up, down) of 512 x 2048;
    not the shared expert, not the router."""
    from mlx.utils import tree_flatten

    from training.families.build import random_model

    shape = SHAPES["qwen3_6_35b_a3b"]
    model = random_model(published_config(fixture_config(shape.family), shape), 0)
    flat: list[tuple[str, Any]] = tree_flatten(model.language_model.parameters())  # type: ignore[assignment]
    assert sum(value.size for name, value in flat if is_expert(name)) == 40 * 256 * 3 * 512 * 2048


def test_a_dense_step_reads_its_weights_and_every_layers_kv() -> None:
    text = {"num_hidden_layers": 28, "num_key_value_heads": 4}
    assert active_bytes(1000, 0, text, 64, 777) == {"weights": 1000, "kv": 777, "total": 1777}


def test_a_moe_step_reads_only_the_experts_a_token_routes_to() -> None:
    text = dict(SHAPES["qwen3_6_35b_a3b"].text)
    experts = 256 * 3 * 1000  # every expert's three projections
    counted = active_bytes(10_000 + experts, experts, text, 100, kv=0)
    assert counted["weights"] == 10_000 + 8 * 3 * 1000
    # 10 full-attention layers' KV (2 heads x 256, keys and values, bfloat16) at 100 tokens, and
    # 30 Gated DeltaNet layers' conv windows and states (float32), as boundary_weight counts them.
    states = 30 * (3 * (2 * 16 * 128 + 32 * 128) + 32 * 128 * 128) * 4
    assert counted["kv"] == 10 * 2 * 256 * 2 * 2 * 100 + states
    assert counted["total"] == counted["weights"] + counted["kv"]


def test_the_fraction_of_the_ceiling() -> None:
    assert fraction(100.0, 4_500_000_000, 3000.0) == pytest.approx(0.15)


@pytest.mark.parametrize(
    ("vocab", "tokenizer_size", "specials", "kept"),
    [
        (6, 6, [], [True] * 6),
        (6, 4, [], [True] * 4 + [False] * 2),  # ids past the tokenizer never win
        (6, 4, [1, 3], [True, False, True, False, False, False]),  # nor special tokens
        (3, 4, [5], [True] * 3),  # a special id past the head is ignored
    ],
)
def test_the_head_keeps_the_tokenizers_ordinary_rows(
    vocab: int, tokenizer_size: int, specials: list[int], kept: list[bool]
) -> None:
    assert head_rows_kept(vocab, tokenizer_size, specials) == kept


def fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    """A fatbin of (kind, arch, payload) entries: 64-byte entry headers, as nvcc writes them."""
    body = b""
    for kind, arch, payload in entries:
        header = bytearray(64)
        struct.pack_into("<HHIQ", header, 0, kind, 0x0101, 64, len(payload))
        struct.pack_into("<I", header, 28, arch)
        body += bytes(header) + payload
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def test_only_the_sm_90_images_keep_their_bytes() -> None:
    first = fatbin([(ELF_IMAGE, 80, b"\x11" * 40), (ELF_IMAGE, 90, b"\x22" * 24), (1, 120, b"\x33" * 16)])
    second = fatbin([(ELF_IMAGE, 90, b"\x44" * 8), (ELF_IMAGE, 100, b"\x55" * 32)])
    section = first + bytes(8) + second  # padding between fatbins
    data = bytearray(b"HEAD" + section + b"TAIL")
    zeroed = zero_other_images(data, 4, len(section))
    assert zeroed == 40 + 16 + 32
    assert data[:4] == b"HEAD" and data[-4:] == b"TAIL"
    assert data.count(b"\x22" * 24) == 1 and data.count(b"\x44" * 8) == 1
    for gone in (b"\x11" * 40, b"\x33" * 16, b"\x55" * 32):
        assert gone not in data
    assert len(data) == 8 + len(section)  # the layout is unchanged
    assert data.count(struct.pack("<I", FATBIN_MAGIC)) == 2  # headers stay


def test_elf_sections_are_found_by_name() -> None:
    binary = Path(sys.executable).resolve().read_bytes()
    text = elf_section(binary, ".text")
    assert text is not None and text[1] > 0
    assert elf_section(binary, ".nv_fatbin") is None
    assert elf_section(b"not an elf file", ".text") is None


def test_the_tree_that_travels_is_tracked_and_unignored_files(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/.accel/\n")  # 9 bytes
    (tmp_path / "tracked.txt").write_bytes(bytes(100))
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.txt", ".gitignore"], check=True)
    (tmp_path / "untracked.txt").write_bytes(bytes(7))
    (tmp_path / ".accel").mkdir()
    (tmp_path / ".accel" / "site.tar.xz").write_bytes(bytes(1000))  # carried, counted apart
    assert tree_bytes(tmp_path) == 9 + 100 + 7


@pytest.mark.slow
@pytest.mark.needs_model
def test_the_smoke_run_measures_both_servers_on_this_cpu(tmp_path: Path) -> None:
    out = tmp_path / "accelerator.json"
    peers_root = Path("/work/peers")
    argv = ["--smoke", "--shapes", "qwen3_6_35b_a3b", "--rounds", "1", "--tokens", "8"]
    argv += ["--work-dir", str(tmp_path / "models"), "--out", str(out), "--peers-root", str(peers_root)]
    assert main(argv) == 0
    row = json.loads(out.read_text())["shapes"]["qwen3_6_35b_a3b"]
    assert row["checkpoint"]["smoke"] is True
    config = json.loads((tmp_path / "models" / "qwen3_6_35b_a3b-smoke" / "config.json").read_text())
    assert config["quantization"]["bits"] == 4
    decode = row["decode"]
    assert decode["tok_per_s"]["forward_pipelined"] > 0
    assert decode["fraction_of_ceiling"]["forward_pipelined"] > 0
    step = decode["bytes_per_step"]
    assert step["total"] == step["weights"] + step["kv"] > 0
    summary = row["served"]["summary"]
    assert summary["single"]["vlmserve"]["best"] > 0 and summary["c8"]["vlmserve"]["best"] > 0
    if (peers_root / "mlx-vlm" / "bin").is_dir():  # the peer's venv (bench/peers_install.sh)
        assert row["served"]["started"]["mlx-vlm"] == "ok"
        assert summary["c8"]["mlx-vlm"]["vlmserve_ratio"] > 0
