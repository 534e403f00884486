"""`vlmserve-engine`: serve one mlx-vlm model over gRPC.

    vlmserve-engine                                   # fixture model on 127.0.0.1:50051
    vlmserve-engine --model mlx-community/Qwen2-VL-2B-Instruct-4bit --address unix:/tmp/engine.sock

SIGTERM/SIGINT: health turns NOT_SERVING, new requests are refused, in-flight requests get
`--drain-seconds` to finish, then the rest are cancelled and the process exits.

Authentication (see grpc_auth.py): loopback and unix sockets may run open; any other address needs
`--auth-token-file` / $VLMSERVE_ENGINE_TOKEN or `--tls-client-ca`, else the engine refuses to start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from vlmserve.common.images import ImageLimits

from .generator import EngineConfig
from .grpc_auth import EngineSecurity, add_security_arguments
from .model import DTYPE_CHOICES, default_model
from .server import EngineServer

log = logging.getLogger("vlmserve.engine")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vlmserve-engine", description="Serve an mlx-vlm model over gRPC.")
    parser.add_argument(
        "--model",
        default=default_model(),
        help="local model directory or Hugging Face id (default: $VLMSERVE_MODEL or the committed fixture)",
    )
    parser.add_argument(
        "--address", default="127.0.0.1:50051", help="host:port, or unix:/path/to.sock (default: %(default)s)"
    )
    parser.add_argument("--host", default=None, help="with --port: overrides --address")
    parser.add_argument("--port", type=int, default=None, help="with --host (default host 127.0.0.1)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="cap on generated tokens per request")
    parser.add_argument(
        "--max-queue", type=int, default=64, help="requests waiting for a slot before refusing"
    )
    parser.add_argument("--max-active", type=int, default=8, help="requests advancing together")
    parser.add_argument("--prefill-chunk", type=int, default=512, help="prompt tokens per prefill step")
    parser.add_argument(
        "--prefix-cache-min-tokens",
        type=int,
        default=64,
        help="reuse the previous request's KV cache for a shared prompt prefix this long (0: off)",
    )
    parser.add_argument("--max-images", type=int, default=16, help="images per request")
    parser.add_argument("--max-image-bytes", type=int, default=ImageLimits().max_bytes)
    parser.add_argument("--max-image-pixels", type=int, default=ImageLimits().max_pixels)
    parser.add_argument(
        "--drain-seconds", type=float, default=30.0, help="grace for in-flight requests on SIGTERM"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="weight dtype; auto = float32 on the CPU backend (much faster there), as stored on a GPU",
    )
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow code shipped with the checkpoint"
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    add_security_arguments(parser)
    args = parser.parse_args(argv)
    if args.port is not None or args.host is not None:
        if args.port is None:
            parser.error("--host needs --port")
        args.address = f"{args.host or '127.0.0.1'}:{args.port}"
    for name in ("max_tokens", "max_queue", "max_active", "prefill_chunk", "max_images"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def _warn_without_openblas() -> None:
    """mlx's Linux CPU wheel links a slow reference BLAS; Debian's OpenBLAS is ~15-20x faster."""
    if not sys.platform.startswith("linux"):
        return
    try:
        maps = Path("/proc/self/maps").read_text(errors="replace")
    except OSError:
        maps = ""
    if "openblas" in maps.lower():
        return
    candidates = sorted(Path("/usr/lib").glob("*/openblas-pthread/libblas.so.3"))
    hint = f"export LD_PRELOAD={candidates[0]}" if candidates else "apt-get install libopenblas0-pthread"
    log.warning("OpenBLAS is not preloaded: mlx will use its slow reference BLAS on CPU (%s)", hint)


async def _serve(args: argparse.Namespace, security: EngineSecurity) -> int:
    config = EngineConfig(
        model=args.model,
        trust_remote_code=args.trust_remote_code,
        dtype=args.dtype,
        max_output_tokens=args.max_tokens,
        max_queue=args.max_queue,
        max_active=args.max_active,
        prefill_chunk_tokens=args.prefill_chunk,
        prefix_cache_min_tokens=max(0, args.prefix_cache_min_tokens),
        image_limits=ImageLimits(max_bytes=args.max_image_bytes, max_pixels=args.max_image_pixels),
        max_images_per_request=args.max_images,
    )
    server = EngineServer(config, security=security)
    try:
        await server.start(args.address)
    except OSError as error:
        log.error("%s", error)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("loading %s", args.model)
    server.load()
    loading = asyncio.ensure_future(server.wait_loaded())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if loading.done() and loading.exception() is not None:
        log.error("could not load %s: %s", args.model, loading.exception())
        stopping.cancel()
        await server.shutdown(grace_seconds=0)
        return 1
    if loading.done():
        log.info(
            "ready: %s", server.generator.loaded.info.model_id if server.generator.loaded else args.model
        )
        await stopping
    else:
        loading.cancel()
    log.info("shutting down: draining for up to %.0fs", args.drain_seconds)
    await server.shutdown(grace_seconds=args.drain_seconds)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Never reach for the Hugging Face Hub unless the model is a hub id that is not cached.
    if Path(args.model).exists():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        security = EngineSecurity.from_args(args)
        security.check_address(args.address)
    except (ValueError, OSError) as error:
        log.error("%s", error)
        sys.exit(2)
    _warn_without_openblas()
    sys.exit(asyncio.run(_serve(args, security)))


if __name__ == "__main__":
    main()
