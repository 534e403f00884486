"""Bounded decoding of video and audio clips (issue 34): contract parts -> numpy arrays.

    from vlmserve.engine.media import MediaLimits, decode_video, decode_audio, MediaError
    video = decode_video(part.video, limits)   # DecodedVideo: frames (T, H, W, 3) uint8 RGB, fps, ...
    audio = decode_audio(part.audio, limits)   # DecodedAudio: float32 mono 16 kHz samples, ...

Media decoders are an attack surface, so: the bytes' size and signature are checked first
(`limits.check_format`, on `vlmserve.common.clips`: the rule the facade applies too), the
container's header next, against every limit (`limits.py`: duration, source frame size, sampled
frames x pixels, sample rate, channels), and only then are the sampled frames or the samples
decoded, in a process of its own with a wall-clock and a memory limit (`worker.py`,
`decoders.py`). Nothing is written to disk. A broken limit or damaged bytes raise `MediaError`
(a ValueError) naming the limit and its engine setting: INVALID_ARGUMENT for the request.
No MLX here: runs in request-preparation threads.
"""

from vlmserve.engine.media.audio import DecodedAudio, decode_audio
from vlmserve.engine.media.limits import AUDIO_SAMPLE_RATE, MediaError, MediaLimits
from vlmserve.engine.media.sampling import frame_indices
from vlmserve.engine.media.video import DecodedVideo, decode_video
from vlmserve.engine.media.worker import start_workers


def start_decoders(limits: MediaLimits) -> None:
    """Start the decoding worker processes now, not on the first clip: an engine whose model
    takes clips calls this as it loads (their seconds of imports run beside its warm-up)."""
    start_workers(limits.decode_memory_mib)


__all__ = [
    "AUDIO_SAMPLE_RATE",
    "DecodedAudio",
    "DecodedVideo",
    "MediaError",
    "MediaLimits",
    "decode_audio",
    "decode_video",
    "frame_indices",
    "start_decoders",
]
