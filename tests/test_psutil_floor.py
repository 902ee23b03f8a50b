"""psutil 7.2.1 (what exo locks) is the floor. Before 7.2.2, macOS `cmdline()` could
raise a bare `OSError` (errno 0, psutil #2708) instead of `AccessDenied`: the
process-table readers must treat its command line as unreadable (so it is spared), not
fail the whole scan. Injected here; the readers are the ones macOS uses."""

from __future__ import annotations

import os

import psutil
import pytest

from exo_orphan_guard.sweeper import process_table
from exo_orphan_guard.system._posix import iter_command_lines
from exo_orphan_guard.system.process_facts import Pid


@pytest.fixture
def parent_cmdline_fails(monkeypatch: pytest.MonkeyPatch) -> int:
    real = psutil.Process.cmdline
    victim = os.getppid()

    def cmdline(self: psutil.Process) -> list[str]:
        if self.pid == victim:
            raise OSError(0, "Undefined error")
        return real(self)

    monkeypatch.setattr(psutil.Process, "cmdline", cmdline)
    return victim


def test_command_lines_skip_a_process_whose_cmdline_raises_a_bare_oserror(
    parent_cmdline_fails: int,
) -> None:
    found = dict(iter_command_lines())
    assert os.getpid() in found
    assert parent_cmdline_fails not in found


def test_the_process_table_keeps_a_process_whose_command_line_it_cannot_read(
    parent_cmdline_fails: int,
) -> None:
    table = process_table.gather([os.getpid(), parent_cmdline_fails], fingerprint=False, match=None)
    assert table.processes[Pid(os.getpid())].argv
    parent = table.processes[Pid(parent_cmdline_fails)]
    assert parent.argv == () and not parent.vanished  # unknown, never taken for gone
