# forkserve, a drop-in for TensorFlow Serving's image. Build and test: `make image-test` (tests/image/).
#   podman build -t forkserve .            # or docker build; BASE names another bookworm image
#   podman run --rm -p 8000:8000 forkserve # natively: the demo models (REST 8000, gRPC 8500); answers the README's demo request
#   podman run --rm -p 8000:8000 -v /srv/models:/models forkserve   # natively, your repository (served whenever one is mounted)
#   podman run --rm -p 8501:8501 -p 8500:8500 -v /srv/resnet:/models/resnet -e MODEL_NAME=resnet forkserve
#                                          # as tensorflow/serving: REST 8501, gRPC 8500, TF Serving's flags appended as arguments
# The rules are scripts/docker-entrypoint's; deploy/k8s/README.md has the Kubernetes and KServe variants.
ARG BASE=docker.io/library/debian:bookworm-slim
FROM ${BASE}

# Debian bookworm's Python is 3.11. The versions come from the bookworm release the base was made from.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/forkserve/venv \
    PATH=/opt/forkserve/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/opt/forkserve
WORKDIR /opt/forkserve

# Only what serving needs (requirements.txt), in a layer of its own: code changes do not reinstall TensorFlow.
# Behind a TLS-inspecting proxy, hand pip its CA without baking it in: --secret id=pip_ca,src=ca.pem
COPY requirements.txt requirements-nodeps.txt ./
RUN --mount=type=secret,id=pip_ca \
    if [ -f /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && python3 -m venv "$VIRTUAL_ENV" \
    && pip install -r requirements.txt \
    && pip install --no-deps -r requirements-nodeps.txt
COPY server/ server/
COPY gunicorn.conf.py ./
COPY conf/models.toml conf/models.toml
# TF Serving's image has its server and entrypoint in /usr/bin; manifests and KServe's runtime call them by that path.
COPY scripts/docker-entrypoint scripts/forkserve-healthcheck /usr/local/bin/
COPY scripts/tensorflow_model_server /usr/bin/

# The demo repository, served when /models is empty and no volume is mounted there. /models is no VOLUME:
# an anonymous volume would always be mounted, and the demo never served.
COPY models/ /opt/forkserve/demo-models/
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin forkserve \
    && mkdir -p /run/forkserve /models \
    && chown forkserve /run/forkserve \
    && ln -s /usr/local/bin/docker-entrypoint /usr/bin/tf_serving_entrypoint.sh

# The run directory (worker state, Prometheus multiprocess files) and every scratch path on one
# writable mount: the root file system can be read-only (deploy/k8s mounts an emptyDir there).
# No FORKSERVE_CONF: the native mode reads conf/models.toml from the working directory, and the
# TF Serving mode none unless one is given (its models' settings come from TF Serving's files).
ENV FORKSERVE_BIND=0.0.0.0:8000 \
    FORKSERVE_GRPC_BIND=0.0.0.0:8500 \
    FORKSERVE_MODELS=/models \
    FORKSERVE_RUN_DIR=/run/forkserve \
    TMPDIR=/run/forkserve \
    KERAS_HOME=/run/forkserve/keras \
    HOME=/run/forkserve
USER 10001
# 8000: native REST; 8500: gRPC in both modes; 8501: REST as TF Serving's image has it.
EXPOSE 8000 8500 8501
# /healthz on whichever REST port this mode serves.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["forkserve-healthcheck", "8000", "8501"]
# The entrypoint execs the server, so gunicorn is PID 1: SIGTERM drains in-flight requests (graceful_timeout 30 s)
# and exits 0; it reaps its workers. No CMD: without arguments the entrypoint serves natively (or as TF Serving with MODEL_NAME).
ENTRYPOINT ["/usr/local/bin/docker-entrypoint"]
CMD []
