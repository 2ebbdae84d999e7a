"""gRPC's TLS credentials: the certificate set the master accepted (server.tls), for add_secure_port.

Runs in a worker, when its gRPC listener starts. The bytes are the ones REST serves: the master read
and checked them, and this worker inherited them through fork (it never reads the files itself).
"""

from __future__ import annotations

import grpc

from server import tls
from server.settings import Settings


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials for every gRPC port of this worker; client certificates required with FORKSERVE_TLS_CLIENT_CA; None when TLS is off."""
    material = tls.current(settings)
    if material is None:
        return None
    return grpc.ssl_server_credentials([(material.key, material.chain)], root_certificates=material.client_ca,
                                       require_client_auth=material.client_ca is not None)
