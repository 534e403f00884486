"""The README's commands exist: its two commands for a fresh clone are still exactly `make run` and
`make test`, every `vlmserve COMMAND` it shows is a command, and every `make TARGET` a target."""

from __future__ import annotations

import re
from pathlib import Path

from vlmserve.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_still_two_commands_for_a_fresh_clone() -> None:
    section = README.split("## Two commands", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in section.strip().splitlines()]
    assert commands == ["make run", "make test"]


def test_every_vlmserve_command_shown_exists() -> None:
    # In inline code, or at the start of a line (the code blocks).
    shown = set(re.findall(r"(?:^|`)vlmserve ([a-z][a-z-]*)", README, re.MULTILINE))
    assert {"serve", "models", "doctor", "service"} <= shown
    assert shown <= set(COMMANDS), shown - set(COMMANDS)


def test_every_make_target_shown_exists() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.MULTILINE))
    shown = set(re.findall(r"`make ([a-z][a-z-]*)", README))
    assert shown and shown <= targets, shown - targets
