"""A stand-in for exo's frozen app, built by PyInstaller into a onedir binary `exo`.

Like exo (`src/exo/__main__.py`, the app's entry): its extension imported first (exo
imports `exo.main`, and with it exo's Rust extension, before `freeze_support()`), spawn
start method, `freeze_support()`; the worker is the app's main process and a runner is
a `multiprocessing.Process` child, which in a frozen app runs as `<exe>
--multiprocessing-fork tracker_fd=N pipe_handle=M` and runs this entry again up to
`freeze_support()`: it maps the extension too. The
hooks are called as exo's patched hooks module calls them, through the package's
public names (loaded lazily: the package's PyInstaller hook must have bundled them).

    exo                          prints `worker <pid>`, then `runner <pid> ready`;
                                 waits for SIGKILL
    exo exo-orphan-guard ARGS    the package's command line, frozen with the app
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing
import os
import sys
import time

import exo_rs  # noqa: F401  # pyright: ignore[reportMissingImports, reportUnusedImport]


def runner() -> None:
    import exo_orphan_guard

    exo_orphan_guard.guard_runner(runner_id="frozen-runner", instance_id="frozen-instance")
    # Seen on the app's stdout only if the runner exits through Python, not by a kill.
    atexit.register(print, f"runner {os.getpid()} exited through Python", flush=True)
    print(f"runner {os.getpid()} ready", flush=True)
    # Hold the GIL in native code, as mx.distributed.init() does: no Python thread of
    # this runner can run until it returns.
    ctypes.PyDLL(None).sleep(3600)


def main() -> None:
    multiprocessing.freeze_support()
    if sys.argv[1:2] == ["exo-orphan-guard"]:
        from exo_orphan_guard.tools import cli

        sys.exit(cli.main(sys.argv[2:]))
    multiprocessing.set_start_method("spawn", force=True)
    import exo_orphan_guard

    exo_orphan_guard.prepare_worker()
    print(f"worker {os.getpid()}", flush=True)
    process = multiprocessing.Process(target=runner, daemon=True)
    process.start()
    sys.stdin.read()  # the test ends the worker with SIGKILL
    time.sleep(3600)


if __name__ == "__main__":
    main()
