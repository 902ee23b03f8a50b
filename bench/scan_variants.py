"""The guardian's scans the benchmarks compare, each run as the guardian itself
(`service run`, its `CheapScan` swapped): today's (every command line), the cheap one
with nothing kept between scans (everything read of what it describes, and the
sightings file parsed, at every scan: as before issue 40's memo), the guardian's own
as it was on 2026-12-06 (`kept-1206`: settled command lines re-read every 150 scans, a
whole listing every 60, the host key's files read at every registry open; only the
saved empty read of a command line stays), and the guardian's own
(`guardian.cheap_scan`: what is new, what cannot change kept), as it was on
2026-12-07 (`judged-1207`: judging at every scan) and as it is (the last judgement
kept while nothing can have changed it, `guardian.judgement`)."""

from __future__ import annotations

import sys
from typing import Final, Literal, final, get_args

from exo_orphan_guard import system
from exo_orphan_guard.guardian import known_processes, service_run
from exo_orphan_guard.guardian.cheap_scan import CheapScan
from exo_orphan_guard.records import host_key, sightings
from exo_orphan_guard.sweeper.process_memo import ProcessMemo
from exo_orphan_guard.sweeper.process_table import is_spawn_candidate
from exo_orphan_guard.system.process_facts import Pid

from .guardian_process import SERVICE_RUN

Variant = Literal["today", "unkept", "kept-1206", "judged-1207", "cheap"]
VARIANTS: Final[tuple[Variant, ...]] = get_args(Variant)
NAMES: Final[dict[Variant, str]] = {
    "today": "today's: every command line",
    "unkept": "cheap: what is new, nothing kept between scans",
    "kept-1206": "cheap, what cannot change kept, as on 2026-12-06",
    "judged-1207": "cheap, what cannot change kept, judged at every scan, as on 2026-12-07",
    "cheap": "cheap, what cannot change kept, a judgement kept while it stands",
}


@final
class EveryCommandLine:
    """Today's scan in the guardian: every process's command line at every scan."""

    memo: ProcessMemo | None = None
    seen: sightings.Reader | None = None
    unchanged = False

    def candidates(self) -> frozenset[Pid]:
        return frozenset(pid for pid, raw in system.iter_command_lines() if is_spawn_candidate(raw))


@final
class Unkept:
    """The cheap scan keeping nothing between scans: no memo, no sightings reader."""

    memo: ProcessMemo | None = None
    seen: sightings.Reader | None = None
    unchanged = False

    def __init__(self) -> None:
        self._scan = CheapScan()

    def candidates(self) -> frozenset[Pid]:
        return self._scan.candidates()


def _never(*_arguments: object) -> bool:
    """No judgement stands: every scan judges (`guardian.judgement`, before it)."""
    return False


def guardian_command(variant: Variant) -> tuple[str, ...]:
    if variant == "cheap":
        return SERVICE_RUN
    return (sys.executable, "-m", "bench.scan_variants", variant)


def main() -> None:
    """`service run` with the scan of the variant named (`today`, `unkept`,
    `kept-1206` or `judged-1207`)."""
    variant = sys.argv[1]
    if variant == "kept-1206":
        known_processes.VERIFY_SCANS = 150  # pyright: ignore[reportConstantRedefinition]
        known_processes.FULL_LISTING_SCANS = 60  # pyright: ignore[reportConstantRedefinition]
        host_key._namespace_and_machine = host_key._namespace_and_machine.__wrapped__  # pyright: ignore[reportPrivateUsage]
        host_key._hostname_key = host_key._hostname_key.__wrapped__  # pyright: ignore[reportPrivateUsage]
        host_key._host_key = host_key._host_key.__wrapped__  # pyright: ignore[reportPrivateUsage]
        service_run.still_stands = _never  # pyright: ignore[reportAttributeAccessIssue]
    elif variant == "judged-1207":
        service_run.still_stands = _never  # pyright: ignore[reportAttributeAccessIssue]
    else:
        service_run.CheapScan = EveryCommandLine if variant == "today" else Unkept
    sys.exit(service_run.run())


if __name__ == "__main__":
    main()
