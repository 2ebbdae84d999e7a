"""TensorFlow Serving's REST paths: what _parse_path accepts (no TensorFlow, no app)."""

from __future__ import annotations

import pytest

from server.errors import NotFound
from server.http.tfserving import _parse_path


@pytest.mark.parametrize(("rest", "parsed"), [
    ("mlp", ("mlp", None, None, "status")),
    ("mlp/versions/2/metadata", ("mlp", 2, None, "metadata")),
    ("mlp/labels/stable:Predict", ("mlp", None, "stable", "predict")),
    ("mlp:predict/", ("mlp", None, None, "predict")),
])
def test_a_well_formed_path_is_parsed(rest: str, parsed: tuple) -> None:
    assert _parse_path(rest) == parsed


@pytest.mark.parametrize("rest", ["mlp:predict\n", "mlp/versions/1:predict\n", "mlp/metadata\n", "mlp:predict/\n", "mlp:predict/x"])
def test_anything_after_the_path_is_refused(rest: str) -> None:
    """`$` after re.match accepted a final newline; the whole path must match."""
    with pytest.raises(NotFound):
        _parse_path(rest)
