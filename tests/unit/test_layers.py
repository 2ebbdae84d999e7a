"""Which package may import which: the layers of docs/design.md, read from every module's AST (lazy imports included).

Lowest first: the core (server/*.py), then telemetry and tensors, protocols (both wire forms of each
API, protobuf messages but no grpc), model hosting, the dataplane, the two transports (http: Flask;
rpc: grpcio), and the process roles (worker, master, cli). A package imports only what its row
allows; Flask and grpc are imported by their transport only. Walking the AST instead of importing
sees the imports inside functions, which an import-time probe (test_import_rules.py) cannot.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "server"

BELOW_MODELS = {"core", "telemetry", "tensors", "protocols"}
BELOW_TRANSPORTS = BELOW_MODELS | {"models", "dataplane"}
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "telemetry": {"core"},
    "tensors": {"core"},
    "protocols": {"core", "tensors"},
    "models": BELOW_MODELS,
    "dataplane": BELOW_MODELS | {"models"},
    "http": BELOW_TRANSPORTS,
    "rpc": BELOW_TRANSPORTS,
    "worker": BELOW_TRANSPORTS | {"http", "rpc"},
    "spawn": {"core"},  # gunicorn's boot after fork, and the zygote (which imports the rest by name, in its own process)
    "master": {"core", "telemetry", "protocols", "spawn"},  # protocols: TF Serving's config files, protobuf messages only
    "cli": BELOW_MODELS | {"models"},
    "entry": {"core", "cli"},
}
FRAMEWORKS = {"flask": "http", "werkzeug": "http", "grpc": "rpc", "grpc_health": "rpc", "grpc_reflection": "rpc",
              "uvloop": "rpc"}


def module_name(path: Path) -> str:
    """server/a/b.py -> server.a.b; server/a/__init__.py -> server.a."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def package_of(module: str) -> str:
    """The layer a server module belongs to: its subpackage, "core" for server/*.py, "entry" for server.__main__."""
    parts = module.split(".")
    if module == "server.__main__":
        return "entry"
    if len(parts) == 1 or (len(parts) == 2 and (SERVER / f"{parts[1]}.py").exists()):
        return "core"
    return parts[1]


def imports(path: Path, source: str | None = None) -> Iterator[str]:
    """Every module `path` imports, at top level or inside a function, relative imports resolved."""
    source = path.read_text() if source is None else source
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(filter(None, [base, node.module or ""]))
            if node.module is None or not node.level and module.startswith("server"):
                yield from (f"{module}.{alias.name}" for alias in node.names)
            yield module


def violations() -> set[str]:
    """"importer -> imported" for every import a package's row does not allow."""
    found = set()
    for path in sorted(SERVER.rglob("*.py")):
        importer = module_name(path)
        layer = package_of(importer)
        for imported in imports(path):
            top = imported.split(".")[0]
            if top == "server":
                target = package_of(_existing(imported))
                if target != layer and target not in ALLOWED[layer]:
                    found.add(f"{importer} -> {_existing(imported)}")
            elif top in FRAMEWORKS and FRAMEWORKS[top] != layer:
                found.add(f"{importer} -> {top}")
    return found


def _existing(module: str) -> str:
    """The longest prefix of `module` that is a server module or package (from-imports name attributes too)."""
    parts = module.split(".")
    while len(parts) > 1:
        path = ROOT.joinpath(*parts)
        if path.with_suffix(".py").exists() or (path / "__init__.py").exists():
            return ".".join(parts)
        parts.pop()
    return "server"


def test_every_package_imports_only_the_layers_below_it() -> None:
    assert sorted(violations()) == []


def test_every_server_package_has_a_row() -> None:
    packages = {package_of(module_name(path)) for path in SERVER.rglob("*.py")}
    assert packages <= set(ALLOWED), packages - set(ALLOWED)


def test_what_model_hosting_imports_is_never_a_transport_or_a_role() -> None:
    graph = {module_name(path): {_existing(m) for m in imports(path) if m.startswith("server.")} for path in SERVER.rglob("*.py")}
    seen, todo = set(), [m for m in graph if package_of(m) == "models"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    assert sorted(m for m in seen if package_of(m) in ("http", "rpc", "worker", "master", "cli")) == []


def test_the_walk_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    module = SERVER / "tensors" / "probe.py"
    source = "from . import b64\n\ndef f():\n    import grpc\n    from server.http.app import create\n"
    assert set(imports(module, source)) >= {"grpc", "server.tensors.b64", "server.http.app", "server.http.app.create"}
