"""Encoded images decoded, converted, resized and scaled to a model's image input."""

from __future__ import annotations

import io
import random
from typing import Callable

import numpy as np
import pytest
from PIL import Image

from server.config import ModelConfig
from server.errors import InvalidArgument
from server.signature import TensorInfo
from server.tensors.images import decode_image, image_mode

GRAY_8x8 = TensorInfo("image", "float32", (None, 8, 8, 1))
RGB_10x12 = TensorInfo("image", "float32", (None, 10, 12, 3))  # height 10, width 12
RAW = ModelConfig(image_scale="none")

ImageEncoder = Callable[..., bytes]


def gradient(height: int, width: int, channels: int = 0) -> np.ndarray:
    """Distinct uint8 pixel values, shaped (H, W) or (H, W, C)."""
    shape = (height, width, channels) if channels else (height, width)
    return (np.arange(int(np.prod(shape))) * 7 % 256).astype(np.uint8).reshape(shape)


def test_png_grayscale_decodes_to_the_input_shape_and_dtype(encode_image: ImageEncoder) -> None:
    pixels = gradient(8, 8)
    out = decode_image(encode_image(pixels), GRAY_8x8, RAW)
    assert out.shape == (8, 8, 1) and out.dtype == np.float32
    np.testing.assert_array_equal(out[:, :, 0], pixels.astype(np.float32))


def test_png_rgb_decodes_height_by_width(encode_image: ImageEncoder) -> None:
    pixels = gradient(10, 12, 3)
    out = decode_image(encode_image(pixels), RGB_10x12, RAW)
    assert out.shape == (10, 12, 3)
    np.testing.assert_array_equal(out, pixels.astype(np.float32))


def test_decoded_dtype_follows_the_input(encode_image: ImageEncoder) -> None:
    info = TensorInfo("image", "float16", (None, 8, 8, 1))
    out = decode_image(encode_image(gradient(8, 8)), info, ModelConfig())
    assert out.dtype == np.float16


@pytest.mark.parametrize(
    ("scale", "low", "high"),
    [("unit", 0.0, 1.0), ("symmetric", -1.0, 1.0), ("none", 0.0, 255.0)],
)
def test_scaling_maps_0_and_255_to_the_configured_range(
    encode_image: ImageEncoder, scale: str, low: float, high: float
) -> None:
    pixels = np.zeros((8, 8), np.uint8)
    pixels[:, 4:] = 255
    pixels[0, 0] = 51  # 0.2 of the range
    out = decode_image(encode_image(pixels), GRAY_8x8, ModelConfig(image_scale=scale))[:, :, 0]
    assert out[1, 0] == pytest.approx(low, abs=1e-6)
    assert out[0, 7] == pytest.approx(high, abs=1e-6)
    assert out[0, 0] == pytest.approx(low + 0.2 * (high - low), abs=1e-5)


def test_unit_scaling_is_pixels_over_255(encode_image: ImageEncoder) -> None:
    pixels = gradient(8, 8)
    out = decode_image(encode_image(pixels), GRAY_8x8, ModelConfig(image_scale="unit"))
    np.testing.assert_allclose(out[:, :, 0], pixels / 255.0, atol=1e-6)


def test_larger_image_is_resized_to_the_input_size(encode_image: ImageEncoder) -> None:
    small = gradient(8, 8)
    big = np.kron(small, np.ones((4, 4), np.uint8))  # each pixel a 4x4 block: 32x32
    for method in ("box", "nearest"):
        out = decode_image(encode_image(big), GRAY_8x8, ModelConfig(image_scale="none", image_resize=method))
        np.testing.assert_array_equal(out[:, :, 0], small.astype(np.float32))


def test_smaller_image_is_upscaled_to_the_input_size(encode_image: ImageEncoder) -> None:
    out = decode_image(encode_image(np.full((3, 5), 90, np.uint8)), GRAY_8x8, RAW)
    assert out.shape == (8, 8, 1)
    np.testing.assert_array_equal(out, np.full((8, 8, 1), 90, np.float32))


def test_non_square_image_is_resized_to_height_and_width(encode_image: ImageEncoder) -> None:
    out = decode_image(encode_image(np.full((40, 24, 3), 200, np.uint8)), RGB_10x12, RAW)
    assert out.shape == (10, 12, 3)
    np.testing.assert_allclose(out, 200.0, atol=1)


def test_rgb_image_is_converted_for_a_one_channel_model(encode_image: ImageEncoder) -> None:
    pixels = np.zeros((8, 8, 3), np.uint8)
    pixels[..., 0] = 255  # pure red
    pixels[4:, :, :] = 255  # white bottom half
    out = decode_image(encode_image(pixels), GRAY_8x8, RAW)
    assert out.shape == (8, 8, 1)
    assert out[0, 0, 0] == 76  # ITU-R 601-2 luma of red: 299 * 255 / 1000
    assert out[7, 7, 0] == 255


def test_grayscale_image_is_converted_for_a_three_channel_model(encode_image: ImageEncoder) -> None:
    pixels = gradient(10, 12)
    out = decode_image(encode_image(pixels), RGB_10x12, RAW)
    for channel in range(3):
        np.testing.assert_array_equal(out[:, :, channel], pixels.astype(np.float32))


def test_rgba_image_loses_its_alpha_for_a_three_channel_model(encode_image: ImageEncoder) -> None:
    pixels = gradient(10, 12, 4)
    out = decode_image(encode_image(pixels), RGB_10x12, RAW)
    np.testing.assert_array_equal(out, pixels[:, :, :3].astype(np.float32))


def test_four_channel_model_gets_rgba(encode_image: ImageEncoder) -> None:
    info = TensorInfo("image", "float32", (None, 4, 4, 4))
    out = decode_image(encode_image(np.full((4, 4, 3), 10, np.uint8)), info, RAW)
    np.testing.assert_array_equal(out[:, :, 3], 255)  # opaque alpha added
    np.testing.assert_array_equal(out[:, :, :3], 10)


def test_image_mode_is_derived_from_channels_or_configured() -> None:
    assert image_mode(GRAY_8x8, ModelConfig()) == "L"
    assert image_mode(RGB_10x12, ModelConfig()) == "RGB"
    assert image_mode(TensorInfo("i", "float32", (None, 2, 2, 4)), ModelConfig()) == "RGBA"
    assert image_mode(GRAY_8x8, ModelConfig(image_mode="L")) == "L"


def test_configured_image_mode_must_give_the_models_channels() -> None:
    with pytest.raises(InvalidArgument, match=r"takes 3 channels.*configured image_mode 'L'"):
        image_mode(RGB_10x12, ModelConfig(image_mode="L"))


def test_channel_count_no_mode_gives_is_refused(encode_image: ImageEncoder) -> None:
    info = TensorInfo("image", "float32", (None, 8, 8, 2))
    with pytest.raises(InvalidArgument, match="takes 2 channels, which no image mode gives"):
        decode_image(encode_image(gradient(8, 8)), info, ModelConfig())


def test_jpeg_decodes_to_the_input_shape(encode_image: ImageEncoder) -> None:
    pixels = np.full((10, 12, 3), (200, 100, 50), np.uint8)
    out = decode_image(encode_image(pixels, "JPEG", quality=95), RGB_10x12, RAW)
    assert out.shape == (10, 12, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, np.broadcast_to([200, 100, 50], out.shape), atol=4)


def test_large_jpeg_is_reduced_to_the_input_size(encode_image: ImageEncoder) -> None:
    pixels = np.full((400, 480, 3), (30, 160, 220), np.uint8)  # 40x the input: draft mode decodes at 1/8
    out = decode_image(encode_image(pixels, "JPEG", quality=95), RGB_10x12, ModelConfig())
    assert out.shape == (10, 12, 3)
    np.testing.assert_allclose(out, np.broadcast_to(np.array([30, 160, 220]) / 255, out.shape), atol=4 / 255)


def test_color_jpeg_for_a_one_channel_model(encode_image: ImageEncoder) -> None:
    pixels = np.full((64, 64, 3), 128, np.uint8)
    out = decode_image(encode_image(pixels, "JPEG", quality=95), GRAY_8x8, RAW)
    assert out.shape == (8, 8, 1)
    np.testing.assert_allclose(out, 128, atol=2)


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "WEBP"])
def test_other_accepted_formats_decode(encode_image: ImageEncoder, fmt: str) -> None:
    extra = {"lossless": True} if fmt == "WEBP" else {}
    pixels = np.full((8, 8), 77, np.uint8)
    out = decode_image(encode_image(pixels, fmt, **extra), GRAY_8x8, RAW)
    np.testing.assert_array_equal(out, np.full((8, 8, 1), 77, np.float32))


@pytest.mark.parametrize("fmt", ["TIFF", "PPM", "ICO"])
def test_formats_outside_the_accepted_list_are_refused(encode_image: ImageEncoder, fmt: str) -> None:
    data = encode_image(np.full((16, 16, 3), 10, np.uint8), fmt)
    with pytest.raises(InvalidArgument, match="cannot decode image for input 'image'"):
        decode_image(data, RGB_10x12, ModelConfig())


def test_image_over_the_pixel_limit_is_refused(encode_image: ImageEncoder) -> None:
    data = encode_image(gradient(8, 8))
    with pytest.raises(InvalidArgument, match=r"image is 8x8 = 64 pixels, over the limit of 63"):
        decode_image(data, GRAY_8x8, ModelConfig(max_image_pixels=63))
    assert decode_image(data, GRAY_8x8, ModelConfig(max_image_pixels=64)).shape == (8, 8, 1)


def test_png_declaring_a_huge_size_is_refused_before_decoding(png_declaring_size: Callable[[int, int], bytes]) -> None:
    data = png_declaring_size(5000, 5000)
    with pytest.raises(InvalidArgument, match=r"image is 5000x5000 = 25000000 pixels, over the limit of 16000000"):
        decode_image(data, GRAY_8x8, ModelConfig())


def test_png_declaring_a_decompression_bomb_size_is_refused(png_declaring_size: Callable[[int, int], bytes]) -> None:
    data = png_declaring_size(30000, 30000)  # beyond Pillow's own bomb limit
    with pytest.raises(InvalidArgument):
        decode_image(data, GRAY_8x8, ModelConfig(max_image_pixels=10**9))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_image_is_refused(encode_image: ImageEncoder, fmt: str) -> None:
    data = encode_image(gradient(32, 32, 3), fmt)
    with pytest.raises(InvalidArgument, match="cannot decode image"):
        decode_image(data[: len(data) // 2], RGB_10x12, ModelConfig())


@pytest.mark.parametrize("data", [b"", b"junk bytes, not an image", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff"])
def test_junk_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(InvalidArgument, match="cannot decode image for input 'image'") as caught:
        decode_image(data, GRAY_8x8, ModelConfig())
    assert caught.value.status == 400


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "BMP", "WEBP"])
def test_corrupted_images_fail_only_with_invalid_argument(encode_image: ImageEncoder, fmt: str) -> None:
    data = encode_image(gradient(16, 16, 3), fmt)
    rng = random.Random(fmt)
    for attempt in range(150):
        damaged = bytearray(data)
        if attempt % 2:
            damaged = damaged[: rng.randrange(1, len(damaged))]
        else:
            for _ in range(rng.randrange(1, 6)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            out = decode_image(bytes(damaged), RGB_10x12, ModelConfig(max_image_pixels=1_000_000))
        except InvalidArgument:
            continue
        assert out.shape == (10, 12, 3) and out.dtype == np.float32


def test_sixteen_bit_grayscale_png_is_scaled_to_eight_bits() -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8), 32768, np.uint16)).save(buffer, "PNG")
    out = decode_image(buffer.getvalue(), GRAY_8x8, RAW)
    np.testing.assert_allclose(out, 128, atol=1)


def _pillow_pixels(data: bytes, mode: str) -> np.ndarray:
    """The reference: Pillow's decode and conversion, as float32 (H, W, C)."""
    with Image.open(io.BytesIO(data)) as img:
        pixels = np.asarray(img.convert(mode), dtype=np.float32)
    return pixels if pixels.ndim == 3 else pixels[:, :, np.newaxis]


NOISE = np.random.default_rng(7).integers(0, 256, (48, 40, 3), dtype=np.uint8)


@pytest.mark.parametrize(("mode", "save_args"), [
    ("RGB", {"quality": 75}),
    ("RGB", {"quality": 95, "subsampling": 0}),  # 4:4:4
    ("RGB", {"quality": 90, "subsampling": 1}),  # 4:2:2
    ("RGB", {"quality": 85, "progressive": True}),
    ("L", {"quality": 80}),
    ("RGB", {"quality": 70, "optimize": True}),
])
def test_a_jpeg_at_the_input_size_decodes_to_exactly_pillows_pixels(mode: str, save_args: dict) -> None:
    """The simplejpeg path is taken and gives the very bytes Pillow's decode gives (else it must not be used)."""
    from server.tensors.images import _jpeg_at_input_size

    pixels = NOISE if mode == "RGB" else NOISE[:, :, 0]
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", **save_args)
    data = buffer.getvalue()
    info = TensorInfo("image", "float32", (None, 48, 40, 3 if mode == "RGB" else 1))
    assert _jpeg_at_input_size(data, mode, 40, 48, 10**6) is not None
    assert np.array_equal(decode_image(data, info, RAW), _pillow_pixels(data, mode))


@pytest.mark.parametrize(("height", "width"), [(47, 41), (17, 33), (1, 1), (224, 224)])
def test_odd_sizes_decode_to_pillows_pixels_too(height: int, width: int) -> None:
    """Edge blocks and upsampling at odd sizes: where two libjpeg-turbo builds would drift apart first."""
    pixels = np.random.default_rng(height * width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=85)
    info = TensorInfo("image", "float32", (None, height, width, 3))
    assert np.array_equal(decode_image(buffer.getvalue(), info, RAW), _pillow_pixels(buffer.getvalue(), "RGB"))


@pytest.mark.parametrize(("source_mode", "model_mode", "size", "max_pixels"), [
    ("CMYK", "RGB", (40, 48), 10**6),  # Pillow converts CMYK itself
    ("L", "RGB", (40, 48), 10**6),  # gray to RGB: Pillow's conversion
    ("RGB", "L", (40, 48), 10**6),  # RGB to L: Pillow's luma weights, not libjpeg's Y channel
    ("RGB", "RGB", (20, 24), 10**6),  # another size: resized by Pillow
    ("RGB", "RGB", (40, 48), 100),  # over max_image_pixels: Pillow refuses it with its message
])
def test_other_jpegs_are_left_to_pillow(source_mode: str, model_mode: str, size: tuple[int, int], max_pixels: int) -> None:
    from server.tensors.images import _jpeg_at_input_size

    buffer = io.BytesIO()
    Image.fromarray(NOISE).convert(source_mode).save(buffer, "JPEG")
    assert _jpeg_at_input_size(buffer.getvalue(), model_mode, *size, max_pixels) is None


def test_a_corrupt_jpeg_gets_pillows_error() -> None:
    from server.tensors.images import _jpeg_at_input_size

    data = b"\xff\xd8\xff\xe0" + b"\x00" * 64
    assert _jpeg_at_input_size(data, "RGB", 12, 10, 10**6) is None
    with pytest.raises(InvalidArgument, match="cannot decode image for input 'image'"):
        decode_image(data, RGB_10x12, RAW)
