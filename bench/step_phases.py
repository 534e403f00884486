"""Where a B=1 engine step's time goes (issue 37.2: "say where the rest goes"), measured inside an
in-process Generator by timers around the step's parts, no engine code changed.

`StepPhases` wraps, for as long as it is open, the functions a decode step runs (class attributes
and `mlx.core`'s eval functions, put back on close) with a perf_counter timer each, and splits a
step's wall time into:

- `forward_graph`: building the language model's forward (mlx-vlm's Python: the layers' calls
  record the lazy graph; nothing computes yet);
- `device_wait`: inside MLX's eval calls (`mx.async_eval`, `mx.eval`) and reading the step's
  tokens back (`tolist`): the device computing, and the host waiting for it. On this CPU backend
  `async_eval` blocks until most of the graph has run (MLX bounds the tasks in flight), so the
  forward shows up here, not as overlap;
- `sampling`: the step's token draw (logits processors, penalty, argmax / top-p / top-k), its
  graph only;
- `detokenize`, `assemble` (stop sequences, thinking, tool-call parsing) and `events` (handing the
  events to the caller's queue): the tokens' way out;
- `step_other`: the rest of `StepRunner.run_step` (the runner's and the batch's bookkeeping, the
  prompt batch's stages with nothing to do);
- `loop_other`: the generation thread between two steps (intake, admission, the observer's
  metrics per token).

Nested timers are subtracted from their parents, so the phases add up to the step. A step that
advanced no decoding row (the prompt's prefill) is left out. Also measured: the generation
thread's CPU time per step (`time.thread_time`: what the thread itself computed, whatever the
machine's load: the Python above plus MLX's own work of dispatching the graph), and the MLX calls
per step: waiting evals (`mx.eval`), token reads (`tolist`: the one sync a plain step needs) and
`async_eval`s.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["StepPhases"]


class StepPhases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list[float]] = []
        self._restore: list[tuple[Any, str, Any]] = []
        # CPU seconds of the generation thread in the counted steps and between them.
        self.thread_cpu = 0.0

    def _wrap(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)
        stack, seconds, calls = self._stack, self.seconds, self.calls

        def timed(*args: Any, **kwargs: Any) -> Any:
            # [start, seconds spent in nested timers]
            frame = [time.perf_counter(), 0.0]
            stack.append(frame)
            try:
                return original(*args, **kwargs)
            finally:
                stack.pop()
                spent = time.perf_counter() - frame[0]
                seconds[phase] += spent - frame[1]
                calls[phase] += 1
                if stack:
                    stack[-1][1] += spent

        self._restore.append((owner, name, original))
        setattr(owner, name, timed)

    def _wrap_step(self, runner: Any) -> None:
        """`run_step` as `step_other` (less its nested phases), and the time since the previous
        step ended as `loop_other`; a step that advanced no decoding row (the prompt's prefill,
        nothing to do) is not counted: its phases are taken back out."""
        original = runner.run_step
        phases = self
        ended: list[tuple[float, float]] = []  # the last step's end: (wall, thread CPU)

        def step(*args: Any, **kwargs: Any) -> Any:
            before = (dict(phases.seconds), dict(phases.calls))
            cpu = time.thread_time()
            started = time.perf_counter()
            frame = [started, 0.0]
            phases._stack.append(frame)
            try:
                result = original(*args, **kwargs)
            finally:
                phases._stack.pop()
            now, cpu_now = time.perf_counter(), time.thread_time()
            if result.advanced:
                phases.seconds["step_other"] += now - started - frame[1]
                phases.calls["steps"] += 1
                phases.thread_cpu += cpu_now - cpu
                if ended:
                    phases.seconds["loop_other"] += started - ended[-1][0]
                    phases.thread_cpu += cpu - ended[-1][1]
            else:
                phases.seconds.clear()
                phases.seconds.update(before[0])
                phases.calls.clear()
                phases.calls.update(before[1])
            ended[:] = [(now, cpu_now)]
            return result

        self._restore.append((runner, "run_step", original))
        runner.run_step = step

    @contextmanager
    def watching(self) -> Iterator[StepPhases]:
        """The timers in place (generation thread's calls only matter: nothing else runs them)."""
        import mlx.core as mx

        from vlmserve.engine.loop.batch import DecodeBatch
        from vlmserve.engine.loop.draw import TokenDraw
        from vlmserve.engine.loop.runner import StepRunner
        from vlmserve.engine.output.assembler import OutputAssembler
        from vlmserve.engine.output.detokenizer import IncrementalDetokenizer

        wraps: list[tuple[Any, str, str]] = [
            (DecodeBatch, "_forward", "forward_graph"),
            (DecodeBatch, "_pending_rows_tokens", "device_wait"),
            (mx, "async_eval", "device_wait"),
            (mx, "eval", "device_wait"),
            (TokenDraw, "sample", "sampling"),
            (IncrementalDetokenizer, "add", "detokenize"),
            (OutputAssembler, "feed", "assemble"),
        ]
        from vlmserve.engine.jobs import Job

        wraps.append((Job, "emit", "events"))
        for owner, name, phase in wraps:
            self._wrap(owner, name, phase)
        self._wrap_step(StepRunner)
        syncs = self._count_syncs(mx)
        try:
            yield self
        finally:
            syncs()
            for owner, name, original in reversed(self._restore):
                setattr(owner, name, original)
            self._restore.clear()

    def _count_syncs(self, mx: Any) -> Callable[[], None]:
        """Count the waiting eval calls (`mx.eval`) and `async_eval`s (the token reads are the
        timed `_pending_rows_tokens` calls)."""
        calls = self.calls
        original_eval, original_async = mx.eval, mx.async_eval

        def counted_eval(*args: Any, **kwargs: Any) -> Any:
            calls["sync:eval"] += 1
            return original_eval(*args, **kwargs)

        def counted_async(*args: Any, **kwargs: Any) -> Any:
            calls["async_eval"] += 1
            return original_async(*args, **kwargs)

        mx.eval, mx.async_eval = counted_eval, counted_async

        def restore() -> None:
            mx.eval, mx.async_eval = original_eval, original_async

        return restore

    def per_step(self) -> dict[str, Any]:
        """ms per decode step for each phase, and the MLX calls per step (waiting evals, token
        reads, async evals)."""
        steps = max(1, self.calls["steps"])
        device_calls = self.calls["device_wait"]
        evals, launched = self.calls.get("sync:eval", 0), self.calls.get("async_eval", 0)
        return {
            "steps": steps,
            "generation_thread_cpu_ms_per_step": 1000 * self.thread_cpu / steps,
            "ms_per_step": {name: 1000 * value / steps for name, value in sorted(self.seconds.items())},
            "calls_per_step": {
                "waiting evals (mx.eval)": evals / steps,
                "token reads (tolist)": (device_calls - evals - launched) / steps,
                "async_eval": launched / steps,
            },
        }
