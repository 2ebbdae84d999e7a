"""Encoded images (JPEG, PNG, ...) to float arrays shaped for a model's image input."""

from __future__ import annotations

import io

import numpy as np
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
