"""Environment variables, parsed by pure functions that return a value and a warning.

Nothing here raises on bad input: the guard must never break exo because of a typo.
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Generic, Literal, TypeVar, final, get_args

TOGGLE_ENV: Final = "EXO_ORPHAN_GUARD"
STRATEGY_ENV: Final = "EXO_ORPHAN_GUARD_STRATEGY"
DIR_ENV: Final = "EXO_ORPHAN_GUARD_DIR"
GRACE_ENV: Final = "EXO_ORPHAN_GUARD_GRACE"
BUSY_WAIT_ENV: Final = "EXO_ORPHAN_GUARD_BUSY_WAIT"
WORKER_ENV: Final = "EXO_ORPHAN_GUARD_WORKER"
"""Set by `prepare_worker()` in the worker and inherited by every runner it spawns."""
RUNNER_ENV: Final = "EXO_ORPHAN_GUARD_RUNNER"
"""Set by `guard_runner()` in the runner and inherited by everything it starts: on
Linux, the proof that a process in a dead runner's group was started by that runner."""
EXO_HOME_ENV: Final = "EXO_HOME"
XDG_CACHE_ENV: Final = "XDG_CACHE_HOME"
"""exo's own: its home, relative to the user's home (exo's shared/constants.py)."""
REGISTRY_NAME: Final = "orphan-guard"
BACKEND_ENV: Final = "EXO_ORPHAN_GUARD_BACKEND"
"""`portable` forces the psutil-and-stdlib backend macOS runs, on any OS."""

Strategy = Literal["auto", "pidfd", "kqueue", "sentinel", "poll", "pdeathsig", "watchdog"]
STRATEGIES: Final[tuple[Strategy, ...]] = get_args(Strategy)
BackendChoice = Literal["auto", "portable"]

_ON: Final = frozenset({"1", "true"})
"""What exo's hooks module takes for on (`os.getenv(...).lower() in ("true", "1")`, the
way exo reads its own toggles): the package must never think itself on where exo
does not."""
_OFF: Final = frozenset({"", "0", "false"})

DEFAULT_GRACE_SECONDS: Final = 10.0
"""How long a runner whose worker died may take to end the clean way (exo's own
shutdown) before it is killed; also what a sweep waits between SIGTERM and SIGKILL."""
MAX_GRACE_SECONDS: Final = 120.0
MIN_GRACE_SECONDS: Final = 0.5
"""The least grace above 0 that `EXO_ORPHAN_GUARD_GRACE` gives (a smaller one gets a
warning and this). An idle runner's clean ending takes about 50 ms from its start to
its exit (the benchmark's p99, notice included, is about 100 ms); a grace of
microseconds killed it a moment after it began, in the middle of releasing what it
holds, which is worse than grace 0 (no clean ending, killed at once). Half a second
leaves it room on a loaded machine, as the wedge bound does for the busy wait (beside
two busy loops per core every idle runner ended clean; beside eight, its interpreter's
own teardown outgrew it: docs/benchmarks.md, the floor's section); exo's
own shutdown (0.8-1.2 s) needs more, as the default gives. The floor suits the
setting's other two uses too: a sweep waits after SIGTERM only until its targets are
gone, so the floor delays only a process that outlives SIGTERM, and gives its handler
the time to act that a smaller grace would make pointless; `exec` likewise gives its
command's SIGTERM handler at least this. An explicit `--grace` (`sweep`, `exec`) is
one command's own choice, reaches no runner's clean ending, and is taken as given."""
WEDGE_SECONDS: Final = 0.5
"""A runner that has not begun its clean ending this long after the notice is busy in
native code: its watchdog records it so (sweeps then wait for it too), and with
`EXO_ORPHAN_GUARD_BUSY_WAIT=0` kills it then."""
DEFAULT_BUSY_WAIT_SECONDS: Final = 120.0
"""How long, from the notice, a runner busy in native code (an `mx.eval`, a weight
read, `mx.distributed.init()`) is waited for to come back to Python and end the clean
way: one 4096-token prefill chunk of a 671B model at about 60 tok/s, with margin."""
MAX_BUSY_WAIT_SECONDS: Final = 900.0

T = TypeVar("T")


@final
@dataclass(frozen=True, slots=True)
class Parsed(Generic[T]):
    value: T
    warning: str | None = None


def parse_toggle(raw: str | None) -> Parsed[bool]:
    if raw is None:
        return Parsed(False)
    word = raw.lower()
    if word in _ON:
        return Parsed(True)
    if word in _OFF:
        return Parsed(False)
    return Parsed(
        False,
        f"{TOGGLE_ENV}={raw!r} is not true or 1 (how exo reads its toggles): "
        "the orphan guard stays off",
    )


def parse_strategy(raw: str | None) -> Parsed[Strategy]:
    word = (raw or "").strip().lower()
    if word in ("", "auto"):
        return Parsed("auto")
    for strategy in STRATEGIES:
        if word == strategy:
            return Parsed(strategy)
    return Parsed(
        "auto",
        f"{STRATEGY_ENV}={raw!r} is not one of {', '.join(STRATEGIES)}: using auto",
    )


def parse_backend(raw: str | None) -> Parsed[BackendChoice]:
    word = (raw or "").strip().lower()
    if word in ("", "auto"):
        return Parsed("auto")
    if word == "portable":
        return Parsed("portable")
    return Parsed("auto", f"{BACKEND_ENV}={raw!r} is not one of auto, portable: using auto")


def parse_grace(raw: str | None, *, floor: float = MIN_GRACE_SECONDS) -> Parsed[float]:
    """`floor`: what a value above 0 but below it is raised to (`MIN_GRACE_SECONDS`;
    the command line's `--grace` passes 0, none)."""
    if raw is None or not raw.strip():
        return Parsed(DEFAULT_GRACE_SECONDS)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds <= MAX_GRACE_SECONDS:
        return Parsed(
            DEFAULT_GRACE_SECONDS,
            f"{GRACE_ENV}={raw!r} is not a number of seconds in 0..{MAX_GRACE_SECONDS:g}: "
            f"using {DEFAULT_GRACE_SECONDS:g}",
        )
    if 0.0 < seconds < floor:
        # A clean ending that begins would be killed at once, half-way through; 0 is
        # how to ask for no clean ending.
        return Parsed(
            floor,
            f"{GRACE_ENV}={raw!r} is below the {floor:g} s floor, too short for a runner "
            f"to end the clean way (0: killed at once): using {floor:g}",
        )
    return Parsed(seconds)


def parse_busy_wait(raw: str | None) -> Parsed[float]:
    if raw is None or not raw.strip():
        return Parsed(DEFAULT_BUSY_WAIT_SECONDS)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds <= MAX_BUSY_WAIT_SECONDS:
        return Parsed(
            DEFAULT_BUSY_WAIT_SECONDS,
            f"{BUSY_WAIT_ENV}={raw!r} is not a number of seconds in "
            f"0..{MAX_BUSY_WAIT_SECONDS:g}: using {DEFAULT_BUSY_WAIT_SECONDS:g}",
        )
    if 0.0 < seconds < WEDGE_SECONDS:
        # Shorter than a runner needs to come back to Python and begin its clean
        # ending: idle runners would be killed hard as "busy in native code".
        return Parsed(
            WEDGE_SECONDS,
            f"{BUSY_WAIT_ENV}={raw!r} is below the {WEDGE_SECONDS:g} s wedge bound, "
            f"too short for a runner to begin its clean ending: using {WEDGE_SECONDS:g}",
        )
    return Parsed(seconds)


def busy_wait_setting() -> Parsed[float]:
    """EXO_ORPHAN_GUARD_BUSY_WAIT: how long a runner busy in native code is waited for."""
    return parse_busy_wait(os.environ.get(BUSY_WAIT_ENV))


def busy_bound(busy_wait: float) -> float:
    """Seconds from the notice until a runner that has not come back to Python is
    killed: the busy wait, or with 0 the old wedge bound."""
    return busy_wait if busy_wait > 0 else WEDGE_SECONDS


def interrupt_bound(busy_wait: float, grace: float) -> float:
    """Seconds an exo runner has, after a SIGINT from outside, to exit before SIGKILL:
    the busy wait (it may be in native code, taking SIGINT only when its call returns),
    and never less than the grace, the time any runner gets for its clean ending
    (unwinding an idle exo runner takes 0.4-1.4 s on exo's real runner)."""
    return max(busy_bound(busy_wait), grace)


def grace_setting() -> Parsed[float]:
    """EXO_ORPHAN_GUARD_GRACE: the runner's clean-ending bound and the default grace of
    `sweep` and `exec`."""
    return parse_grace(os.environ.get(GRACE_ENV))


def exo_cache_home(environ: Mapping[str, str] | None = None, platform: str = sys.platform) -> Path:
    """exo's cache directory, `EXO_CACHE_HOME` in exo's constants.py: `~/$EXO_HOME`
    when set, else `~/.exo` on macOS and `$XDG_CACHE_HOME/exo` (default
    `~/.cache/exo`) on Linux."""
    env = os.environ if environ is None else environ
    exo_home = env.get(EXO_HOME_ENV)
    if exo_home is not None:
        return Path.home() / exo_home
    if platform != "linux":
        return Path.home() / ".exo"
    cache = env.get(XDG_CACHE_ENV, "").strip() or str(Path.home() / ".cache")
    return Path(cache) / "exo"


def registry_dir(environ: Mapping[str, str] | None = None, platform: str = sys.platform) -> Path:
    """`EXO_ORPHAN_GUARD_DIR`; else `orphan-guard` in exo's cache directory, where
    exo's in-tree hooks module writes its hand-over markers (`exo_cache_home`)."""
    env = os.environ if environ is None else environ
    override = env.get(DIR_ENV, "").strip()
    if override:
        return Path(override).expanduser()
    return exo_cache_home(env, platform) / REGISTRY_NAME


def former_registry_dir() -> Path:
    """Where the registry was before it followed exo's directories (`~/.exo`, exo's
    home on macOS): swept, and read by `doctor`, beside the one `registry_dir`
    names, until nothing is left in it."""
    return Path.home() / ".exo" / REGISTRY_NAME


def registry_dirs(
    environ: Mapping[str, str] | None = None, platform: str = sys.platform
) -> tuple[Path, ...]:
    """The registry, then the former one where it differs (and only then)."""
    current = registry_dir(environ, platform)
    env = os.environ if environ is None else environ
    former = former_registry_dir()
    if env.get(DIR_ENV, "").strip() or current == former:
        return (current,)
    return (current, former)


def exo_pidfile(environ: Mapping[str, str] | None = None, platform: str = sys.platform) -> Path:
    """Where exo main writes `exo.pid`, in its cache directory. Read only: exo holds
    its lock (flopen), and taking it would fail exo's next start."""
    return exo_cache_home(environ, platform) / "exo.pid"


USER_DIR_ENV: Final = "EXO_ORPHAN_GUARD_USER_DIR"
USER_DIR_NAME: Final = ".exo-orphan-guard"


def user_dir_setting(environ: Mapping[str, str] | None = None) -> Parsed[Path]:
    """Where the guardian keeps what is one per user and machine (`records.user_dir`):
    `~/.exo-orphan-guard` in the home the password database names, which no
    environment variable moves (`HOME` neither: launchd, systemd, sudo and exo's app
    each set their own). `EXO_ORPHAN_GUARD_USER_DIR` moves it, for tests and
    sandboxes: set for every process of the user, or for none."""
    env = os.environ if environ is None else environ
    raw = env.get(USER_DIR_ENV, "").strip()
    default = _password_home() / USER_DIR_NAME
    if not raw:
        return Parsed(default)
    chosen = Path(raw).expanduser()
    if not chosen.is_absolute():
        return Parsed(default, f"{USER_DIR_ENV}={raw!r} is not an absolute path: using {default}")
    return Parsed(chosen)


def _password_home() -> Path:
    try:
        return Path(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:  # a uid with no entry (a container's): the only home there is
        return Path.home()


SCAN_INTERVAL_ENV: Final = "EXO_ORPHAN_GUARD_SCAN_INTERVAL"
DEFAULT_SCAN_INTERVAL_SECONDS: Final = 2.0
"""How often the guardian looks for new exo processes and runners (docs/benchmarks.md
has what a scan costs at 2,000 processes)."""


MIN_SCAN_INTERVAL_SECONDS: Final = 0.1
MAX_SCAN_INTERVAL_SECONDS: Final = 600.0


def scan_interval_setting() -> Parsed[float]:
    return parse_scan_interval(os.environ.get(SCAN_INTERVAL_ENV))


def parse_scan_interval(raw: str | None) -> Parsed[float]:
    if raw is None or not raw.strip():
        return Parsed(DEFAULT_SCAN_INTERVAL_SECONDS)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not MIN_SCAN_INTERVAL_SECONDS <= seconds <= MAX_SCAN_INTERVAL_SECONDS:
        return Parsed(
            DEFAULT_SCAN_INTERVAL_SECONDS,
            f"{SCAN_INTERVAL_ENV}={raw!r} is not a number of seconds in "
            f"{MIN_SCAN_INTERVAL_SECONDS:g}..{MAX_SCAN_INTERVAL_SECONDS:g}: "
            f"using {DEFAULT_SCAN_INTERVAL_SECONDS:g}",
        )
    return Parsed(seconds)


def guard_enabled() -> Parsed[bool]:
    return parse_toggle(os.environ.get(TOGGLE_ENV))
