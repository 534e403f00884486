"""Fixture-model creation and (later) training for the tiny Qwen2-VL used by tests and demos."""
