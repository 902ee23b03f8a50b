"""`make bench`: run the benchmarks and rewrite docs/benchmarks.md from their results.

    python -m bench.run_all [--only watch,idle] [--rounds 200] [--idle-seconds 60]
    python -m bench.run_all --only guardian [--guardian-idle-seconds 600]
    python -m bench.run_all --only guardian-scan [--scan-seconds 600]
    python -m bench.run_all --only registry [--registry-starts 10000]
    python -m bench.run_all --only exo-stop [--exo-stop-rounds 5]   (opt-in: real exo)
    python -m bench.run_all --only soak [--soak-seconds 3600]       (opt-in: `make soak`)

Each section writes bench/results/<section>.md (kept in git); the document is
assembled from every section file present, so one section can be re-run alone.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from exo_orphan_guard.system import settings

from . import (
    busy_latency,
    cli_startup,
    grace_floor,
    group_reform,
    guardian_cost,
    guardian_scan,
    handover_latency,
    idle_cost,
    plot_watch,
    registry_growth,
    soak,
    sweep_cost,
    watch_latency,
    worker_start,
)
from .document import INTRO, header, machine

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCUMENT = ROOT / "docs" / "benchmarks.md"
WATCH_SAMPLES = RESULTS / "watch-latency.json"
WATCH_IMAGE = plot_watch.DEFAULT_IMAGE

SECTION_ORDER = [
    "watch",
    "busy",
    "handover",
    "floor",
    "idle",
    "sweep",
    "cli",
    "group",
    "launch",
    "guardian",
    "guardian-scan",
    "registry",
    "start",
    "soak",
    "exo-stop",
]
OPT_IN = ("exo-stop", "soak")
"""Sections that run only when `--only` names them: they need real exo (EXO_SRC,
MLX_LM_SRC, as `make test-exo`), or an hour (`make soak`)."""


def watch_section(arguments: argparse.Namespace, scratch: Path) -> str:
    results = watch_latency.run(arguments.rounds, scratch)
    command = f"python -m bench.run_all --only watch --rounds {arguments.rounds}"
    where = machine()
    watch_latency.save_samples(
        results,
        WATCH_SAMPLES,
        command=command,
        machine=where,
        date=datetime.date.today().isoformat(),
    )
    plot_watch.draw(plot_watch.load(WATCH_SAMPLES), WATCH_IMAGE)
    image = WATCH_IMAGE.relative_to(ROOT)
    return "\n".join(
        [
            header("Parent watch: worker SIGKILL to runner exit", command, where),
            f"{arguments.rounds} rounds. In each, one worker per row (an idle runner and one "
            "holding the GIL in native code that does not return when a signal comes, "
            "`ctypes.PyDLL(None).sleep()` with the notice blocked) is started, then the "
            "workers are SIGKILLed one at a time in random order. Latency runs from just "
            "before `kill(worker, SIGKILL)` to the runner's pidfd turning readable (a zombie "
            "counts as gone), measured by the benchmark process. The `clean ending` rows run "
            f"`auto` with the default grace ({settings.DEFAULT_GRACE_SECONDS:g} s) and "
            "`EXO_ORPHAN_GUARD_BUSY_WAIT=0` (their GIL-held runner never returns: killed "
            "at the old 0.5 s bound; busy runners have their own section), and a "
            "third runner looping over MLX operations (64 MB held, steps of about 2 ms), in "
            "rounds of their own after the others, one worker at a time (an MLX loop keeps "
            "a core busy); their `: begun` rows are when `WorkerGone` was raised on the "
            "runner's main thread (its own note, the same monotonic clock). Every other "
            "strategy row runs "
            "with `EXO_ORPHAN_GUARD_GRACE=0`: the mechanism alone, the tree killed at once. "
            "PR 2205 and no-guard rows come from "
            f"workers with {watch_latency.SLOW_RUNNERS_PER_KIND} runners of each kind, one "
            f"every {watch_latency.SLOW_EVERY_ROUNDS} rounds. `> N (alive)`: that share of "
            "runners was still running at the deadline. Thread-only strategies are listed "
            "with GIL-held runners to show why the backstops exist. `(portable)` rows run "
            "with `EXO_ORPHAN_GUARD_BACKEND=portable`, the psutil-only code macOS runs (no "
            "pidfd, no PR_SET_PDEATHSIG); the floor row is when the benchmark itself saw the "
            "worker gone, which no runner can beat. "
            f"Rounds run again because a worker did not start: {results.restarts}.\n",
            watch_latency.render(results),
            "",
            f"The same run as a picture ([{image}](../{image}), drawn by `python -m "
            f"bench.plot_watch` from every sample in `{WATCH_SAMPLES.relative_to(ROOT)}`):",
            "",
            f"![Worker SIGKILL to runner exit, CDF per strategy](../{image})",
            "",
        ]
    )


def idle_section(arguments: argparse.Namespace, scratch: Path) -> str:
    seconds: float = arguments.idle_seconds
    costs = idle_cost.run(seconds, scratch)
    return "\n".join(
        [
            header(
                "Parent watch: cost of an idle runner",
                f"python -m bench.run_all --only idle --idle-seconds {seconds:g}",
            ),
            f"One idle runner per strategy, all alive side by side for {seconds:g} s. CPU time "
            "and wake-ups (voluntary + involuntary context switches) are summed over every "
            "thread of the runner and of its helpers: its watchdog and the watchdog's "
            "understudy (which takes over if the watchdog dies). The runner's RSS includes "
            "this package and psutil; `no guard` is the baseline. The helpers are forked, so "
            "most of their RSS is shared with the runner; USS is what they alone hold (both "
            "together).\n",
            idle_cost.render(costs, seconds),
            "",
        ]
    )


def sweep_section(arguments: argparse.Namespace, scratch: Path) -> str:
    repetitions: int = arguments.sweep_repetitions
    results = sweep_cost.run(repetitions, scratch)
    return "\n".join(
        [
            header(
                "Startup sweep: cost against the number of processes",
                f"python -m bench.run_all --only sweep --sweep-repetitions {repetitions}",
            ),
            f"{repetitions} repetitions per method and load, methods interleaved in random "
            "order. The registry holds the records of a live guarded worker's 4 runners. "
            "Unrelated processes are `sleep`s. In-process sweeps are what exo's worker runs "
            "(in a thread); the CLI row includes starting Python, like the `ps | awk` row "
            "includes starting a shell, ps and awk. Nothing is killed: every runner is live.\n",
            sweep_cost.render(results),
            "",
        ]
    )


def cli_section(arguments: argparse.Namespace, scratch: Path) -> str:
    repetitions: int = arguments.cli_repetitions
    installed, results = cli_startup.run(repetitions, scratch)
    return "\n".join(
        [
            header(
                "CLI start-up: `exo-orphan-guard scan` end to end",
                f"python -m bench.run_all --only cli --cli-repetitions {repetitions}",
            ),
            f"{repetitions} repetitions per command and load, interleaved in random order. "
            "The CLI is installed from this package's wheel into a fresh venv, as `pip "
            "install` gives it to an operator; each row includes starting its interpreter "
            "(or shell, ps and awk). The registry is empty, so `scan` costs its start-up plus "
            "the fingerprint scan of every process. Target: `scan` at most the `ps | awk` "
            "line at 2,000 processes.\n",
            cli_startup.render(installed, results),
            "",
        ]
    )


def busy_section(arguments: argparse.Namespace, scratch: Path) -> str:
    rounds: int = arguments.busy_rounds
    results = busy_latency.run(rounds, scratch)
    return "\n".join(
        [
            header(
                "Runners busy in native code: the call's return to the clean ending",
                f"python -m bench.run_all --only busy --busy-rounds {rounds}",
            ),
            f"{rounds} rounds. {busy_latency.DESCRIPTION} "
            "Targets: begun within 20 ms (p99) of the return, gone within 150 ms (p99) of "
            "it; the wedged runner killed at the busy wait within 50 ms. The real `mx.eval` "
            "case runs in the suite (`tests/test_busy_ending.py`).\n",
            busy_latency.render(results),
            "",
        ]
    )


def handover_section(arguments: argparse.Namespace, scratch: Path) -> str:
    rounds: int = arguments.handover_rounds
    results = handover_latency.run(rounds, scratch)
    return "\n".join(
        [
            header(
                "exo's runners: the hand-over of exo's own Shutdown against WorkerGone",
                f"python -m bench.run_all --only handover --handover-rounds {rounds}",
            ),
            f"{rounds} rounds. {handover_latency.DESCRIPTION} "
            "What exo's real runner does at each step (idle, decoding, loading, one long "
            "`mx.eval`, the GIL held) is in docs/exo-evidence.md (`tests/test_exo_steps.py`).\n",
            handover_latency.render(results),
            "",
        ]
    )


def floor_section(arguments: argparse.Namespace, scratch: Path) -> str:
    rounds: int = arguments.floor_rounds
    results = grace_floor.run(rounds, scratch)
    return "\n".join(
        [
            header(
                "The grace's floor: an idle runner's clean ending beside busy loops",
                f"python -m bench.run_all --only floor --floor-rounds {rounds}",
            ),
            f"{rounds} rounds per row. {grace_floor.DESCRIPTION} "
            "`tests/test_clean_ending.py` checks that the floor is what the runner is "
            "guarded with and that a runner killed at it had all of it; how often it is "
            "enough is this table's.\n",
            grace_floor.render(results),
            "",
        ]
    )


def group_section(arguments: argparse.Namespace, scratch: Path) -> str:
    del scratch
    trials: int = arguments.group_trials
    results = group_reform.run(trials)
    return "\n".join(
        [
            header(
                "A real MLX group after an orphan: SIGKILL to the next group formed",
                f"python -m bench.run_all --only group --group-trials {trials}",
            ),
            "MLX ring backend (`mlx[cpu]`) over loopback. Rank 0 of a 2-rank group sits in "
            "`mx.distributed.init()` (holding the GIL) when its worker is SIGKILLed (the "
            "guard's notice interrupts the wait in init, and the rank ends the clean way); "
            "a new "
            "worker then starts ranks 1 and 0 on the same ports, 0.5 s apart. Time runs from "
            "the kill until both new ranks returned `all_sum` (its floor is the new worker's "
            "start-up, the stagger, and rank 1's first connect retry, about 1 s). Without the "
            f"guard the new rank 1 joins the orphan and rank 0 waits forever: bounded at "
            f"{group_reform.HANG_TIMEOUT_SECONDS:g} s.\n",
            group_reform.render(results),
            "",
        ]
    )


def start_section(arguments: argparse.Namespace, scratch: Path) -> str:
    repetitions: int = arguments.start_repetitions
    results = worker_start.run(repetitions, scratch)
    return "\n".join(
        [
            header(
                "exo's worker start and a runner's first task, guarded",
                f"python -m bench.run_all --only start --start-repetitions {repetitions}",
            ),
            f"{repetitions} exo starts per load, each a fresh process running the series' "
            "`orphan_guard.py` (exo-shaped types) with the package installed: an anyio loop "
            "whose other task ticks every 10 ms while `await guard_worker()` runs before the "
            "plan loop (marker, start-up sweep with nothing to end, a guardian made sure "
            "of); then `guard_runner()` in a spawned runner before its first task. Issue "
            "35's bound: nothing the guard does after the start-up sweep delays the plan "
            "loop or a runner's first task by more than 100 ms (p99, 2,000 processes).\n",
            worker_start.render(results),
            "",
        ]
    )


def launch_section(arguments: argparse.Namespace, scratch: Path) -> str:
    from . import launch_cost  # its sshd helper comes from the tests

    return launch_cost.section(arguments, scratch)


def exo_stop_section(arguments: argparse.Namespace, scratch: Path) -> str:
    from . import exo_stop

    rounds: int = arguments.exo_stop_rounds
    done = exo_stop.run(rounds, list(exo_stop.VERSIONS), scratch / "rounds.jsonl")
    return "\n".join(
        [
            header(
                "exo's own stop: pristine against the bugfix series",
                f"python -m bench.run_all --only exo-stop --exo-stop-rounds {rounds}",
            ),
            f"{rounds} rounds per row. {exo_stop.DESCRIPTION}\n",
            exo_stop.render(done),
            "",
        ]
    )


SECTIONS: dict[str, Callable[[argparse.Namespace, Path], str]] = {
    "watch": watch_section,
    "busy": busy_section,
    "handover": handover_section,
    "floor": floor_section,
    "idle": idle_section,
    "sweep": sweep_section,
    "cli": cli_section,
    "group": group_section,
    "launch": launch_section,
    "guardian": guardian_cost.section,
    "guardian-scan": guardian_scan.section,
    "registry": registry_growth.section,
    "start": start_section,
    "soak": soak.section,
    "exo-stop": exo_stop_section,
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run_all")
    parser.add_argument(
        "--only", default=",".join(name for name in SECTION_ORDER if name not in OPT_IN)
    )
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--sweep-repetitions", type=int, default=40)
    parser.add_argument("--cli-repetitions", type=int, default=40)
    parser.add_argument("--group-trials", type=int, default=20)
    parser.add_argument("--busy-rounds", type=int, default=50)
    parser.add_argument("--handover-rounds", type=int, default=50)
    parser.add_argument("--floor-rounds", type=int, default=20)
    parser.add_argument("--launch-trials", type=int, default=100)
    parser.add_argument("--hosts-repetitions", type=int, default=20)
    parser.add_argument("--guardian-rounds", type=int, default=50)
    parser.add_argument("--guardian-idle-seconds", type=float, default=600.0)
    parser.add_argument("--guardian-notice-rounds", type=int, default=20)
    parser.add_argument("--scan-seconds", type=float, default=600.0)
    parser.add_argument("--scan-notice-rounds", type=int, default=40)
    parser.add_argument("--scan-repetitions", type=int, default=300)
    parser.add_argument("--registry-starts", type=int, default=10_000)
    parser.add_argument("--start-repetitions", type=int, default=40)
    parser.add_argument("--exo-stop-rounds", type=int, default=5)
    parser.add_argument("--soak-seconds", type=float, default=3600.0)
    arguments = parser.parse_args()
    chosen = [name.strip() for name in arguments.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SECTIONS]
    if unknown:
        sys.exit(f"bench: unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in chosen:
        print(f"bench: running {name}", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"eog-bench-{name}-") as scratch:
            text = SECTIONS[name](arguments, Path(scratch))
        (RESULTS / f"{name}.md").write_text(text)
        print(text, flush=True)
    parts = [INTRO]
    for name in SECTION_ORDER:
        path = RESULTS / f"{name}.md"
        if path.exists():
            parts.append(path.read_text())
    DOCUMENT.write_text("\n".join(parts))
    print(f"bench: wrote {DOCUMENT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
