"""The vlmserve engine: a gRPC service running one mlx-vlm model on one generation thread.

Modules: `model` (loading, model facts), `prompt` (contract messages -> chat-template prompt),
`tool_parsers` and `stop_sequences` (streaming text post-processing), `sampling` (request
sampling settings and the token sampler), `generator` (the generation thread), `server`
(grpc.aio servicer, health, reflection, drain), `cli` (`vlmserve-engine`).
"""
