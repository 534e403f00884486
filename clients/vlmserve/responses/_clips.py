"""Video and audio parts (`_clip_models.py`) -> contract `VideoPart` / `AudioPart` (docs/video-audio.md).

The facade does not decode clips: it finds their bytes (a base64 data: URL or bare base64, an
uploaded file by id, a remote URL where the server fetches remote media), bounds their size
before decoding the base64, checks from the first bytes that a video part holds a video
container and an audio part an audio file of the format it says, and sends the bytes on with
their media type and the sampling asked for. The engine probes the container, refuses an
over-limit clip and decodes it (the engine's `media/` package). Frames given as images (`video: [...]`)
are images: each goes through the image check.
"""

from __future__ import annotations

import json
import re

from vlmserve.common.clips import AUDIO_FORMATS, ClipKind, same_container, sniff_clip, sniff_video_part
from vlmserve.engine.v1 import engine_pb2 as pb

from ._clip_models import (
    AudioURLPartParam,
    ChatVideoURLPartParam,
    InputAudioPartParam,
    InputVideoPartParam,
    SamplingFields,
    VideoPartParam,
    VideoURLParam,
)
from ._errors import InvalidRequestError
from ._files import decode_base64, lookup_file
from ._json import join
from ._media import ImageFetchError, MediaPolicy
from ._video_defaults import VideoDefaults

__all__ = ["audio_part", "video_part"]

_DATA_URL_HEAD = re.compile(r"data:([A-Za-z0-9!#$&^_.+/-]*)((?:;[A-Za-z0-9=._+-]{1,64}){0,8}),")
_FILE_ID = re.compile(r"file-[A-Za-z0-9_-]{1,128}")
_OTHER_NAMES: dict[ClipKind, tuple[str, ...]] = {"video": ("image/gif",), "audio": ("application/ogg",)}
_KIND_NAMES = {
    "video": "a video (MP4, MOV, WebM, MKV, AVI, animated GIF)",
    "audio": "audio (WAV, MP3, FLAC, Ogg Vorbis)",
}


def _sampling(
    part: SamplingFields, defaults: VideoDefaults, *, frames_given: bool = False
) -> pb.VideoSampling:
    """The part's own sampling, else the request's; for given frames the part's `fps` is the
    rate they were taken at (VideoFrames.fps), not a rate to sample at."""
    fps = defaults.fps if frames_given or part.fps is None else part.fps
    return pb.VideoSampling(
        fps=fps or 0.0,
        max_frames=part.max_frames or defaults.max_frames or 0,
        min_pixels=part.min_pixels or defaults.min_pixels or 0,
        max_pixels=part.max_pixels or defaults.max_pixels or 0,
    )


def video_part(
    part: InputVideoPartParam | ChatVideoURLPartParam | VideoPartParam,
    path: str,
    media: MediaPolicy,
    defaults: VideoDefaults,
) -> pb.VideoPart:
    """A video part at `path` as the contract's VideoPart (bytes, media type, sampling)."""
    if isinstance(part, VideoPartParam) and isinstance(part.video, list):
        frames = pb.VideoFrames(fps=part.fps or 0.0)
        for index, frame_url in enumerate(part.video):
            frames.frames.add().CopyFrom(
                media.load_image(frame_url, pb.IMAGE_DETAIL_AUTO, param=join(join(path, "video"), index))
            )
        return pb.VideoPart(frames=frames, sampling=_sampling(part, defaults, frames_given=True))
    url, file_id, url_param, id_param = _video_source(part, path)
    if file_id is not None:
        data, media_type = _file_clip(file_id, id_param, "video", media)
    else:
        assert url is not None
        data, media_type = _url_clip(url, url_param, "video", media)
    return pb.VideoPart(data=data, media_type=media_type, sampling=_sampling(part, defaults))


def audio_part(part: InputAudioPartParam | AudioURLPartParam, path: str, media: MediaPolicy) -> pb.AudioPart:
    """An `input_audio` or `audio_url` part at `path` as the contract's AudioPart (bytes and
    media type)."""
    if isinstance(part, AudioURLPartParam):
        url, file_id, url_param, id_param = _url_or_file(part.audio_url, join(path, "audio_url"), path)
        if file_id is not None:
            data, media_type = _file_clip(file_id, id_param, "audio", media)
        else:
            assert url is not None
            data, media_type = _url_clip(url, url_param, "audio", media)
        return pb.AudioPart(data=data, media_type=media_type)
    given = part.input_audio
    if given is not None and part.file_id is not None:
        raise InvalidRequestError(
            f"Invalid value for '{path}': send either 'input_audio' or 'file_id', not both.", param=path
        )
    if given is None:
        if part.file_id is None:
            raise InvalidRequestError(
                f"Missing required parameter: '{join(path, 'input_audio')}' ({{data, format}}).",
                param=join(path, "input_audio"),
                code="missing_required_parameter",
            )
        data, media_type = _file_clip(part.file_id, join(path, "file_id"), "audio", media)
        return pb.AudioPart(data=data, media_type=media_type)
    audio_path = join(path, "input_audio")
    format_param = join(audio_path, "format")
    declared = AUDIO_FORMATS.get(given.format.lower())
    if declared is None:
        raise InvalidRequestError(
            f"Invalid value for '{format_param}': unsupported audio format {json.dumps(given.format)[:40]}; "
            f"supported: {', '.join(AUDIO_FORMATS)}.",
            param=format_param,
            code="unsupported_value",
        )
    data_param = join(audio_path, "data")
    url_type, data = _decode(given.data, data_param, "audio", media.clip_max_bytes)
    if url_type is not None and not same_container(url_type, declared):
        raise InvalidRequestError(
            f"Invalid value for '{data_param}': the data: URL says {url_type[:64]}, the format says "
            f"{given.format}.",
            param=data_param,
            quoted=(format_param,),
        )
    sniffed = _sniffed(data, data_param, "audio")
    if not same_container(declared, sniffed):
        raise InvalidRequestError(
            f"Invalid value for '{format_param}': the format says {given.format}, but the audio is "
            f"{sniffed}.",
            param=format_param,
            code="invalid_value",
        )
    return pb.AudioPart(data=data, media_type=sniffed)


def _video_source(
    part: InputVideoPartParam | ChatVideoURLPartParam | VideoPartParam, path: str
) -> tuple[str | None, str | None, str, str]:
    """(url, file_id, the url's path, the file id's path) of a video part: exactly one is set."""
    if isinstance(part, InputVideoPartParam):
        url, file_id = part.video_url, part.file_id
        url_param, id_param = join(path, "video_url"), join(path, "file_id")
    elif isinstance(part, ChatVideoURLPartParam):
        return _url_or_file(part.video_url, join(path, "video_url"), path)
    else:
        assert isinstance(part.video, str)
        url, file_id, url_param, id_param = part.video, None, join(path, "video"), join(path, "video")
    return _one_source(url, file_id, url_param, id_param, path)


def _url_or_file(
    value: str | VideoURLParam, outer: str, path: str
) -> tuple[str | None, str | None, str, str]:
    """vLLM's `{url}` / `{file_id}` / URL string (`video_url`, `audio_url` at `outer`)."""
    if isinstance(value, str):
        return _one_source(value, None, outer, outer, path)
    return _one_source(value.url, value.file_id, join(outer, "url"), join(outer, "file_id"), path)


def _one_source(
    url: str | None, file_id: str | None, url_param: str, id_param: str, path: str
) -> tuple[str | None, str | None, str, str]:
    """Exactly one of a URL and a file id; a URL that is a file id is one."""
    if url is not None and file_id is not None:
        raise InvalidRequestError(
            f"Invalid value for '{path}': send either '{url_param}' or '{id_param}', not both.",
            param=path,
            quoted=(url_param, id_param),
        )
    if url is None and file_id is None:
        raise InvalidRequestError(
            f"Missing required parameter: '{url_param}' (a base64 data: URL or a file_id).",
            param=url_param,
            code="missing_required_parameter",
        )
    if url is not None and _FILE_ID.fullmatch(url):
        # A file reference where a URL goes (vLLM clients pass what they have there).
        return None, url, url_param, url_param
    return url, file_id, url_param, id_param


def _url_clip(url: str, param: str, kind: ClipKind, media: MediaPolicy) -> tuple[bytes, str]:
    """A clip's bytes from a data: URL, or from a remote URL where remote media is fetched."""
    scheme = url.partition(":")[0].lower()
    if scheme in ("http", "https"):
        source = media.clip_source
        if source is None:
            raise InvalidRequestError(
                f"Invalid {kind} URL at '{param}': remote media URLs are disabled on this server; "
                f"send the {kind} inline as a base64 data: URL, or upload it (POST /v1/files) and "
                "send its id.",
                param=param,
                code="unsupported_value",
            )
        try:
            data = source(url)
        except ImageFetchError as error:
            raise InvalidRequestError(error.reason, param=param, code=error.code) from None
        return data, _sniffed(data, param, kind)
    if scheme != "data":
        raise InvalidRequestError(
            f"Invalid {kind} URL at '{param}': send the {kind} inline as a base64 data: URL "
            f"(data:{'video/mp4' if kind == 'video' else 'audio/wav'};base64,...) or a file id; "
            "file paths and file:// URLs are not accepted.",
            param=param,
            code=f"invalid_{kind}_url",
        )
    declared, data = _decode(url, param, kind, media.clip_max_bytes)
    # An animated GIF is a clip where a video part holds it; Ogg's registered type is application/.
    if declared is None or not (declared.startswith(f"{kind}/") or declared in _OTHER_NAMES[kind]):
        raise InvalidRequestError(
            f"Invalid value for '{param}': a {kind} part takes a data:{kind}/... URL; this one says "
            f"{(declared or 'no type')[:64]}.",
            param=param,
            code=f"invalid_{kind}_url",
        )
    sniffed = _sniffed(data, param, kind)
    if not same_container(declared, sniffed):
        raise InvalidRequestError(
            f"Invalid value for '{param}': the data: URL says {declared[:64]}, but the {kind} is {sniffed}.",
            param=param,
            code=f"invalid_{kind}",
        )
    return data, sniffed


def _file_clip(file_id: str, param: str, kind: ClipKind, media: MediaPolicy) -> tuple[bytes, str]:
    """An uploaded file's bytes (the engine never reads storage): it must be a clip of `kind`."""
    found = lookup_file(file_id, param, media)
    if len(found.data) > media.clip_max_bytes:
        raise _too_large(param, kind, media.clip_max_bytes)
    return found.data, _sniffed(found.data, param, kind)


def _decode(value: str, param: str, kind: ClipKind, max_bytes: int) -> tuple[str | None, bytes]:
    """(declared type of a data: URL or None, bytes) of a data: URL or bare base64, bounded
    before decoding."""
    declared: str | None = None
    payload = value
    if value[:5].lower() == "data:":
        match = _DATA_URL_HEAD.match("data:" + value[5:])
        if match is None or "base64" not in [p.lower() for p in match.group(2).split(";")]:
            raise InvalidRequestError(
                f"Invalid value for '{param}': malformed data: URL; expected data:<type>;base64,<data>.",
                param=param,
                code=f"invalid_{kind}_url",
            )
        declared = match.group(1).lower() or None
        payload = value[match.end() :]
    if len(payload) > (max_bytes + 2) // 3 * 4 + 4:
        raise _too_large(param, kind, max_bytes)
    raw = payload.encode("ascii", errors="replace").replace(b"\n", b"").replace(b"\r", b"")
    data = decode_base64(raw, param)
    if not data:
        raise InvalidRequestError(
            f"Invalid value for '{param}': the {kind} is empty.", param=param, code=f"invalid_{kind}"
        )
    if len(data) > max_bytes:
        raise _too_large(param, kind, max_bytes)
    return declared, data


def _sniffed(data: bytes, param: str, kind: ClipKind) -> str:
    """The media type the bytes say, which must be one of `kind`'s."""
    if kind == "video" and (gif := sniff_video_part(data)) == "image/gif":
        return gif
    found = sniff_clip(data)
    if found is None or found[0] != kind:
        what = "not a supported format" if found is None else f"{found[1]}, not {kind}"
        raise InvalidRequestError(
            f"Invalid value for '{param}': expected {_KIND_NAMES[kind]}; the bytes are {what}.",
            param=param,
            code=f"unsupported_{kind}_format",
        )
    return found[1]


def _too_large(param: str, kind: ClipKind, max_bytes: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid value for '{param}': the {kind} is larger than {max_bytes} bytes, this server's limit.",
        param=param,
        code=f"{kind}_too_large",
    )
