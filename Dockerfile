# forkserve: the demo model served on port 8000. Build and test: `make image-test` (tests/image/).
#   podman build -t forkserve .            # or docker build; BASE names another bookworm image
#   podman run --rm -p 8000:8000 forkserve # answers the README's demo request
#   podman run --rm -p 8000:8000 -v /srv/models:/models forkserve   # your repository instead
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

# The demo repository, copied into a new /models volume on first use; mount your own over it.
COPY models/ /models/
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin forkserve \
    && mkdir -p /run/forkserve \
    && chown forkserve /run/forkserve
VOLUME /models

# The run directory (worker state, Prometheus multiprocess files) and every scratch path on one
# writable mount: the root file system can be read-only (deploy/k8s mounts an emptyDir there).
ENV FORKSERVE_BIND=0.0.0.0:8000 \
    FORKSERVE_GRPC_BIND=0.0.0.0:8500 \
    FORKSERVE_MODELS=/models \
    FORKSERVE_CONF=/opt/forkserve/conf/models.toml \
    FORKSERVE_RUN_DIR=/run/forkserve \
    TMPDIR=/run/forkserve \
    KERAS_HOME=/run/forkserve/keras \
    HOME=/run/forkserve
USER 10001
EXPOSE 8000 8500
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
# gunicorn is PID 1: SIGTERM drains in-flight requests (graceful_timeout 30 s) and exits 0; it reaps its workers.
CMD ["gunicorn", "-c", "gunicorn.conf.py"]
