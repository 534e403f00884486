"""`vlmserve models` reads family, size, context and modalities from a model's files (no weights
loaded); `vlmserve doctor` says what the machine gives the engine and fails on a taken port."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

from vlmserve.cli import doctor, models

ROOT = Path(__file__).resolve().parents[2]


def write_model(folder: Path, config: dict[str, Any], tensors: dict[str, tuple[str, list[int]]]) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    header: dict[str, Any] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return folder


def test_a_plain_and_a_quantized_model(tmp_path: Path) -> None:
    plain = write_model(
        tmp_path / "all" / "plain",
        {"model_type": "gemma3", "text_config": {"max_position_embeddings": 8192}, "vision_config": {}},
        {"a.weight": ("F32", [10, 20]), "b.weight": ("F32", [5])},
    )
    quantized = write_model(
        tmp_path / "all" / "q4",
        {"model_type": "qwen2_5_vl", "max_position_embeddings": 32768, "quantization": {"bits": 4},
         "image_token_id": 1, "video_token_id": 2, "audio_config": {}},
        {"w.weight": ("U32", [8, 2]), "w.scales": ("F16", [8, 1]), "w.biases": ("F16", [8, 1])},
    )  # fmt: skip
    one = models.describe(plain)
    assert (one.family, one.parameters, one.context, one.modalities) == (
        "gemma3",
        205,
        8192,
        ("text", "image"),
    )
    q = models.describe(quantized)
    # 16 uint32 words of 8 four-bit values each; scales and biases are not parameters.
    assert (q.parameters, q.quantization_bits, q.context) == (128, 4, 32768)
    assert q.modalities == ("text", "image", "video", "audio")
    assert [name for name, _ in models.find_models(tmp_path / "all")] == ["plain", "q4"]
    assert models.find_models(plain) == [("plain", plain)]


def test_a_models_file_and_a_broken_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # relative models are the current folder's, as serve takes them
    write_model(tmp_path / "m", {"model_type": "qwen2_vl"}, {"x": ("F32", [3])})
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json", encoding="utf-8")
    file = tmp_path / "models.toml"
    file.write_text('[[models]]\nid = "mine"\nmodel = "m"\n\n[[models]]\nid = "bad"\nmodel = "broken"\n')
    assert models.main([str(file)]) == 1  # one could not be read: said, and the status says so
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["MODEL", "FAMILY", "PARAMS", "ON", "DISK", "CONTEXT", "MODALITIES"]
    assert "mine" in out and "qwen2_vl" in out and "bad" in out and "? (" in out


def test_a_hugging_face_hub_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "hub"
    model = cache / "models--mlx-community--Tiny-VL-4bit"
    write_model(model / "blobs", {"model_type": "qwen2_vl"}, {"x": ("F32", [7])})
    snapshot = model / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):  # the hub's layout: links into blobs/
        (snapshot / name).symlink_to(model / "blobs" / name)
    (cache / "datasets--x--y").mkdir()
    assert models.find_models(cache) == [("mlx-community/Tiny-VL-4bit", snapshot)]
    assert models.describe(snapshot).parameters == 7
    assert models.main([str(cache), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "mlx-community/Tiny-VL-4bit"


def test_the_default_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert models.default_path({"HF_HOME": "/hf"}) == Path("/hf/hub")
    assert models.default_path({"HF_HUB_CACHE": "/c", "HF_HOME": "/hf"}) == Path("/c")
    (tmp_path / "models").mkdir()
    assert models.default_path({"HF_HOME": "/hf"}) == Path("models")


def test_the_committed_fixtures(capsys: pytest.CaptureFixture[str]) -> None:
    assert models.main([str(ROOT / "models"), "--json"]) == 0
    rows = {row["name"]: row for row in map(json.loads, capsys.readouterr().out.splitlines())}
    squares = rows["qwen2-vl-squares"]
    assert squares["family"] == "qwen2_vl" and squares["context"] == 65536
    assert 1_000_000 < squares["parameters"] < 3_000_000 and "image" in squares["modalities"]


def test_doctor_reports_and_fails_on_a_taken_port(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert doctor.main(["--port", str(port), "--engine-address", "127.0.0.1:0", "--json"]) == 1
    found = {check["name"]: check for check in json.loads(capsys.readouterr().out)}
    assert found["facade port"]["status"] == "fail"
    assert found["engine address"]["status"] == "ok"
    assert found["mlx"]["status"] == "ok" and "backend CPU" in found["mlx"]["detail"]
    assert found["memory"]["status"] == "ok" and "GiB total" in found["memory"]["detail"]
    assert found["blas"]["status"] in ("ok", "warn")


def test_doctor_on_a_unix_socket_and_remote_targets(tmp_path: Path) -> None:
    socket_path = tmp_path / "engine.sock"
    assert doctor.address_check("engine", f"unix:{socket_path}").status == "ok"
    socket_path.touch()
    assert doctor.address_check("engine", f"unix:{socket_path}").status == "warn"
    assert doctor.address_check("engine", "dns:///engines:50051").status == "ok"
