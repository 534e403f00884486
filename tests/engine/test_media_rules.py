"""The pure rules of clip decoding (engine/media/): the format check (`limits.check_format`, on
vlmserve.common.clips, whose own table is tests/common/test_clips.py), frame sampling, frame
sizing and the sampling a part asks for, as tables of cases. No decoding, no process."""

from __future__ import annotations

import pytest

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.media import MediaError, MediaLimits
from vlmserve.engine.media.limits import SETTING_FLAGS, check_format
from vlmserve.engine.media.sampling import fit_pixels, frame_indices, sampling_plan
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.server.settings import declared

MP4 = b"\x00\x00\x00\x1cftypisom" + bytes(20)
WEBM = b"\x1a\x45\xdf\xa3" + bytes(20)
AVI = b"RIFF\x00\x00\x00\x00AVI LIST"
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "
FLAC = b"fLaC\x00\x00\x00\x22"
OGG = b"OggS\x00\x02" + bytes(20) + b"\x01\x1e\x01vorbis" + bytes(23)  # an Ogg Vorbis first page
OPUS = b"OggS\x00\x02" + bytes(20) + b"\x01\x13OpusHead" + bytes(11)
M4A = b"\x00\x00\x00\x1cftypM4A " + bytes(20)
MP3_ID3 = b"ID3\x04\x00" + bytes(20)
MP3_SYNC = b"\xff\xfb\x90\x64" + bytes(20)
PNG = b"\x89PNG\r\n\x1a\n" + bytes(20)

SNIFF_VIDEO = [
    # (bytes, declared, format or None when refused, field of the refusal)
    (MP4, "video/mp4", "mp4", ""),
    (MP4, "", "mp4", ""),
    (MP4, "video/quicktime", "mp4", ""),
    (MP4, "Video/MP4; codecs=avc1", "mp4", ""),
    (WEBM, "video/webm", "webm", ""),
    (WEBM, "video/x-matroska", "webm", ""),
    (AVI, "video/x-msvideo", "avi", ""),
    (b"GIF89a" + bytes(20), "image/gif", "gif", ""),
    (b"GIF89a" + bytes(20), "", "gif", ""),
    (b"\x00\x00\x00\x1cftypheic" + bytes(20), "", None, "video.data"),  # a HEIF still image
    (b"\x00\x00\x00\x1cftypavif" + bytes(20), "video/mp4", None, "video.data"),
    (M4A, "video/mp4", None, "video.data"),  # MPEG-4 audio: no video stream (the facade's rule too)
    (M4A, "", None, "video.data"),
    (MP4, "video/webm", None, "video.media_type"),
    (WEBM, "video/mp4", None, "video.media_type"),
    (WAV, "video/mp4", None, "video.data"),  # audio bytes as a video
    (PNG, "", None, "video.data"),
    (b"#EXTM3U\n#EXT-X-VERSION:3\n", "", None, "video.data"),  # a playlist opens files and URLs
    (b"", "", None, "video.data"),
]


@pytest.mark.parametrize(("data", "declared", "expected", "field"), SNIFF_VIDEO)
def test_video_signatures(data: bytes, declared: str, expected: str | None, field: str) -> None:
    if expected is not None:
        assert check_format(data, declared, "video") == expected
        return
    with pytest.raises(MediaError) as caught:
        check_format(data, declared, "video")
    assert caught.value.code == "media_type"
    assert caught.value.field == field


SNIFF_AUDIO = [
    (WAV, "audio/wav", "wav", ""),
    (WAV, "audio/x-wav", "wav", ""),
    (WAV, "", "wav", ""),
    (FLAC, "audio/flac", "flac", ""),
    (OGG, "audio/ogg", "ogg", ""),
    (MP3_ID3, "audio/mpeg", "mp3", ""),
    (MP3_SYNC, "audio/mp3", "mp3", ""),
    (WAV, "audio/mpeg", None, "audio.media_type"),
    (MP3_ID3, "audio/wav", None, "audio.media_type"),
    (MP4, "audio/wav", None, "audio.data"),
    (AVI, "", None, "audio.data"),  # RIFF, but not WAVE
    (b"\xff\x00garbage", "", None, "audio.data"),
    (OPUS, "audio/ogg", None, "audio.data"),  # Ogg, but Opus: miniaudio decodes Vorbis only
    (M4A, "", None, "audio.data"),  # AAC: no decoder here
    (OGG[:30], "audio/ogg", None, "audio.data"),  # cut short
]


@pytest.mark.parametrize(("data", "declared", "expected", "field"), SNIFF_AUDIO)
def test_audio_signatures(data: bytes, declared: str, expected: str | None, field: str) -> None:
    if expected is not None:
        assert check_format(data, declared, "audio") == expected
        return
    with pytest.raises(MediaError) as caught:
        check_format(data, declared, "audio")
    assert caught.value.code == "media_type"
    assert caught.value.field == field


FRAMES = [
    # (total frames, source fps, fps, max_frames, indices)
    (8, 2.0, 2.0, 16, [0, 1, 2, 3, 4, 5, 6, 7]),  # the squares clips: every frame
    (4, 2.0, 2.0, 16, [0, 1, 2, 3]),
    (30, 10.0, 2.0, 16, [0, 6, 12, 17, 23, 29]),  # 3 s at 2 fps: 6, spread over the clip
    (30, 10.0, 2.0, 4, [0, 10, 19, 29]),  # capped by max_frames
    (30, 10.0, 100.0, 64, list(range(30))),  # never more than the clip has
    (3, 30.0, 2.0, 16, [0]),  # 0.1 s: one frame at least
    (0, 30.0, 2.0, 16, []),
]


@pytest.mark.parametrize(("total", "source_fps", "fps", "max_frames", "expected"), FRAMES)
def test_frame_indices(
    total: int, source_fps: float, fps: float, max_frames: int, expected: list[int]
) -> None:
    assert frame_indices(total, source_fps, fps, max_frames) == expected


SIZES = [
    ((1920, 1080), 1920 * 1080, (1920, 1080)),
    ((3840, 2160), 1920 * 1080, (1920, 1080)),
    ((640, 480), 160 * 120, (160, 120)),
    ((100, 1), 10, (10, 1)),
    ((1, 100), 10, (1, 10)),
]


@pytest.mark.parametrize(("size", "max_pixels", "expected"), SIZES)
def test_frames_fit_the_pixel_bound(
    size: tuple[int, int], max_pixels: int, expected: tuple[int, int]
) -> None:
    fitted = fit_pixels(*size, max_pixels)
    assert fitted == expected
    assert fitted[0] * fitted[1] <= max_pixels


PLANS = [
    # (sampling asked for, (fps, max_frames, frame pixels) or the refusal's field and flag)
    (pb.VideoSampling(), (2.0, 16, 1920 * 1080)),
    (pb.VideoSampling(fps=1.0, max_frames=8), (1.0, 8, 1920 * 1080)),
    (pb.VideoSampling(max_pixels=320 * 240), (2.0, 16, 320 * 240)),
    (pb.VideoSampling(max_pixels=10**9), (2.0, 16, 1920 * 1080)),  # never above the engine's bound
    (pb.VideoSampling(max_frames=64), (2.0, 64, 1920 * 1080)),
    (pb.VideoSampling(max_frames=65), ("video.sampling.max_frames", "--max-video-frames")),
    (pb.VideoSampling(fps=-1.0), ("video.sampling.fps", "")),
    (pb.VideoSampling(fps=float("nan")), ("video.sampling.fps", "")),
    (pb.VideoSampling(min_pixels=100, max_pixels=10), ("video.sampling.min_pixels", "")),
]


@pytest.mark.parametrize(("sampling", "expected"), PLANS)
def test_sampling_plan(sampling: pb.VideoSampling, expected: tuple[object, ...]) -> None:
    if isinstance(expected[0], float):
        plan = sampling_plan(sampling, MediaLimits())
        assert (plan.fps, plan.max_frames, plan.max_frame_pixels) == expected
        return
    with pytest.raises(MediaError) as caught:
        sampling_plan(sampling, MediaLimits())
    field, flag = expected
    assert caught.value.field == field
    assert str(flag) in str(caught.value)


def test_every_flag_a_refusal_names_is_an_engine_setting() -> None:
    flags = {setting.flag for setting in declared(EngineConfig)}
    assert set(SETTING_FLAGS.values()) <= flags


def test_the_settings_reach_the_limits() -> None:
    config = EngineConfig().replace(media=EngineConfig().media.replace(max_video_seconds=5.0, video_fps=1.0))
    limits = config.media_limits
    assert (limits.max_video_seconds, limits.video_fps) == (5.0, 1.0)
    assert limits.images == config.image_limits
    assert EngineConfig().media_limits == MediaLimits()  # the settings' defaults are the limits' defaults


def test_the_default_frame_budget_stays_within_the_cap() -> None:
    media = EngineConfig().media
    assert media.replace(video_max_frames=64).video_max_frames == 64
    with pytest.raises(ValueError, match="--video-max-frames must not be more than --max-video-frames"):
        media.replace(video_max_frames=65)


def test_format_refusals_say_what_is_accepted_and_what_the_bytes_are() -> None:
    with pytest.raises(MediaError) as caught:
        check_format(PNG, "", "video")
    assert caught.value.reason == (
        "unsupported or unrecognised video format "
        "(accepted: video/mp4, video/webm, video/x-msvideo, image/gif)"
    )
    with pytest.raises(MediaError) as caught:
        check_format(OPUS, "audio/ogg", "audio")
    assert caught.value.reason == (
        "unsupported or unrecognised audio format (accepted: audio/wav, audio/mpeg, audio/flac, audio/ogg)"
    )
    with pytest.raises(MediaError) as caught:
        check_format(MP4, "video/webm", "video")
    assert caught.value.reason == (
        "declared media type 'video/webm' does not match the video bytes (video/mp4)"
    )
