"""The container tests build an image (minutes): collected only by `make image-test` (FORKSERVE_IMAGE_TEST=1)."""

import os

import pytest

from tests.image.container import build

collect_ignore_glob = [] if os.environ.get("FORKSERVE_IMAGE_TEST") == "1" else ["test_*.py"]


@pytest.fixture(scope="session")
def image() -> str:
    return build()
