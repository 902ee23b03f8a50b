"""`doctor`'s wired-memory line: memory a hard-killed MLX process left wired (macOS).

oMLX users found Macs with "496 GB of 512 GB wired with far less accounted for by live
processes" after MLX processes were hard-killed; only a reboot gave it back. exo then
reports low `ramAvailable` and answers 503 "likely does not fit". The line compares
machine-wide wired memory with the physical footprints of live processes (which
include their Metal buffers) and warns when the difference is past both floors.
"""

from __future__ import annotations

from typing import Final

from .. import system
from ..system.process_facts import WiredMemory
from .check import Check

NAME: Final = "wired memory"
FLOOR_BYTES: Final = 8 * 2**30
FLOOR_SHARE_OF_RAM: Final = 0.10
SOURCE: Final = (
    "wired: host_statistics64 wire_count x page size (psutil); "
    "accounted: proc_pid_rusage physical footprints"
)
REPORTS: Final = (
    "https://github.com/jundot/omlx/issues/2184",
    "https://github.com/jundot/omlx/issues/2855",
)


def measure() -> WiredMemory | str | None:
    """This machine's figures; a string: why macOS's could not be read; None: not macOS."""
    return system.wired_memory()


def check(measured: WiredMemory | str | None) -> Check:
    """None: not macOS. A string: why macOS's figures could not be read."""
    if measured is None:
        return Check(
            NAME, "SKIP", "does not apply here: stranded wired memory is measured on macOS"
        )
    if isinstance(measured, str):
        return Check(NAME, "SKIP", measured, figures=to_json(measured))
    figures = to_json(measured)
    unreadable = (
        f"; {measured.unreadable} process(es) could not be read (other users': run as root "
        "to count them)"
        if measured.unreadable
        else ""
    )
    detail = (
        f"{_gib(measured.wired)} of {_gib(measured.ram)} wired; live processes' footprints "
        f"{_gib(measured.footprints)} ({measured.processes} processes{unreadable}): "
        f"{_gib(max(0, measured.unaccounted))} unaccounted ({SOURCE})"
    )
    if not stranded(measured):
        return Check(NAME, "OK", detail, figures=figures)
    return Check(
        NAME,
        "WARN",
        detail,
        "reboot this Mac: memory left wired by hard-killed MLX processes comes back only then, "
        'and until then exo sees too little free memory (503 "likely does not fit"); '
        f"reported by oMLX users: {', '.join(REPORTS)}",
        figures=figures,
    )


def to_json(measured: WiredMemory | str) -> dict[str, object]:
    if isinstance(measured, str):
        return {"error": measured}
    return {
        "ram_bytes": measured.ram,
        "wired_bytes": measured.wired,
        "footprints_bytes": measured.footprints,
        "unaccounted_bytes": measured.unaccounted,
        "processes": measured.processes,
        "unreadable_processes": measured.unreadable,
        "stranded": stranded(measured),
        "source": SOURCE,
    }


def stranded(measured: WiredMemory) -> bool:
    """Past both floors, 8 GiB and 10% of RAM: live processes' footprints count more
    than their wired share, so a healthy Mac stays far below either."""
    return measured.unaccounted > max(FLOOR_BYTES, FLOOR_SHARE_OF_RAM * measured.ram)


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"
