"""`exo-orphan-guard scan` end to end, as an operator runs it, against PR 2205's line.

The CLI is installed from this package's wheel into a fresh venv (what `pip install`
gives an operator: no editable-install finder on the import path). At each load the
methods run interleaved in random order; `--version` and `python -c pass` show how
much of a scan is interpreter and CLI start-up.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from . import sweep_cost
from .stats import Samples
from .sweep_cost import LoadResult

ROOT = Path(__file__).resolve().parent.parent
PS_AWK = "ps -axo pid,ppid,command | awk '$2==1 && /spawn_main/'"
LOADS = (50, 2000)


@dataclass(frozen=True)
class Installed:
    python: Path
    cli: Path
    modules: tuple[str, ...]
    """Top-level modules from the venv's site-packages that `scan` imports."""


def run(repetitions: int, scratch: Path) -> tuple[Installed, list[LoadResult]]:
    installed = install_from_wheel(scratch)
    registry = scratch / "registry"
    results: list[LoadResult] = []
    for load in LOADS:
        with unrelated_processes(load):
            results.append(_measure(installed, load, repetitions, registry))
            print(f"  cli start-up: {load} unrelated processes done", flush=True)
    return installed, results


def install_from_wheel(scratch: Path) -> Installed:
    wheels = scratch / "wheels"
    # Wheel from the sdist, as `make dist` builds it: no stale build/ of the checkout.
    _quiet([sys.executable, "-m", "build", "--outdir", str(wheels), str(ROOT)])
    (wheel,) = wheels.glob("exo_orphan_guard-*.whl")
    venv = scratch / "venv"
    _quiet([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _quiet([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)])
    return Installed(python, venv / "bin" / "exo-orphan-guard", _scan_modules(python, scratch))


def _scan_modules(python: Path, scratch: Path) -> tuple[str, ...]:
    def top_level(arguments: Sequence[str]) -> set[str]:
        finished = subprocess.run(
            [str(python), "-X", "importtime", *arguments],
            capture_output=True,
            text=True,
            check=False,
        )
        names: set[str] = set()
        for line in finished.stderr.splitlines():
            if line.startswith("import time:") and "|" in line:
                names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
        return names

    scan = top_level(["-m", "exo_orphan_guard", "scan", "--dir", str(scratch / "registry")])
    (site_packages,) = python.parent.parent.glob("lib/python3*/site-packages")
    installed = {path.name.split(".")[0] for path in site_packages.iterdir()}
    return tuple(sorted(name for name in scan & installed if not name.startswith("_")))


def _measure(installed: Installed, load: int, repetitions: int, registry: Path) -> LoadResult:
    commands: dict[str, list[str]] = {
        "`exo-orphan-guard scan`": [str(installed.cli), "scan", "--dir", str(registry)],
        "`exo-orphan-guard scan --registry-only`": [
            str(installed.cli),
            "scan",
            "--registry-only",
            "--dir",
            str(registry),
        ],
        "`exo-orphan-guard --version`": [str(installed.cli), "--version"],
        "`python -c pass` (same interpreter)": [str(installed.python), "-c", "pass"],
        f"`{PS_AWK}`": ["/bin/sh", "-c", PS_AWK],
    }
    samples = {name: Samples() for name in commands}
    for command in commands.values():
        subprocess.run(command, capture_output=True, check=False)  # warm caches once
    for _ in range(repetitions):
        order = list(commands.items())
        random.shuffle(order)
        for name, command in order:
            started = time.perf_counter()
            subprocess.run(command, capture_output=True, check=False)
            samples[name].add((time.perf_counter() - started) * 1000)
    return LoadResult(load, len(psutil.pids()), samples)


@contextmanager
def unrelated_processes(count: int) -> Generator[None]:
    script = f"for i in $(seq {count}); do sleep 3600 & done; wait"
    holder = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(psutil.Process(holder.pid).children()) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not start {count} processes")
            time.sleep(0.05)
        yield
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def _quiet(command: list[str]) -> None:
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def render(installed: Installed, results: list[LoadResult]) -> str:
    lines = [sweep_cost.render(results, "command")]
    lines += [
        "",
        "What `scan` imports from the venv's site-packages (top-level names): "
        + ", ".join(f"`{name}`" for name in installed.modules)
        + ". No anyio, no loguru: only exo's event loop and the hooks need them.",
    ]
    return "\n".join(lines)
