"""The processes we start load grpc with our gRPC environment (service/vlmserve/server/grpc_env.py):
set before grpc is first imported, since grpc reads it once as it loads; a value of the user's
own wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vlmserve.server.grpc_env import GRPC_ENVIRONMENT, apply

# Records os.environ's gRPC variables at the moment `grpc` is first imported, then imports the
# entry module: what grpc saw.
_PROBE = """
import importlib, json, os, sys
seen = {}
class Probe:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and "grpc" not in seen:
            seen["grpc"] = {key: os.environ.get(key) for key in %(names)r}
        return None
sys.meta_path.insert(0, Probe())
importlib.import_module(%(module)r)
print(json.dumps(seen.get("grpc", {key: os.environ.get(key) for key in %(names)r} if %(after)r else None)))
"""

ENTRY_MODULES = ("vlmserve.engine.cli", "vlmserve.facade.cli", "vlmserve.cli.main")


def _seen_by_grpc(module: str, env: dict[str, str], after: bool = False) -> dict[str, str | None] | None:
    """What grpc saw as it loaded; with `after`, if the module never imports grpc, the
    environment it leaves (what the processes it starts inherit)."""
    names = sorted(GRPC_ENVIRONMENT)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE % {"names": names, "module": module, "after": after}],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    seen: dict[str, str | None] | None = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def _environment_without_grpc_variables() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in GRPC_ENVIRONMENT}


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_grpc_loads_with_our_environment_in_each_entry_point(module: str) -> None:
    # The launcher (`vlmserve`) may never import grpc itself: the processes it starts inherit
    # the environment it leaves.
    seen = _seen_by_grpc(module, _environment_without_grpc_variables(), after=module == "vlmserve.cli.main")
    assert seen == GRPC_ENVIRONMENT


def test_a_value_of_the_users_own_wins() -> None:
    env = _environment_without_grpc_variables() | {"GRPC_EXPERIMENTS": "-event_engine_dns"}
    seen = _seen_by_grpc("vlmserve.facade.cli", env)
    assert seen == {"GRPC_EXPERIMENTS": "-event_engine_dns"}


def test_apply_fills_only_what_is_unset() -> None:
    environ = {"OTHER": "1"}
    apply(environ)
    assert environ == {"OTHER": "1", **GRPC_ENVIRONMENT}
    environ = {"GRPC_EXPERIMENTS": "mine"}
    apply(environ)
    assert environ == {"GRPC_EXPERIMENTS": "mine"}
