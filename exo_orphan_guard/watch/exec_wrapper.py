"""`exo-orphan-guard exec`: a guarded child for ranks whose entry point cannot be patched.

`mlx.launch` starts every rank as `bash -c '... exec CMD'`, locally or over
`ssh -tt`, and stops it with one SIGTERM from a pid file; nothing stops it when the
launcher itself is killed. Put after `--`, this wrapper becomes the rank's process:
it runs CMD as its child, watches its launcher (its parent) and keeps a keeper
(`exec_watch`, `exec_keeper`), and writes a registry record, so `scan`/`sweep` see it.

CMD and its tree are stopped (SIGTERM, then SIGKILL to CMD and the wrapper's process
group if CMD has not exited within the grace) when the launcher dies, when the wrapper
gets SIGTERM, SIGINT or SIGHUP (passed on to CMD), and with `stdin_hup` when the
wrapper's stdin reaches EOF or hangs up. The grace defaults to EXO_ORPHAN_GUARD_GRACE.
The wrapper exits with CMD's status (128+N for signal N) and never before CMD.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Final, final

from loguru import logger

from .. import system
from ..system import settings
from ..system.identity import ProcessIdentity, current_identity, identity_of, liveness
from ..system.once import warn_once
from .exec_watch import ExecWatch, Watched, rank_prefix
from .tree_kill import kill_verified, verified_descendants, verified_members

FORWARDED_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STDIN_HUP_SIGNAL: Final = signal.SIGTERM
"""What CMD gets when stdin closes: what `mlx.launch` itself sends to stop a rank."""
EXIT_CANNOT_EXECUTE: Final = 126
EXIT_NOT_FOUND: Final = 127
EXIT_PARENT_GONE: Final = 1
_LOG_PREFIX: Final = "exo-orphan-guard exec"
_STDIN_EVENTS: Final = select.POLLIN | select.POLLHUP | select.POLLERR
_STDIN_CHUNK: Final = 65536


@final
@dataclass(frozen=True, slots=True)
class ExecOptions:
    command: tuple[str, ...]
    grace: float | None = None
    """None: EXO_ORPHAN_GUARD_GRACE (default 10 s)."""
    stdin_hup: bool = False


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell reports it: -N (killed by signal N) becomes 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def run(options: ExecOptions) -> int:
    """Run the command guarded; return the exit status to exit with."""
    _quiet_logging()
    prefix = rank_prefix(_LOG_PREFIX)
    if options.grace is None:
        setting = settings.grace_setting()
        if setting.warning is not None:
            warn_once(setting.warning)
        options = ExecOptions(options.command, setting.value, options.stdin_hup)
    parent = identity_of(os.getppid())
    if parent is None or liveness(parent) == "gone":
        logger.warning(f"{prefix}: its launcher is already gone: not starting the command")
        return EXIT_PARENT_GONE
    group = _lead_group()
    signals = _SignalInbox()
    me = current_identity()
    # As a runner's: what the command starts can later be proven to be the wrapper's.
    os.environ[settings.RUNNER_ENV] = me.encode()
    try:
        child = _start(options, me.pid)
    except FileNotFoundError:
        logger.warning(f"{prefix}: {options.command[0]}: command not found")
        return EXIT_NOT_FOUND
    except PermissionError as error:
        logger.warning(f"{prefix}: {options.command[0]}: {error.strerror}")
        return EXIT_CANNOT_EXECUTE
    # What the wrapper holds now lives until it exits: frozen, the collector never
    # walks it again, neither in the collection before a clean exit nor in the
    # interpreter's teardown (measured: the wrapper gone 25-35 ms after CMD, not 90).
    gc.freeze()
    if parent.pid == 1:
        logger.warning(
            f"{prefix}: its parent is init (pid 1): only signals"
            f"{' and stdin' if options.stdin_hup else ''} can stop the command"
        )
    watched = Watched(
        me=me,
        launcher=None if parent.pid == 1 else parent,
        command=identity_of(child.pid),
        group=group,
        grace=_grace(options),
        labels=_labels(options),
        prefix=prefix,
    )
    watch = ExecWatch(watched, signals.write_end)
    returncode = _Supervisor(child, group, options, signals, watch).run()
    return exit_status(returncode)


def _labels(options: ExecOptions) -> dict[str, str]:
    labels = {"wrapped": shlex.join(options.command)[:200]}
    rank = os.environ.get("MLX_RANK")
    if rank is not None:
        labels["mlx_rank"] = rank
    return labels


def _quiet_logging() -> None:
    # The wrapper shares the rank's stderr: only what needs a human goes there.
    logger.remove()
    logger.add(sys.stderr, level="WARNING", format="{message}")


def _lead_group() -> int | None:
    """The group CMD's tree lives in, led by the wrapper, so one signal reaches it all.

    In the foreground of a terminal a new group would be a background job that the
    terminal stops as soon as CMD reads it: there the tree is followed by parentage.
    """
    me = os.getpid()
    if os.getpgrp() == me:
        return me  # a session leader under `ssh -tt`, or a shell's job
    with contextlib.suppress(OSError):
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return None
    try:
        os.setpgid(0, 0)
    except OSError as error:
        warn_once(f"{_LOG_PREFIX}: cannot lead a process group ({error.strerror})")
        return None
    return me


def _start(options: ExecOptions, wrapper: int) -> subprocess.Popen[bytes]:
    def in_child() -> None:
        # CMD never outlives the wrapper, whatever kills it (a SIGKILL included).
        if sys.platform == "linux":
            system.set_parent_death_signal(signal.SIGKILL)
            if os.getppid() != wrapper:
                os._exit(EXIT_PARENT_GONE)

    return subprocess.Popen(
        options.command,
        stdin=subprocess.DEVNULL if options.stdin_hup else None,
        preexec_fn=in_child,  # the wrapper has no other thread yet
    )


@final
class _SignalInbox:
    """Signals received, delivered through a wake-up pipe so `poll` sees them."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.read_end, self.write_end = os.pipe()
        for fd in (self.read_end, self.write_end):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        signal.set_wakeup_fd(self.write_end, warn_on_full_buffer=False)
        for number in FORWARDED_SIGNALS:
            # An ignored signal (nohup) stays ignored, for the wrapper and for CMD.
            if signal.getsignal(number) != signal.SIG_IGN:
                signal.signal(number, self._received)
        signal.signal(signal.SIGCHLD, self._received)

    def _received(self, number: int, frame: FrameType | None) -> None:
        del frame
        if number != signal.SIGCHLD:
            self.pending.append(number)

    def drain(self) -> list[int]:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_end, 4096):
                pass
        taken, self.pending = self.pending, []
        return taken


@final
class _Supervisor:
    def __init__(
        self,
        child: subprocess.Popen[bytes],
        group: int | None,
        options: ExecOptions,
        signals: _SignalInbox,
        watch: ExecWatch | None = None,
    ) -> None:
        self._child = child
        self._group = group
        self._options = options
        self._signals = signals
        self._watch = watch
        self._prefix = rank_prefix(_LOG_PREFIX) if watch is None else watch.watched.prefix
        self._deadline: float | None = None
        self._launcher_gone_at: float | None = None
        self._killed = False
        """SIGKILLed at the end of its grace after its launcher died (recorded so)."""
        self._poller = select.poll()
        self._poller.register(signals.read_end, select.POLLIN)
        self._watching_stdin = options.stdin_hup
        if self._watching_stdin:
            self._poller.register(0, _STDIN_EVENTS)

    def run(self) -> int:
        while (returncode := self._step()) is None:
            pass
        if self._deadline is not None:
            # Stopped on request: what CMD left in its group goes with it.
            self._kill_tree()
        if self._watch is not None and self._launcher_gone_at is not None and not self._killed:
            after = time.monotonic() - self._launcher_gone_at
            self._watch.ended("clean", after, "the command exited after its launcher died")
        return returncode

    def _step(self) -> int | None:
        # Drained before the child is polled: a SIGCHLD that comes after the drain wakes
        # the poll below; one drained here is of an exit that poll() sees.
        received = self._signals.drain()
        returncode = self._child.poll()
        if returncode is not None:
            return returncode
        watch = self._watch
        if watch is not None:
            watch.replace_a_dead_keeper()
            gone = watch.launcher_news()
            if gone is not None:
                self._launcher_gone_at = time.monotonic()
                watch.begun()
                self._stop(signal.SIGTERM, f"{gone}: SIGTERM to {self._command}")
        for number in received:
            name = signal.Signals(number).name
            self._stop(number, f"got {name}: passed on to {self._command}")
        now = time.monotonic()
        if self._deadline is not None and now >= self._deadline:
            self._hard_stop()
            return None
        timeout = None if self._deadline is None else (self._deadline - now) * 1000
        for fd, events in self._poll(timeout):
            if fd == 0:
                self._read_stdin(events)
        return None

    def _hard_stop(self) -> None:
        """CMD outlived its grace: SIGKILL to it and the group, and, if its launcher
        died, a hard kill recorded as one."""
        grace = _grace(self._options)
        if grace > 0:
            logger.warning(
                f"{self._prefix}: {self._command} has not exited within {grace:g} s: "
                "SIGKILL to it and its process group"
            )
        if self._watch is not None and self._launcher_gone_at is not None:
            self._killed = True
            self._watch.ended(
                "killed",
                time.monotonic() - self._launcher_gone_at,
                f"the command did not exit within the {grace:g} s grace after SIGTERM: SIGKILL",
            )
        self._kill_tree()
        self._deadline = None
        self._child.wait()

    def _poll(self, timeout_ms: float | None) -> list[tuple[int, int]]:
        try:
            return self._poller.poll(None if timeout_ms is None else max(0, int(timeout_ms) + 1))
        except InterruptedError:
            return []

    def _read_stdin(self, events: int) -> None:
        try:
            data = os.read(0, _STDIN_CHUNK) if events & select.POLLIN else b""
        except OSError:  # EIO: the terminal hung up
            data = b""
        if data:
            return  # stdin is the wrapper's alone with --stdin-hup: dropped
        self._poller.unregister(0)
        self._watching_stdin = False
        name = STDIN_HUP_SIGNAL.name
        self._stop(STDIN_HUP_SIGNAL, f"stdin closed (--stdin-hup): {name} to {self._command}")

    @property
    def _command(self) -> str:
        return f"the command (pid {self._child.pid})"

    def _stop(self, number: int, said: str) -> None:
        """Send `number` to CMD; the first stop also starts the grace, and says so."""
        if self._deadline is None:
            grace = _grace(self._options)
            then = (
                f"SIGKILL to it and its process group if it has not exited {grace:g} s later"
                if grace > 0
                else "SIGKILL to it and its process group at once (grace 0)"
            )
            logger.warning(f"{self._prefix}: {said}; {then}")
            self._deadline = time.monotonic() + grace
        with contextlib.suppress(ProcessLookupError):
            self._child.send_signal(number)

    def _kill_tree(self) -> None:
        """SIGKILL the command's tree and whatever is left in the wrapper's group, by
        the watch's verified path (`tree_kill`): only processes identified and proven
        to be in the tree or the group, each checked again as it is signalled.

        The wrapper's keeper (its only other child, which starts none) is spared: if
        the wrapper dies half-way, the keeper kills the group.
        """
        me = os.getpid()
        spared = {me, *(pid for pid in system.child_pids(me) if pid != self._child.pid)}
        doomed: list[ProcessIdentity] = []
        # Not yet reaped, the child keeps its pid; once reaped, that may be anyone's.
        child = identity_of(self._child.pid) if self._child.returncode is None else None
        if child is not None:
            doomed += [child, *verified_descendants(child)]
        if self._group is not None:
            doomed += verified_members(self._group)
        kill_verified(target for target in dict.fromkeys(doomed) if target.pid not in spared)


def _grace(options: ExecOptions) -> float:
    return settings.DEFAULT_GRACE_SECONDS if options.grace is None else options.grace


def parse_command(words: Sequence[str]) -> tuple[str, ...]:
    """The command after `--` (argparse keeps the separator); ValueError if empty."""
    command = tuple(words[1:] if words and words[0] == "--" else words)
    if not command:
        raise ValueError("exec needs a command: exo-orphan-guard exec [options] -- CMD ARGS...")
    return command
