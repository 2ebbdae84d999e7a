# forkserve: `make run` serves the demo model, `make test` runs the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test unit e2e install install-dev install-tools system-deps protos lint diagrams clean bench-peers image-test

# What serving needs (requirements.txt), and forkserve itself so `python -m server` works from any directory.
$(BIN)/.serving: requirements.txt requirements-nodeps.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-nodeps.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

# Plus the test and benchmark tools (requirements-dev.txt).
$(BIN)/.testing: $(BIN)/.serving requirements-dev.txt
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

# Plus what retrains the bundled models and draws the benchmarks' charts (requirements-tools.txt).
$(BIN)/.tools: $(BIN)/.testing requirements-tools.txt
	$(BIN)/pip install --quiet -r requirements-tools.txt
	touch $@

install: $(BIN)/.serving

install-dev: $(BIN)/.testing

install-tools: $(BIN)/.tools

system-deps:
	scripts/install-system-deps.sh

run: install
	$(BIN)/gunicorn -c gunicorn.conf.py

test: install-dev system-deps
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=20

unit: install-dev
	$(BIN)/python -m pytest tests/unit

e2e: install-dev system-deps
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder tests/e2e

# The *_pb2.py under server/protocols/*/protos, committed, from the .proto beside them (tests check they match).
protos: install-dev
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. server/protocols/v2/protos/open_inference.proto
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. server/protocols/tfserving/protos/config.proto

lint: install-dev
	$(BIN)/ruff check --select F,E9 server tests bench scripts gunicorn.conf.py

# The peers bench.peers measures forkserve against, each in its own virtual environment.
.peers/%/.installed: bench/peer_servers/%-requirements.txt
	$(PYTHON) -m venv .peers/$*
	.peers/$*/bin/pip install --quiet -r $<
	touch $@

bench-peers: install-tools system-deps .peers/mlserver/.installed .peers/kserve/.installed
	$(BIN)/python -m bench.peers

# Builds the container image with podman on a bookworm base made by debootstrap, then runs it
# (tests/image/; about 3 minutes the first time, 30 s after; needs root, podman and debootstrap).
# Where the kernel refuses an OCI runtime's rlimits (some sandboxes), FORKSERVE_IMAGE_RUNNER=chroot
# runs the image's file system, user and command under unshare instead of podman run.
image-test: install-dev
	command -v podman >/dev/null && command -v debootstrap >/dev/null || apt-get install -y -qq --no-install-recommends podman debootstrap
	FORKSERVE_IMAGE_TEST=1 $(BIN)/python -m pytest -s tests/image

diagrams:
	for source in docs/diagrams/*.dot; do dot -Tsvg "$$source" -o "$${source%.dot}.svg"; done

clean:
	rm -rf $(VENV) .peers .pytest_cache *.egg-info
