"""Real exo for the tests that need it: throw-away copies of exo (EXO_SRC) at five
versions (v1.0.61, v1.0.65, v1.0.69, v1.0.71, main), patched or not, their Python
3.13 environments (scripts/exo-venv, cached between runs, each with the mlx, mlx-lm
and transformers its own uv.lock pins), and exo's real worker and checks run inside
them.

Without EXO_SRC (or MLX_LM_SRC where exo's runner must load), a test that asks for
them is skipped with what to run: `make test-exo EXO_SRC=... MLX_LM_SRC=...`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from exo_orphan_guard.exo import patching
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import identity_of
from tests.helpers.processes import kill_all

REPO = Path(__file__).resolve().parents[2]


SUPPORT = REPO / "tests" / "exo_support"


COMMITS = {
    "v1.0.61": "4759b09d4c81",
    "v1.0.65": "281aaeb01348",
    "v1.0.69": "5327bdde8466",
    "v1.0.71": "fd707de30b42",
    "main": "b5375f8cee43",
}
"""The exo versions the real-runner checks run at: the first and last release the
anchors were measured from, two between (the runner a `main()` function up to
v1.0.65, a `Runner` class in `llm_inference/` from v1.0.69), and main."""

SERIES_VERSIONS = ("v1.0.71", "main")
"""Where a stored series fits (`patches/<version>/`); `patch apply` places the same
hooks at the anchors of the others. The checks of the stored files themselves (`git
am`, `--source` on exo's uv project) run here."""

VERSION_IDS = {**{version: version for version in COMMITS}, "v1.0.65": "v1.0.65-pypi-mlx-lm"}
"""Test ids: v1.0.65's says its mlx-lm is PyPI's 0.30.4, not the fork its uv.lock
pins (AlexCheema/mlx-lm a5daf2b, also 0.30.4, which cannot be fetched here); see
scripts/exo-venv for what each version's runner environment has."""


def versions(only: tuple[str, ...] = tuple(COMMITS)) -> pytest.MarkDecorator:
    """Parametrise a test over exo versions, with ids that say what each runs on."""
    return pytest.mark.parametrize(
        "version", [pytest.param(version, id=VERSION_IDS[version]) for version in only]
    )


HOW_TO_RUN = "run `make test-exo EXO_SRC=/path/to/exo MLX_LM_SRC=/path/to/mlx-lm`"


def exo_src() -> Path:
    value = os.environ.get("EXO_SRC", "").strip()
    if not value:
        pytest.skip(
            f"EXO_SRC is not set, so there is no exo checkout to test against: {HOW_TO_RUN}"
        )
    path = Path(value).expanduser()
    if not (path / ".git").exists() and not (path / "HEAD").exists():
        pytest.fail(f"EXO_SRC={value} is not a git clone of exo-explore/exo")
    return path


def mlx_lm_src() -> Path:
    value = os.environ.get("MLX_LM_SRC", "").strip()
    if not value:
        pytest.skip(f"MLX_LM_SRC is not set, so exo's runner cannot load: {HOW_TO_RUN}")
    return Path(value).expanduser()


def exo_tree(
    work: Path, version: str, *, patched: bool, variant: str = "", with_package: bool = False
) -> Path:
    """A fresh copy of exo at `version`'s commit; with the PR applied if asked, and
    the local series on top with `with_package`. A `variant` is another copy of the
    same (its own venv: `exo_venv(package=False)` needs a tree of its own, as a venv
    follows its tree)."""
    source = exo_src()
    state = ("patched-local" if with_package else "patched") if patched else "pristine"
    target = work / "-".join(filter(None, [version, state, variant]))
    if not target.exists():
        target.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(source), "archive", COMMITS[version]],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
        if patched:
            patch_tree(target, version, with_package=with_package)
    return target


def patch_tree(tree: Path, version: str, *, with_package: bool = False) -> list[str]:
    """The PR (and with `with_package` the local series) into a pristine `tree` as
    `patch apply` puts them: a stored series where it fits, placed at the anchors
    elsewhere. The files they changed, relative to the tree."""
    status, changed = patching.apply(tree, with_package=with_package)
    assert changed and status.state == "applied", status.state
    assert (status.local is not None) == with_package
    if version in SERIES_VERSIONS:
        assert status.series.name == version, status.series.name
    local = [] if status.local is None else list(status.local.files)
    return list(dict.fromkeys([*status.series.files, *local]))


def exo_venv(tree: Path, cache: Path, *, runner: bool = False, package: bool = True) -> Path:
    """The tree's venv (scripts/exo-venv: one per tree), with this checkout's
    exo_orphan_guard on its path, or with `package` False without it: then
    `import exo_orphan_guard` is checked to fail in it (give such a tree no other
    use, as `exo_tree(variant="bare")`)."""
    command = [str(REPO / "scripts" / "exo-venv"), str(tree), str(cache)]
    if runner:
        command += ["--runner", str(mlx_lm_src())]
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.fail(f"scripts/exo-venv failed: {built.stderr.strip().splitlines()[-1:]}")
    venv = Path(built.stdout.strip().splitlines()[-1])
    (site_packages,) = venv.glob("lib/python3.*/site-packages")
    pth = site_packages / "exo_orphan_guard_checkout.pth"
    if not package:
        pth.unlink(missing_ok=True)
        absent = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import exo_orphan_guard"],
            cwd=tree,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            capture_output=True,
            text=True,
            check=False,
        )
        assert "No module named 'exo_orphan_guard'" in absent.stderr, (
            f"exo_orphan_guard importable in {venv}: {absent.stderr[-500:]}"
        )
        return venv
    # exo_orphan_guard from this checkout, and nothing else of it (no `tests` package
    # to shadow exo's); psutil, anyio and loguru are exo's own dependencies. One
    # directory per checkout: checkouts that share a cache must not share a link.
    key = hashlib.sha256(str(REPO).encode()).hexdigest()[:12]
    path_dir = cache / "exo-orphan-guard-path" / key
    path_dir.mkdir(parents=True, exist_ok=True)
    link = path_dir / "exo_orphan_guard"
    if not link.is_symlink() or link.resolve() != (REPO / "exo_orphan_guard").resolve():
        link.unlink(missing_ok=True)
        link.symlink_to(REPO / "exo_orphan_guard")
    pth.write_text(f"{path_dir}\n")
    return venv


def exo_environment(scratch: Path, *, guard: bool | None) -> dict[str, str]:
    """exo's environment in `scratch`; the guard's toggle on or off, or with `guard`
    None not set at all (an exo that has never heard of the guard)."""
    (scratch / "resources").mkdir(parents=True, exist_ok=True)
    (scratch / "dashboard").mkdir(exist_ok=True)
    (scratch / "dashboard" / "index.html").write_text("<!doctype html>\n")
    env = dict(os.environ)
    env.update(
        {
            "EXO_RESOURCES_DIR": str(scratch / "resources"),
            "EXO_DASHBOARD_DIR": str(scratch / "dashboard"),
            "XDG_CACHE_HOME": str(scratch / "xdg-cache"),
            "PYTHONDONTWRITEBYTECODE": "1",
            settings.DIR_ENV: str(scratch / "registry"),
        }
    )
    if guard is None:
        env.pop(settings.TOGGLE_ENV, None)
    else:
        env[settings.TOGGLE_ENV] = "1" if guard else "0"
    env.pop(settings.WORKER_ENV, None)
    # This checkout's package, whatever the shared venv cache's .pth names (another
    # checkout may have made it): PYTHONPATH comes first.
    path_dir = scratch / "guard-path"
    path_dir.mkdir(exist_ok=True)
    link = path_dir / "exo_orphan_guard"
    if not link.is_symlink():
        link.symlink_to(REPO / "exo_orphan_guard")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path_dir), env.get("PYTHONPATH")]))
    return env


@contextlib.contextmanager
def exo_worker(
    tree: Path,
    venv: Path,
    version: str,
    *,
    guard: bool | None,
    grace: float | None = None,
    extra_env: dict[str, str] | None = None,
    package: bool = True,
) -> Generator[dict[str, Any]]:
    """exo's real RunnerSupervisor spawning exo's real entrypoint, runner idle. The
    report also names the registry the runner records itself (and its ending) in.
    With `package` False, nothing of this checkout is on exo's path."""
    scratch = Path(tempfile.mkdtemp(prefix="eog-exo-worker-"))
    stderr = (scratch / "harness.log").open("wb")
    environment = exo_environment(scratch, guard=guard)
    if not package:
        environment.pop("PYTHONPATH", None)
    if grace is not None:
        environment[settings.GRACE_ENV] = f"{grace!r}"
    for name, value in (extra_env or {}).items():
        joined = [value, environment.get(name, "")] if name == "PYTHONPATH" else [value]
        environment[name] = os.pathsep.join(filter(None, joined))
    harness = subprocess.Popen(
        [
            str(venv / "bin" / "python"),
            str(SUPPORT / "worker_harness.py"),
            "--version",
            version,
            "--scratch",
            str(scratch / "harness"),
        ],
        cwd=tree,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
    )
    spawned: list[int] = []
    try:
        assert harness.stdout is not None
        ready, _, _ = select.select([harness.stdout], [], [], 120)
        line = harness.stdout.readline() if ready else b""
        report: dict[str, Any] = json.loads(line or b"{}")
        assert report.get("event") == "runner-idle", (
            report,
            (scratch / "harness.log").read_text()[-3000:],
        )
        spawned.append(report["runner_pid"])
        yield {**report, "registry": scratch / "registry"}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(harness.pid, signal.SIGKILL)
        harness.wait()
        stderr.close()
        kill_all([identity for pid in spawned if (identity := identity_of(pid)) is not None])
        shutil.rmtree(scratch, ignore_errors=True)


def venv_cache() -> Path:
    """Where scripts/exo-venv keeps exo's environments: EXO_VENV_CACHE, or .cache/."""
    return Path(os.environ.get("EXO_VENV_CACHE", REPO / ".cache" / "exo-venv"))
