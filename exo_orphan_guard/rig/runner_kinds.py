"""The kinds of stand-in runner `scenario_worker` starts, each a way a real runner
behaves when its worker dies."""

from __future__ import annotations

from typing import Final, Literal

RunnerKind = Literal[
    "idle",
    "gil",
    "child",
    "strays",
    "late",
    "deaf",
    "talk",
    "catch",
    "hang",
    "shutdown",
    "noisy",
    "queue",
    "mlxloop",
    "mlxbusy",
    "gilbusy",
    "gilfree",
    "swallow",
    "loguru",
    "faulty",
    "slowsink",
    "exit",
    "logthread",
    "dumps",
    "dumpsread",
    "dumpslow",
    "masked",
    "maskedsleep",
    "exoidle",
    "exoload",
    "exoeval",
    "exofull",
    "wedged",
    "threads",
    "slowexit",
]
"""idle: sleeps in Python and catches nothing. gil: holds the GIL in native code
that does not return when a signal comes (as `mx.distributed.init()` sits in its
C++ code): wedged. child: has a child of its own. strays: has two children
outside its group (one in a session of its own, one leading a group of its own).
late: guarded only after its
worker died. deaf: ignores SIGTERM and holds the GIL, as a runner stuck in MLX init
would. talk: writes a line to its inherited stdout every 50 ms, as v1.0.71's runners
log to the worker's terminal. catch: catches WorkerGone, releases, returns. hang:
catches WorkerGone and never finishes its clean ending. shutdown: runs a slow
shutdown of its own (inside `ending_cleanly()`) when its worker asks for one.
noisy: its stdout and stderr are a pipe only its worker reads (exo main's
AsyncProcess); once the worker is gone it writes much there, and logs. queue: sends
into a multiprocessing queue only its worker reads, more than the pipe holds, once
the worker is gone (exo's event channel). mlxloop: holds 64 MB in MLX arrays and
runs MLX operations on them in a loop, steps of a few ms as in a decode loop, catching
nothing (needs mlx). mlxbusy: holds 64 MB in MLX arrays and runs one `mx.eval` of
at least `LONG_EVAL_SECONDS` (once sized) after another, as exo's prefill and weight loading do
(needs mlx). gilbusy: native code holding the GIL with every signal blocked that
returns after `GIL_BUSY_SECONDS`, again and again (a `mx.synchronize()`, a
`mx.distributed.init()` that connects). gilfree: one native call after another
that lets go of the GIL, as `mx.eval` does, each exactly `EOG_NATIVE_SECONDS` long
(default 2; every signal blocked in it, as a wait that retries on EINTR), for the
benchmarks: its return time is known to the millisecond. swallow: a bare `except:`
swallows the first WorkerGone, then it sleeps on. loguru: catches WorkerGone and
logs more than 1 MiB through a loguru sink with `enqueue=True` that its worker set up
(exo's `logger_setup`). faulty: holds the GIL, and its watchdog fails once the worker is
gone (an injected error). slowsink: logs in a loop through a slow sink of its own
added with `catch=False`, catching each error but WorkerGone (the notice lands while
it holds the sink's lock). exit: once asked to shut down, starts a non-daemon thread
and registers an atexit hook, both with steps left, and returns (its stderr kept for
the test). logthread: a non-daemon thread logs through its worker's enqueued sink (as
`loguru`) while the main thread makes GIL-free native calls (as `gilfree`). dumps:
`faulthandler.register(SIGUSR1)` once guarded (the usual "dump my stacks" hook, which
takes the notice over below Python; one thread's stack), then sleeps in Python.
dumpsread: the same, then waits in one `read` that only the signal's own handler
interrupts. dumpslow: as dumpsread, its dumps stuck in a full pipe for a while after
its worker died. masked: SIGUSR1 blocked in every thread, naps in Python, 50 ms at a
time. maskedsleep: the same mask, one long sleep
(`notice_blockers`). exoidle, exoload, exoeval, exofull: exo-shaped (`exo_runner`). wedged:
as gil, with SIGINT blocked too: what only SIGKILL ends. threads: waits for its next
task as exo main's runner does, among threads (`runner_threads`). slowexit: sleeps in
Python, catching nothing; its unwinding (a `finally`, notes `unwinding` and `unwound`)
takes `SLOW_EXIT_SECONDS`, as a runner letting go of a model does: a second SIGINT
meanwhile cuts it short."""
CATCHING: Final[frozenset[RunnerKind]] = frozenset({"catch", "hang", "noisy", "queue", "loguru"})
EXO_KINDS: Final[frozenset[RunnerKind]] = frozenset({"exoidle", "exoload", "exoeval", "exofull"})
"""Run by `exo_runner`, as exo's runner runs."""
