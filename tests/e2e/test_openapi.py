"""schemathesis against the live server: no 5xx, and every response conforms to /openapi.json."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.harness import Server
from tests.support.models import copy_models

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def healthy(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Only models that load (the shared server answers 503 for its broken ones, by design)."""
    repo = copy_models(model_repo, tmp_path_factory.mktemp("openapi-models"), "half_plus_two", "mlp", "k3cnn", "multi_h5")
    instance = Server(models_dir=repo, run_dir=tmp_path_factory.mktemp("openapi-run"), workers=1).start()
    yield instance
    instance.stop()


def test_every_operation_conforms_and_never_answers_5xx(healthy: Server) -> None:
    schema = schemathesis.openapi.from_url(f"{healthy.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 20

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def exercise(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=CHECKS, timeout=30)

        exercise()


def test_openapi_document_lists_both_protocols(server: Server) -> None:
    paths = server.get("/openapi.json").json()["paths"]
    for path in ("/v1/models/{name}:predict", "/v1/models/{name}/versions/{version}/metadata", "/v2/models/{name}/infer",
                 "/v2/health/ready", "/healthz", "/readyz", "/metrics"):
        assert path in paths, path
