"""`--distributed tensor`: one model over two engine processes on MLX's ring backend (loopback TCP).

The processes are started as `mlx.launch` starts them, with the ring environment set here
(MLX_HOSTFILE: one address per rank; MLX_RANK). The model is the qwen3_vl_moe family fixture,
whose mlx-vlm model shards itself (`shard`: attention heads and both MLP kinds split over the
ranks). Rank 0 serves gRPC; rank 1 follows its steps (distributed.py). Greedy output must be
token-for-token what the single-process engine gives, for text and image requests, alone and
batched together, with a cancelled request in between; stopping rank 0 stops rank 1.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests._fixture_models import RANDOM_MODEL_PATH
from tests._services import BIN, REPO, ServiceProcess, free_port, process_env, start_engine
from tests.engine._family_engine import CONVERSATIONS, greedy, running_engine
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]

FAMILY = "qwen3_vl_moe"
ASKED = ("text", "one_image", "two_images", "json_with_logprobs")


def _request(name: str) -> pb.GenerateRequest:
    if name != "json_with_logprobs":
        return greedy(CONVERSATIONS[name])
    # A grammar on every rank's sampler (llguidance) and the logprob scoring beside it.
    request = greedy(CONVERSATIONS["one_image"])
    request.response_format.json_object.SetInParent()
    request.sampling.logprobs = True
    request.sampling.top_logprobs = 2
    return request


@dataclass
class Ranks:
    leader: ServiceProcess
    follower: subprocess.Popen[bytes]
    follower_log: Path
    stub: pb_grpc.EngineServiceStub

    def logs(self) -> str:
        return (
            self.leader.log()[-3000:]
            + "\n--- rank 1 ---\n"
            + self.follower_log.read_text(errors="replace")[-3000:]
        )


def _ring(work: Path) -> dict[str, str]:
    """The ring environment of rank 0 (MLX_RANK is set per process): two loopback ranks."""
    hostfile = work / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"], [f"127.0.0.1:{free_port()}"]]))
    return {"MLX_HOSTFILE": str(hostfile), "MLX_RANK": "0"}


def _answer(stub: pb_grpc.EngineServiceStub, name: str) -> pb.GenerateResult:
    return stub.GenerateUnary(pb.GenerateUnaryRequest(request=_request(name)), timeout=120).result


@pytest.fixture(scope="module")
def one_process(family_models: dict[str, Path]) -> dict[str, pb.GenerateResult]:
    with running_engine(family_models[FAMILY]) as (_engine, stub):
        return {name: _answer(stub, name) for name in ASKED}


def _start_ranks(
    work: Path, model: Path, extra: tuple[str, ...] = ()
) -> tuple[ServiceProcess, subprocess.Popen[bytes], Path]:
    """Rank 1 first (it waits for rank 0 in the ring), then rank 0 until it serves."""
    ring = _ring(work)
    options = ("--distributed", "tensor", *extra)
    follower_log = work / "rank1.log"
    with follower_log.open("wb") as log:
        follower = subprocess.Popen(
            [str(BIN / "vlmserve-engine"), *options, "--model", str(model), "--address", "127.0.0.1:0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**process_env(), **ring, "MLX_RANK": "1"},
            cwd=REPO,
        )
    try:
        leader = start_engine(work, model=str(model), extra=options, env=ring)
    except BaseException:
        follower.kill()
        follower.wait()
        raise
    return leader, follower, follower_log


@pytest.fixture(scope="module")
def ranks(family_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ranks]:
    leader, follower, follower_log = _start_ranks(
        tmp_path_factory.mktemp("distributed"), family_models[FAMILY]
    )
    with grpc.insecure_channel(leader.address) as channel:
        yield Ranks(leader, follower, follower_log, pb_grpc.EngineServiceStub(channel))
    leader.stop()
    try:
        follower.wait(timeout=30)
    except subprocess.TimeoutExpired:
        follower.kill()
        follower.wait()


def _same(result: pb.GenerateResult, expected: pb.GenerateResult) -> None:
    assert result.text == expected.text
    assert result.usage.input_tokens == expected.usage.input_tokens
    assert result.usage.output_tokens == expected.usage.output_tokens
    assert result.finish_reason == expected.finish_reason


@pytest.mark.parametrize("name", ASKED)
def test_greedy_output_matches_one_process(
    ranks: Ranks, one_process: dict[str, pb.GenerateResult], name: str
) -> None:
    result = _answer(ranks.stub, name)
    _same(result, one_process[name])
    if name == "json_with_logprobs":
        assert result.text.startswith("{")
        assert result.logprobs  # scored on rank 0 (its text pieces)


def test_batched_requests_and_a_cancel_keep_the_ranks_in_step(
    ranks: Ranks, one_process: dict[str, pb.GenerateResult]
) -> None:
    """Requests joining and leaving the batch at different steps, one cancelled by its caller
    after its first token: rank 1 must run every step with rank 0 or the collectives hang."""
    results: dict[str, pb.GenerateResult] = {}
    errors: list[BaseException] = []

    def ask(name: str) -> None:
        try:
            results[name] = _answer(ranks.stub, name)
        except BaseException as error:
            errors.append(error)

    cancelled = ranks.stub.Generate(greedy(CONVERSATIONS["text"], max_tokens=200), timeout=120)
    assert next(cancelled).WhichOneof("event") is not None
    threads = [threading.Thread(target=ask, args=(name,)) for name in ASKED]
    for thread in threads:
        thread.start()
    cancelled.cancel()
    for thread in threads:
        thread.join(180)
    assert not errors, ranks.logs()
    for name in ASKED:
        _same(results[name], one_process[name])
    # Still in step afterwards.
    _same(_answer(ranks.stub, "one_image"), one_process["one_image"])


def test_sampled_requests_run_on_every_rank(ranks: Ranks) -> None:
    """Unseeded sampling: rank 0 pins a seed, so rank 1 draws the same tokens and stays in step."""
    request = greedy(CONVERSATIONS["text"], max_tokens=8)
    request.sampling.temperature = 1.0
    first = ranks.stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=120).result
    assert first.usage.output_tokens > 0
    assert ranks.follower.poll() is None, ranks.logs()


def test_stopping_rank_0_stops_the_other_ranks(
    ranks: Ranks, one_process: dict[str, pb.GenerateResult]
) -> None:
    """SIGTERM reaches every rank (mlx.launch, a service manager): a follower keeps serving rank
    0's forwards while it drains, and leaves cleanly on rank 0's stop plan."""
    ranks.follower.send_signal(signal.SIGTERM)
    _same(_answer(ranks.stub, "text"), one_process["text"])
    ranks.leader.stop()
    assert ranks.follower.wait(timeout=60) == 0, ranks.logs()


def test_a_model_mlx_vlm_cannot_shard_stops_every_rank_at_load(tmp_path: Path) -> None:
    ring = _ring(tmp_path)
    command = [str(BIN / "vlmserve-engine"), "--distributed", "tensor", "--model", str(RANDOM_MODEL_PATH)]
    ranks = [
        subprocess.Popen(
            [*command, "--address", f"127.0.0.1:{free_port()}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**process_env(), **ring, "MLX_RANK": str(rank)},
            cwd=REPO,
        )
        for rank in (1, 0)
    ]
    outputs = [process.communicate(timeout=120)[0].decode(errors="replace") for process in ranks]
    assert [process.returncode for process in ranks] == [1, 1], outputs
    for output in outputs:
        assert "cannot be loaded with --distributed tensor" in output
        assert "does not support tensor parallelism" in output


def test_without_a_distributed_environment_the_engine_says_how_to_start_it() -> None:
    environment = {k: v for k, v in process_env().items() if not k.startswith("MLX_")}
    completed = subprocess.run(
        [str(BIN / "vlmserve-engine"), "--distributed", "tensor", "--model", str(RANDOM_MODEL_PATH)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert "--distributed needs the processes started by mlx.launch" in completed.stderr


def test_a_follower_whose_rank_0_died_leaves_after_its_grace(
    family_models: dict[str, Path], tmp_path: Path
) -> None:
    """A dead peer leaves MLX's collectives blocked, not failed: a signalled follower would wait
    for rank 0's stop plan forever (and mlx.launch, which signals the others when one rank dies,
    with it). It waits --drain-seconds + 10 s at most."""
    leader, follower, _log = _start_ranks(tmp_path, family_models[FAMILY], ("--drain-seconds", "0"))
    try:
        leader.process.kill()
        leader.process.wait()
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
