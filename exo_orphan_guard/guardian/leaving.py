"""How a guardian leaves without leaving an exo unwatched (`records.watch_requests`).

A guardian exo's worker started leaves once no exo is left to watch. Each scan it
watches the exo processes whose workers asked to be watched (`requested`); before it
leaves it says so in its state, then reads the requests once more, and stays if one
lives (`may_leave`). A worker-started guardian that finds the lock held waits for it
only while its holder is leaving or has not said yet who it is (`holder_leaving`):
the holder then either leaves it the lock, or stays and sees the requests.

Nor does it leave while a young spawn child of exo's environment is orphaned but not
known to be exo (`starting`): a runner whose exo died before any scan saw it under
its live parent shows it is exo's only once its start-up has mapped exo's extension,
a moment later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Final, final

from ..records import guardian_state, watch_requests
from ..records.guardian_state import GuardianState
from ..sweeper.verdicts import Verdict
from ..system import boot_id

STARTING_SECONDS: Final = 30.0
"""How young an orphaned spawn child not known to be exo still may show it is: a
runner maps exo's extension while its main module is imported again, at its start."""


@final
class Leaving:
    """The requests in the user's guardian directory, and this guardian's state."""

    def __init__(self, home: Path, state: GuardianState) -> None:
        self.home = home
        self._state = state

    def requested(self) -> tuple[int, ...]:
        """The pids of the live exo processes that asked to be watched."""
        return tuple(process.pid for process in watch_requests.live_requests(self.home))

    def may_leave(self) -> bool:
        """Whether this guardian may leave now: said first (a worker that looks from
        now on starts another guardian), then no live request is left."""
        guardian_state.write_state(self.home, dataclasses.replace(self._state, leaving=True))
        if watch_requests.live_requests(self.home):
            guardian_state.write_state(self.home, self._state)
            return False
        return True


def holder_leaving(home: Path) -> bool:
    """Whether the guardian holding the lock is leaving, or has not written its state
    yet (starting, or a moment from letting go): worth waiting for."""
    holder = guardian_state.running(home, boot_id())
    return holder is None or holder.leaving


def starting(verdicts: Sequence[Verdict], now: float) -> bool:
    """Whether a spawn child spared as orphaned, not known to be exo, started less
    than `STARTING_SECONDS` before `now` (`time.time()`): it may be a runner still
    starting, which will show it is exo's."""
    return any(
        verdict.not_known_exo
        and verdict.process is not None
        and now - verdict.process.create_time < STARTING_SECONDS
        for verdict in verdicts
    )
