"""Recording stand-in for a Responses endpoint, used to see what the Codex CLI really sends.

Not a test: run it by hand (``python tests/codex/record_codex_requests.py --help``). It listens on
127.0.0.1 only, writes every request (headers + JSON body) to a folder, and answers POST
/v1/responses with a minimal valid Responses SSE stream. With ``--view-image PATH`` the first turn
answers with a ``view_image`` function call on PATH, so the second turn carries Codex's image-only
``function_call_output``. Any proxied (CONNECT / absolute-URL) request is logged and refused, which
shows whether Codex tried to reach anything beyond loopback.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_counter = itertools.count()
_lock = threading.Lock()


def _sse(event_type: str, payload: dict[str, Any], seq: Iterator[int]) -> bytes:
    body = {"type": event_type, "sequence_number": next(seq), **payload}
    return f"event: {event_type}\ndata: {json.dumps(body)}\n\n".encode()


def _response_shell(response_id: str, model: str, status: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": [],
        "usage": None,
    }


def _has_tool_output(body: dict[str, Any]) -> bool:
    items = body.get("input")
    return isinstance(items, list) and any(
        isinstance(item, dict) and item.get("type") == "function_call_output" for item in items
    )


SCENARIOS = ("ok", "incomplete", "failed", "truncated", "no_usage", "no_item_done", "data_only", "minimal")


def stream_reply(body: dict[str, Any], view_image_path: str | None, scenario: str) -> bytes:
    """One whole SSE reply: a view_image call on turn 1 (if asked), else a short message.

    ``scenario`` bends the ending so Codex's handling of each can be observed.
    """
    n = next(_counter)
    response_id = f"resp_rec{n}"
    model = str(body.get("model", "default"))
    seq = itertools.count()
    out = [
        _sse("response.created", {"response": _response_shell(response_id, model, "in_progress")}, seq),
        _sse("response.in_progress", {"response": _response_shell(response_id, model, "in_progress")}, seq),
    ]
    if view_image_path is not None and not _has_tool_output(body):
        item: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_rec{n}",
            "call_id": f"call_rec{n}",
            "name": "view_image",
            "arguments": json.dumps({"path": view_image_path}),
            "status": "completed",
        }
        added = {**item, "arguments": "", "status": "in_progress"}
        out.append(_sse("response.output_item.added", {"output_index": 0, "item": added}, seq))
        out.append(
            _sse(
                "response.function_call_arguments.delta",
                {"item_id": item["id"], "output_index": 0, "delta": item["arguments"]},
                seq,
            )
        )
        out.append(
            _sse(
                "response.function_call_arguments.done",
                {"item_id": item["id"], "output_index": 0, "arguments": item["arguments"]},
                seq,
            )
        )
    else:
        text = "Recorded. The image shows a test pattern."
        item = {
            "type": "message",
            "id": f"msg_rec{n}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }
        added = {**item, "status": "in_progress", "content": []}
        part0 = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        loc = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        out.append(_sse("response.output_item.added", {"output_index": 0, "item": added}, seq))
        out.append(_sse("response.content_part.added", {**loc, "part": part0}, seq))
        out.append(_sse("response.output_text.delta", {**loc, "delta": text, "logprobs": []}, seq))
        out.append(_sse("response.output_text.done", {**loc, "text": text, "logprobs": []}, seq))
        out.append(_sse("response.content_part.done", {**loc, "part": item["content"][0]}, seq))
    if scenario != "no_item_done":
        out.append(_sse("response.output_item.done", {"output_index": 0, "item": item}, seq))
    if scenario == "truncated":
        return b"".join(out)
    if scenario == "failed":
        failed = _response_shell(response_id, model, "failed")
        error = {"code": "server_error", "message": "recorder: engine failed"}
        failed["error"] = error
        out.append(_sse("error", {**error, "param": None}, seq))
        out.append(_sse("response.failed", {"response": failed}, seq))
        return b"".join(out)
    final_status = "incomplete" if scenario == "incomplete" else "completed"
    final = _response_shell(response_id, model, final_status)
    final["output"] = [item]
    final["usage"] = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 10,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 110,
    }
    if scenario == "no_usage":
        final["usage"] = None
    if scenario == "incomplete":
        final["incomplete_details"] = {"reason": "max_output_tokens"}
    out.append(_sse(f"response.{final_status}", {"response": final}, seq))
    out.append(b"data: [DONE]\n\n")
    if scenario == "minimal":
        kept = (b"event: response.output_item.done", b"event: response.completed")
        out = [chunk for chunk in out if chunk.startswith(kept)]
    joined = b"".join(out)
    if scenario == "data_only":
        joined = b"".join(line + b"\n" for line in joined.split(b"\n") if not line.startswith(b"event:"))
    return joined


def make_handler(
    log_dir: Path,
    view_image_path: str | None,
    scenario: str,
    http_error: int | None,
    stall_seconds: float = 0.0,
    stall_fill: str = "none",
) -> type:
    class RecordingHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _record(self, body: bytes) -> dict[str, Any] | None:
            parsed: dict[str, Any] | None = None
            try:
                parsed = json.loads(body) if body else None
            except (UnicodeDecodeError, json.JSONDecodeError):
                parsed = None
            entry = {
                "method": self.command,
                "path": self.path,
                "headers": dict(self.headers.items()),
                "body_bytes": len(body),
                "body": parsed,
            }
            with _lock:
                index = len(list(log_dir.glob("req_*.json")))
                (log_dir / f"req_{index:03d}.json").write_text(json.dumps(entry, indent=1))
            return parsed

        def _reply(self, status: int, content_type: str, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_CONNECT(self) -> None:
            self._record(b"")
            self._reply(403, "text/plain", b"recorder: non-loopback traffic refused\n")

        def do_GET(self) -> None:
            self._record(b"")
            if self.path.startswith("/v1/models"):
                models = {"object": "list", "data": [{"id": "default", "object": "model", "owned_by": "rec"}]}
                self._reply(200, "application/json", json.dumps(models).encode())
            else:
                self._reply(404, "application/json", b'{"error": {"message": "not recorded"}}')

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            parsed = self._record(body)
            if not self.path.endswith("/responses") or not isinstance(parsed, dict):
                self._reply(404, "application/json", b'{"error": {"message": "not recorded"}}')
                return
            if http_error is not None:
                error = {
                    "error": {
                        "message": "recorder: refused",
                        "type": "invalid_request_error",
                        "param": "input[0]",
                        "code": None,
                    }
                }
                self._reply(http_error, "application/json", json.dumps(error).encode())
                return
            payload = stream_reply(parsed, view_image_path, scenario)
            if stall_seconds <= 0:
                self._reply(200, "text/event-stream", payload)
                return
            # Stall after the first event, as a slow prefill would, filled with nothing, SSE
            # comments, or repeated in_progress events, to see which keep Codex's idle timer alive.
            first, rest = payload.split(b"\n\n", 1)
            ticks = int(stall_seconds)
            fill = {
                "none": b"",
                "comment": b": ping\n\n",
                "in_progress": first.replace(b"response.created", b"response.in_progress") + b"\n\n",
            }[stall_fill]
            pings = fill * ticks
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload) + len(pings)))
            self.end_headers()
            self.wfile.write(first + b"\n\n")
            self.wfile.flush()
            for _ in range(ticks):
                time.sleep(1.0)
                if fill:
                    self.wfile.write(fill)
                    self.wfile.flush()
            self.wfile.write(rest)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return RecordingHandler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--view-image", default=None, help="path Codex's view_image is asked to open")
    parser.add_argument("--scenario", choices=SCENARIOS, default="ok", help="how each streamed turn ends")
    parser.add_argument("--http-error", type=int, default=None, help="answer every turn with this status")
    parser.add_argument("--stall-seconds", type=float, default=0.0, help="pause after the first event")
    parser.add_argument(
        "--stall-fill", choices=("none", "comment", "in_progress"), default="none", help="sent each second"
    )
    args = parser.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    handler = make_handler(
        args.log_dir, args.view_image, args.scenario, args.http_error, args.stall_seconds, args.stall_fill
    )
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    print(f"listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
