"""`make demo`, mlx.launch part: a launcher is SIGKILLed without and with `exec`.

The launcher starts its ranks the way `mlx.launch` starts local ones (`bash -c 'exec
CMD'`, stdin a pipe): one idle, one holding the GIL in native code. Everything it
starts is killed on the way out, whatever happens.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from ..rig import launch_scenario, scenarios
from ..rig.launch_scenario import RankKind

LOOK_SECONDS = 1.0
"""How long bare ranks are given to go (they never do)."""
GUARDED_WAIT_SECONDS = 10.0
"""How long wrapped ranks may take on a loaded machine; they go at once."""
_KINDS: list[RankKind] = ["idle", "gil"]


def launcher_killed(scratch: Path) -> bool:
    """Shows both rounds; False if a wrapped rank outlived its launcher."""
    print(
        "\n== 5. mlx.launch-style ranks: the launcher is hard-killed (SIGKILL), "
        "without and with `exo-orphan-guard exec` ==",
        flush=True,
    )
    wrapper = launch_scenario.wrapper_words(stdin_hup=True)
    shown = ["exo-orphan-guard", *wrapper[3:]]
    print(f"rank command: [{shlex.join(shown)}] python3 rank.py")
    all_gone = True
    for label, words in (("without the wrapper", []), ("with the wrapper", wrapper)):
        launcher = launch_scenario.start_launcher(
            _KINDS, wrapper=words, registry=scratch / "registry"
        )
        try:
            ranks = ", ".join(
                f"{rank.identity.pid} ({'idle' if rank.kind == 'idle' else 'holding the GIL'})"
                for rank in launcher.ranks
            )
            tracked = launcher.all_processes()
            time.sleep(scenarios.GIL_SETTLE_SECONDS)
            killed_at = launch_scenario.kill_launcher(launcher)
            waited = GUARDED_WAIT_SECONDS if words else LOOK_SECONDS
            exits = scenarios.wait_gone(tracked, waited)
            left = scenarios.alive(tracked)
            print(f"{label}: launcher {launcher.process.pid} started ranks {ranks}")
            if left:
                pids = " ".join(str(identity.pid) for identity in left)
                print(f"  kill -9 launcher; {waited:g} s later {len(left)} left: {pids}")
            else:
                last = max(seen for seen in exits.values() if seen is not None)
                print(f"  kill -9 launcher; all gone {(last - killed_at) * 1000:.1f} ms after")
            if words and left:
                all_gone = False
        finally:
            launch_scenario.cleanup(launcher)
    print("Bare ranks are orphans (the demo kills them now); wrapped ones die with the launcher.")
    return all_gone
