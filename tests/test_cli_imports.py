"""What the command line loads: each command imports what it uses, so `scan` starts
without anyio or loguru (its speed is measured in docs/benchmarks.md, not here); the
package's public names still load on first use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import exo_orphan_guard
from exo_orphan_guard.tools import cli

HEAVY = ("anyio", "loguru")


def modules_after(arguments: list[str]) -> list[str]:
    script = (
        "import json, sys\n"
        "from exo_orphan_guard.tools import cli\n"
        "try:\n"
        f"    cli.main({arguments!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    loaded: list[str] = json.loads(finished.stdout.splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    "arguments",
    [["scan"], ["scan", "--json", "--registry-only"], ["explain", "errno 16"], ["doctor"]],
)
def test_commands_start_without_anyio_or_loguru(arguments: list[str]) -> None:
    loaded = modules_after(arguments)
    assert [name for name in loaded if name.split(".")[0] in HEAVY] == []
    assert "exo_orphan_guard.sweeper.judging" in loaded or arguments[0] == "explain"


@pytest.mark.parametrize("arguments", [["--version"], ["explain", "errno 16"]])
def test_commands_that_read_no_process_start_without_psutil_or_the_backend(
    arguments: list[str],
) -> None:
    loaded = modules_after(arguments)
    assert [name for name in loaded if name.split(".")[0] == "psutil"] == []
    assert "exo_orphan_guard.system.backend" not in loaded
    assert "exo_orphan_guard.system.settings" in loaded


def test_the_system_interface_loads_its_backend_on_first_use() -> None:
    from exo_orphan_guard import system

    assert system.BACKEND in ("linux", "portable")
    for name in system.interface():
        assert callable(getattr(system, name))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = system.nothing_here  # pyright: ignore[reportAttributeAccessIssue]


def test_the_public_names_load_on_first_use() -> None:
    assert set(exo_orphan_guard.__all__) <= set(dir(exo_orphan_guard))
    for name in exo_orphan_guard.__all__:
        assert getattr(exo_orphan_guard, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = exo_orphan_guard.nothing_here  # pyright: ignore[reportAttributeAccessIssue]


def test_a_strategy_this_machine_lacks_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    missing = "kqueue" if sys.platform == "linux" else "pdeathsig"
    assert cli.main(["selftest", "--strategy", missing]) == 2
    error = capsys.readouterr().err
    assert error == f"exo-orphan-guard: error: --strategy {missing} is not usable on this machine\n"
