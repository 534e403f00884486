"""A request's KV cache, in one place: full precision or quantized (`--kv-bits`).

Every piece of the loop that makes, joins, slices, copies or measures a request's KV cache goes
through this package, so the prefill, the decode batch, prompts shared in flight, the prefix
cache and its disk tier all hold the same layout. A layer's keys (and values) are one array
[rows, kv heads, tokens, head dim] at full precision, or, quantized, mlx-vlm's tuple of packed
uint32 data with per-group scales and biases (`mx.quantize`), each [rows, heads, tokens, ...].

Quantized caches are mlx-vlm's own: `QuantizedKVCache` per request and `BatchQuantizedKVCache`
for the batch (its `extend`, `filter`, `extract`, `prepare(right_padding)`/`finalize` and
`trim` are what our batching uses), with mlx-vlm's quantized attention. What mlx-vlm lacks for
our batching is the one-row → batch `merge` its full-precision `KVCache` has (our requests
prefill alone or in groups, then join a running batch): `merge.py` adds it. A request's KV is
quantized from its first prefill chunk on, whatever path it takes, so a request gives the same
tokens alone, batched or from a cached prefix.

The turboquant scheme (`--kv-quant-scheme turboquant`) is mlx-vlm's `TurboQuantKVCache` /
`BatchTurboQuantKVCache` (rotated vectors, a codebook index per value and one float16 norm per
vector: no groups, so any head width). Its state is a `TurboQuantMSEState` (norms [rows, heads,
tokens], indices [rows, heads, tokens, words]); its codecs are a function of the head width, the
bits and a fixed seed, so every copy of a request's KV decodes the same way. mlx-vlm's batch
cache lacks the one-row merge and the right-padded group prefill (`prepare(right_padding)` /
`finalize`) our loop uses; `turboquant.py` adds them.

Modules, by concern: `layout.py` (the layouts and schemes, new caches), `turboquant.py` (the
batch turboquant subclass), `merge.py` (one-row caches → a batch cache), `rollback.py` (a
speculative verify forward and the rollback of its rejected positions), `views.py` (rows and
prefixes as views, own copies), `snapshots.py` (exact copies of any layer kind),
`snapshot_codec.py` (those as arrays for the disk), `sizing.py` (bytes). A leaf: imports nothing
else of the engine. Generation thread only.
"""
