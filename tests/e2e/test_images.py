"""b64 images for rank-4 float inputs: decoded with Pillow, converted, resized and scaled per model."""

from __future__ import annotations

import base64
import io
import zlib

import numpy as np
from PIL import Image

from tests.support.harness import Server
from tests.support.models import REPO_ROOT


def _encode(image: Image.Image, fmt: str, **options: object) -> dict[str, str]:
    """An image as TF Serving's {"b64": ...} value."""
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return {"b64": base64.b64encode(buffer.getvalue()).decode("ascii")}


def _bomb_png(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares a huge size."""
    buffer = io.BytesIO()
    Image.new("L", (1, 1)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    ihdr = 8 + 8  # signature, then length + type of the IHDR chunk
    data[ihdr : ihdr + 8] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    crc = zlib.crc32(bytes(data[ihdr - 4 : ihdr + 13]))
    data[ihdr + 13 : ihdr + 17] = crc.to_bytes(4, "big")
    return bytes(data)


def test_demo_digit_png_is_classified_as_three(server: Server) -> None:
    png = (REPO_ROOT / "examples" / "digit.png").read_bytes()
    response = server.post("/v1/models/digits:predict", json={"instances": [{"b64": base64.b64encode(png).decode()}]})
    assert response.status_code == 200, response.text
    probabilities = np.array(response.json()["predictions"][0])
    assert probabilities.shape == (10,)
    assert int(probabilities.argmax()) == 3
    assert abs(probabilities.sum() - 1.0) < 1e-4


def test_png_and_jpeg_are_resized_and_scaled_like_pillow_in_process(server: Server, keras_models: dict) -> None:
    rng = np.random.default_rng(3)
    image = Image.fromarray(rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8), "RGB")
    png = _encode(image, "PNG")
    response = server.post("/v1/models/k3cnn:predict", json={"instances": [png, png]})
    assert response.status_code == 200, response.text
    expected_input = np.asarray(image.resize((12, 10), Image.Resampling.BILINEAR), dtype=np.float32) / 255.0
    expected = keras_models["k3cnn"](expected_input[np.newaxis], training=False).numpy()[0]
    got = np.array(response.json()["predictions"])
    np.testing.assert_allclose(got[0], expected, atol=1e-5)
    np.testing.assert_allclose(got[1], expected, atol=1e-5)
    jpeg = server.post("/v1/models/k3cnn:predict", json={"instances": [_encode(image, "JPEG", quality=95)]})
    assert jpeg.status_code == 200, jpeg.text
    assert np.array(jpeg.json()["predictions"]).shape == (1, 5)


def test_grayscale_image_is_converted_to_the_models_channels(server: Server) -> None:
    gray = Image.fromarray(np.full((10, 12), 128, dtype=np.uint8), "L")
    rgb = Image.merge("RGB", [gray, gray, gray])
    as_gray = server.post("/v1/models/k3cnn:predict", json={"instances": [_encode(gray, "PNG")]})
    as_rgb = server.post("/v1/models/k3cnn:predict", json={"instances": [_encode(rgb, "PNG")]})
    assert as_gray.status_code == as_rgb.status_code == 200
    assert as_gray.json() == as_rgb.json()


def test_form_encoding_spaces_in_base64_are_repaired(server: Server) -> None:
    image = Image.fromarray(np.arange(360, dtype=np.uint8).reshape(10, 12, 3) * 7, "RGB")
    value = _encode(image, "PNG")
    assert "+" in value["b64"] or "/" in value["b64"]
    spaced = {"b64": value["b64"].replace("+", " ")}
    good = server.post("/v1/models/k3cnn:predict", json={"instances": [value]})
    repaired = server.post("/v1/models/k3cnn:predict", json={"instances": [spaced]})
    assert repaired.status_code == 200, repaired.text
    assert repaired.json() == good.json()


def test_base64_as_common_tools_write_it_gives_the_same_answer(server: Server) -> None:
    png = (REPO_ROOT / "examples" / "digit.png").read_bytes()
    standard = server.post("/v1/models/digits:predict", json={"instances": [{"b64": base64.b64encode(png).decode()}]})
    variants = {
        "the base64 command (wrapped at 76 columns)": base64.encodebytes(png).decode(),
        "URL-safe": base64.urlsafe_b64encode(png).decode(),
        "unpadded URL-safe": base64.urlsafe_b64encode(png).decode().rstrip("="),
    }
    for what, text in variants.items():
        answer = server.post("/v1/models/digits:predict", json={"instances": [{"b64": text}]})
        assert answer.status_code == 200 and answer.json() == standard.json(), (what, answer.text)


def test_image_bomb_and_truncated_image_are_400(server: Server) -> None:
    bomb = {"b64": base64.b64encode(_bomb_png(100_000, 100_000)).decode()}
    response = server.post("/v1/models/k3cnn:predict", json={"instances": [bomb]})
    assert response.status_code == 400
    assert "pixels" in response.json()["error"]
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(buffer, format="JPEG")
    truncated = {"b64": base64.b64encode(buffer.getvalue()[:200]).decode()}
    response = server.post("/v1/models/k3cnn:predict", json={"instances": [truncated]})
    assert response.status_code == 400
    assert "decode" in response.json()["error"]
    assert server.post("/v1/models/k3cnn:predict", json={"instances": [_encode(Image.new("RGB", (12, 10)), "PNG")]}).ok
