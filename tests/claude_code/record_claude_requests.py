"""Recording proxy in front of a facade, used to capture what Claude Code really sends.

Not a test: run it by hand (``python tests/claude_code/record_claude_requests.py --help``). It
listens on 127.0.0.1 only, writes every request (method, path, headers without credentials, JSON
body) to a folder, and forwards it unchanged to ``--upstream`` (a running facade), streaming the
answer back. Point ``ANTHROPIC_BASE_URL`` at it and run ``claude -p``; the files it writes are
what tests/claude_code/data holds. With ``--read PATH``, a turn that carries no tool_result yet is
answered here with a `tool_use` of Claude Code's Read tool on PATH (as Claude would), so the next
turn carries Read's real tool_result (for an image file: an image block).
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

_counter = itertools.count()
_lock = threading.Lock()
# Never written to disk.
_SECRET_HEADERS = {"authorization", "x-api-key", "cookie"}
# Hop-by-hop headers are the proxy's own.
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


def _has_tool_result(body: Any) -> bool:
    messages = body.get("messages") if isinstance(body, dict) else None
    return any(
        isinstance(block, dict) and block.get("type") == "tool_result"
        for message in messages or []
        if isinstance(message.get("content"), list)
        for block in message["content"]
    )


def tool_use_stream(name: str, arguments: dict[str, Any]) -> bytes:
    """A Messages stream whose answer is one tool_use of `name` with `arguments`."""
    usage = {"input_tokens": 1, "output_tokens": 0}
    message = {
        "id": "msg_rec",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "default",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    use = {"type": "tool_use", "id": "toolu_rec_call", "name": name, "input": {}}
    events = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": use},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": json.dumps(arguments)},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    ]
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def make_handler(
    upstream: str, out: Path, first_call: tuple[str, dict[str, Any]] | None
) -> type[BaseHTTPRequestHandler]:
    """Records and forwards; with `first_call` (tool name, input), a turn without a tool_result
    yet is answered here with that tool_use."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            with _lock:
                number = next(_counter)
            record: dict[str, Any] = {
                "method": self.command,
                "path": self.path,
                "headers": {
                    k.lower(): v for k, v in self.headers.items() if k.lower() not in _SECRET_HEADERS
                },
            }
            try:
                record["body"] = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                record["body_text"] = raw.decode(errors="replace")
            (out / f"{number:03d}-{self.command.lower()}.json").write_text(json.dumps(record, indent=1))
            body = record.get("body")
            messages_route = self.path.split("?")[0] == "/v1/messages"
            if first_call and messages_route and not _has_tool_result(body):
                payload = tool_use_stream(*first_call)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            with (
                httpx.Client(timeout=None) as client,
                client.stream(self.command, upstream + self.path, headers=headers, content=raw) as reply,
            ):
                self.send_response(reply.status_code)
                for name, value in reply.headers.items():
                    if name.lower() not in _HOP_HEADERS and name.lower() != "content-encoding":
                        self.send_header(name, value)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for piece in reply.iter_raw():
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        do_GET = do_POST = do_HEAD = do_DELETE = _forward

        def log_message(self, format: str, *args: Any) -> None:
            print(format % args, flush=True)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--upstream", required=True, help="the facade's URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--read", help="answer the first turn with a Read tool_use on this path")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    first_call = ("Read", {"file_path": args.read}) if args.read else None
    handler = make_handler(args.upstream.rstrip("/"), args.out, first_call)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    print(f"recording on http://127.0.0.1:{args.port} -> {args.upstream}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
