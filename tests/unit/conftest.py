"""Shared fixtures for the unit tests: encoded images made with Pillow (fixtures, so any import mode works)."""

from __future__ import annotations

import io
import struct
import zlib
from typing import Callable

import numpy as np
import pytest
from PIL import Image

ImageEncoder = Callable[..., bytes]


def _encode_image(pixels: np.ndarray, fmt: str = "PNG", **save_args: object) -> bytes:
    """Encode a uint8 (H, W) or (H, W, C) array as an image file in `fmt`."""
    image = Image.fromarray(np.asarray(pixels, dtype=np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save_args)
    return buffer.getvalue()


def _png_declaring_size(width: int, height: int) -> bytes:
    """A valid 1x1 grayscale PNG whose IHDR is patched (with a correct CRC) to claim width x height."""
    data = bytearray(_encode_image(np.zeros((1, 1), dtype=np.uint8), "PNG"))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])) & 0xFFFFFFFF)
    return bytes(data)


@pytest.fixture
def encode_image() -> ImageEncoder:
    """encode_image(pixels, fmt="PNG", **save_args) -> bytes."""
    return _encode_image


@pytest.fixture
def png_declaring_size() -> Callable[[int, int], bytes]:
    """png_declaring_size(width, height) -> PNG bytes whose header claims that size."""
    return _png_declaring_size
