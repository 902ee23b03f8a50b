"""What keeps the guardian's files bounded over months: run every `UPKEEP_SCANS` scans.

- hand-over markers no process can claim (`handover_marker.remove_stale`): a marker
  goes at its exo's watched death, but one that died unwatched (while no guardian
  ran, say) left its marker for good;
- `endings.jsonl`, cut to this boot's newest lines once it passes half a MiB
  (`endings.compact`), and the registry's temporaries of writers that died: under the
  sweeps' lock, and only if no sweep holds it (a sweep does the same);
- the user's record of begun endings, whose lines matter only until their deadline
  (`begun_record.compact`), and the temporaries of the user's guardian directory.

The log bounds itself (`log`), the watch requests are pruned at each scan, and a
runner's record is a sweep's to remove (it is judged first).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

from ..records import begun_record, endings, handover_marker
from ..records.registry import TEMP_PREFIX, LockUnavailableError, Registry

UPKEEP_SCANS: Final = 30
"""A minute at the default scan interval."""
_STALE_TEMPORARY_SECONDS: Final = 60.0


def upkeep(base: Path, home: Path, boot_id: str, wall_now: float, now: float) -> None:
    """One round, over the registry at `base` and the guardian directory `home`;
    `wall_now`: `time.time()`, `now`: `time.monotonic()`."""
    handover_marker.remove_stale(base, wall_now)
    registry, _ = Registry.open(base, create=False)
    if registry is not None:
        with contextlib.suppress(LockUnavailableError), registry.locked(0.0) as held:
            if held:
                endings.compact(registry.path / endings.ENDINGS_NAME, boot_id)
                registry.remove_stale_temporaries(wall_now)
    begun_record.compact(home, boot_id, now)
    _remove_stale_temporaries(home, wall_now)


def _remove_stale_temporaries(directory: Path, wall_now: float) -> None:
    """`guardian.json`'s, of a guardian that died between its write and its rename."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if name.startswith(TEMP_PREFIX):
                path = directory / name
                with contextlib.suppress(OSError):
                    if wall_now - os.lstat(path).st_mtime > _STALE_TEMPORARY_SECONDS:
                        os.unlink(path)
