"""A FLAC writer for tests: no FLAC encoder is installed here (miniaudio only decodes), and the
format's VERBATIM subframes (samples stored as they are) take a few lines. The frames are real
FLAC (CRC-8 headers, CRC-16 footers), decoded bit-exactly by miniaudio."""

from __future__ import annotations

import numpy as np


def _crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def flac_bytes(samples: np.ndarray, rate: int, *, length_known: bool = True, block: int = 4096) -> bytes:
    """16-bit FLAC of `samples` ((n, channels) int16); `length_known=False` writes a STREAMINFO
    without the total sample count, as a streaming encoder may."""
    count, channels = samples.shape
    assert count // block < 128  # one-byte frame numbers
    streaminfo = (block << 64 | block << 48).to_bytes(10, "big")  # block sizes; frame sizes unknown (0)
    total = count if length_known else 0
    streaminfo += (rate << 44 | (channels - 1) << 41 | 15 << 36 | total).to_bytes(8, "big")
    streaminfo += bytes(16)  # no MD5
    out = b"fLaC" + bytes([0x80, 0, 0, len(streaminfo)]) + streaminfo
    for number, start in enumerate(range(0, count, block)):
        chunk = samples[start : start + block]
        # Sync + fixed blocking; block size - 1 as 16 bits after; rate from STREAMINFO;
        # independent channels; 16 bits per sample; the frame number.
        header = bytes([0xFF, 0xF8, 0x70, (channels - 1) << 4 | 0x08, number]) + (len(chunk) - 1).to_bytes(
            2, "big"
        )
        header += bytes([_crc8(header)])
        frame = header + b"".join(b"\x02" + chunk[:, c].astype(">i2").tobytes() for c in range(channels))
        out += frame + _crc16(frame).to_bytes(2, "big")
    return out
