"""Encoded images (JPEG, PNG, ...) to float arrays shaped for a model's image input."""

from __future__ import annotations

import io

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from server.config import ModelConfig
from server.errors import InvalidArgument
from server.signature import TensorInfo

ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
MODE_FOR_CHANNELS = {1: "L", 3: "RGB", 4: "RGBA"}
CHANNELS_FOR_MODE = {mode: channels for channels, mode in MODE_FOR_CHANNELS.items()}
RESAMPLING = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


def image_mode(info: TensorInfo, config: ModelConfig) -> str:
    """Pillow mode that gives the input its channel count (configured or derived)."""
    channels = info.shape[3] if info.shape else None
    mode = config.image_mode or MODE_FOR_CHANNELS.get(channels or 0, "")
    if CHANNELS_FOR_MODE.get(mode) != channels:
        raise InvalidArgument(
            f"input {info.name!r} takes {channels} channels, which no image mode gives"
            + (f" (configured image_mode {config.image_mode!r})" if config.image_mode else "")
        )
    return mode


# The model's image mode: (the JPEG colorspace libjpeg turns into it exactly as Pillow does, simplejpeg's name).
SAME_AS_PILLOW = {"RGB": ("YCbCr", "RGB"), "L": ("Gray", "GRAY")}


def _jpeg_at_input_size(data: bytes, mode: str, width: int, height: int, max_pixels: int) -> np.ndarray | None:
    """A JPEG already at the input's size, decoded straight to uint8 pixels (simplejpeg); None: Pillow decodes it.

    NOTE: Pillow parses a JPEG's headers in Python, a large part of a small image's decode;
    simplejpeg calls the same libjpeg-turbo decoder with the same settings (accurate DCT, fancy
    upsampling) without that (measured: bench/results/code-notes.md#jpeg-fast-path). Only cases that decode to the same bytes take this path
    (tests/unit/tensors/test_images.py compares them): no resize, no colour conversion
    other than libjpeg's own YCbCr to RGB, an image within max_image_pixels.
    """
    wanted = SAME_AS_PILLOW.get(mode)
    if wanted is None or not data.startswith(b"\xff\xd8") or width * height > max_pixels:
        return None
    try:
        found_height, found_width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        if (found_width, found_height, colorspace) != (width, height, wanted[0]):
            return None
        return simplejpeg.decode_jpeg(data, colorspace=wanted[1])
    except ValueError:  # Pillow gives the error message clients see
        return None


def _scale(pixels: np.ndarray, scale: str) -> np.ndarray:
    """Map 0..255 to the configured range, in place."""
    if scale == "unit":
        pixels *= np.float32(1 / 255)
    elif scale == "symmetric":
        pixels *= np.float32(2 / 255)
        pixels -= np.float32(1)
    return pixels


def decode_image(data: bytes, info: TensorInfo, config: ModelConfig) -> np.ndarray:
    """Decode, convert, resize and scale one image to (height, width, channels) float."""
    assert info.shape is not None
    height, width = int(info.shape[1]), int(info.shape[2])
    mode = image_mode(info, config)
    decoded = _jpeg_at_input_size(data, mode, width, height, config.max_image_pixels)
    if decoded is not None:  # the same steps as below, from the same pixels
        return _scale(decoded.astype(np.float32).astype(info.dtype, copy=False), config.image_scale)
    try:
        with Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS) as img:
            if img.width * img.height > config.max_image_pixels:
                raise InvalidArgument(
                    f"image is {img.width}x{img.height} = {img.width * img.height} pixels, "
                    f"over the limit of {config.max_image_pixels}"
                )
            if img.format == "JPEG":
                # Draft mode lets libjpeg decode at 1/2, 1/4 or 1/8 scale, never below the target.
                img.draft(mode, (width, height))
            source = img
            if img.mode.startswith("I;16") or img.mode == "I":
                # 16-bit grayscale: convert("L") would clip at 255; keep the high byte, as TF does.
                source = Image.fromarray((np.asarray(img, dtype=np.uint32) >> 8).astype(np.uint8), "L")
            converted = source.convert(mode)
            if converted.size != (width, height):
                converted = converted.resize((width, height), RESAMPLING[config.image_resize])
            pixels = np.asarray(converted, dtype=np.float32)
    except InvalidArgument:
        raise
    except UnidentifiedImageError:  # its message names the BytesIO object, which tells the client nothing
        raise InvalidArgument(
            f"cannot decode image for input {info.name!r}: not a {', '.join(ACCEPTED_FORMATS)} image"
        ) from None
    except (OSError, ValueError, Image.DecompressionBombError, SyntaxError) as exc:
        raise InvalidArgument(f"cannot decode image for input {info.name!r}: {exc}") from None
    if pixels.ndim == 2:
        pixels = pixels[:, :, np.newaxis]
    return _scale(pixels.astype(info.dtype, copy=False), config.image_scale)
