"""training/loop.py resizes the fixture's text model in config.json and the ModelConfig alike, so
`mlx_vlm.load` reads a resized fixture unchanged (the merger's output width follows the text width)."""

from __future__ import annotations

from training.loop import FIXTURE_DIR, resized_config_json


def test_resized_config_json_changes_only_the_named_keys() -> None:
    plain = resized_config_json(FIXTURE_DIR, {})
    wider = resized_config_json(FIXTURE_DIR, {"hidden_size": 256, "num_hidden_layers": 4, "rope_theta": 1e4})
    assert (wider["hidden_size"], wider["vision_config"]["hidden_size"]) == (256, 256)
    assert (wider["num_hidden_layers"], wider["max_window_layers"], wider["rope_theta"]) == (4, 4, 1e4)
    untouched = {"hidden_size", "num_hidden_layers", "max_window_layers", "rope_theta", "vision_config"}
    assert {k: v for k, v in wider.items() if k not in untouched} == {
        k: v for k, v in plain.items() if k not in untouched
    }
