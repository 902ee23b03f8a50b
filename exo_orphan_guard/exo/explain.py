"""`exo-orphan-guard explain TEXT`: an error line or errno from the field, explained.

A small table of what exo and MLX's JACCL backend print when RDMA setup fails, what
the public record says causes it, and what to run next. Pure: text in, answers out.
macOS errno values (the numbers JACCL prints on a Mac): 2 ENOENT, 16 EBUSY,
22 EINVAL, 60 ETIMEDOUT, 96 ENODATA.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, final


@final
@dataclass(frozen=True, slots=True)
class Explanation:
    key: str
    title: str
    cause: str
    next_steps: tuple[str, ...]
    sources: tuple[str, ...]
    orphan_related: bool
    """Whether leftover runners can cause it, i.e. whether a sweep may help."""


@final
@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str]
    explanation: Explanation


def _rule(pattern: str, explanation: Explanation) -> _Rule:
    return _Rule(re.compile(pattern, re.IGNORECASE), explanation)


PR_2205: Final = "https://github.com/exo-explore/exo/pull/2205"
MLX_4209: Final = "https://github.com/ml-explore/mlx/pull/4209"
MLX_3207: Final = "https://github.com/ml-explore/mlx/issues/3207"
MLX_3467: Final = "https://github.com/ml-explore/mlx/issues/3467"
EXO_1973: Final = "https://github.com/exo-explore/exo/issues/1973"
EXO_1847: Final = "https://github.com/exo-explore/exo/issues/1847"
EXO_2111: Final = "https://github.com/exo-explore/exo/issues/2111"
EXO_1390: Final = "https://github.com/exo-explore/exo/issues/1390"
VALENSAS: Final = (
    "https://valensas.com/blog/how-we-fixed-a-silent-killer-in-our-mac-studio-llm-cluster"
)

SCAN_EVERY_NODE: Final = (
    "exo-orphan-guard scan   # on every node of the instance: leftover runners?"
)
SWEEP: Final = "exo-orphan-guard sweep  # end them (SIGINT, the busy wait, SIGKILL)"
DOCTOR: Final = "exo-orphan-guard doctor # guard, patch, registry, queue-pair budget"
REBOOT_IF_UNKILLABLE: Final = (
    "if sweep reports UNKILLABLE (state U/D): reboot that node, "
    "nothing else frees its RDMA resources"
)

RULES: Final[tuple[_Rule, ...]] = (
    _rule(
        r"(RTR|queue pair).*errno\s*=?\s*16\b|errno\s*=?\s*16\b.*(RTR|queue pair)"
        r"|^\s*(errno\s*=?\s*)?16\s*$|\bEBUSY\b",
        Explanation(
            key="rtr-errno-16",
            title="errno 16 (EBUSY) setting up an RDMA queue pair",
            cause=(
                "The RDMA device refused the queue pair as busy. Either a runner left over "
                "from a hard-killed worker still holds queue pairs (and Metal memory) on this "
                "node, or the device's queue-pair budget is used up: Thunderbolt RDMA devices "
                "allow about 10 queue pairs each, and the 11th fails with errno 16."
            ),
            next_steps=(SCAN_EVERY_NODE, SWEEP, DOCTOR, REBOOT_IF_UNKILLABLE),
            sources=(PR_2205, MLX_4209, MLX_3207),
            orphan_related=True,
        ),
    ),
    _rule(
        r"errno\s*=?\s*96\b|^\s*96\s*$|\bENODATA\b",
        Explanation(
            key="rtr-errno-96",
            title="errno 96 (ENODATA) changing a queue pair to RTR",
            cause=(
                "The RDMA link had no address to reach the peer with: the Thunderbolt "
                "interface lost its link-local IPv6 address (the port went down after being "
                "idle, the cable was re-plugged, or the port was pulled into the Thunderbolt "
                "Bridge), so the device's GID table is empty. Reported after an idle night on "
                "exo v1.0.71, where restarting exo alone did not help."
            ),
            next_steps=(
                "exo-orphan-guard doctor # on both nodes: its `rdma ports` line gives each "
                "port's state (ibv_devinfo); the ports in use must be PORT_ACTIVE",
                "`ifconfig enN` must show an inet6 fe80:: address and no bridge0 membership",
                "reconnect the Thunderbolt cable; if the port stays down, restart both Macs",
            ),
            sources=(EXO_1973, MLX_3207),
            orphan_related=False,
        ),
    ),
    _rule(
        r"errno\s*=?\s*60\b|error:\s*60\b|^\s*60\s*$|\bETIMEDOUT\b",
        Explanation(
            key="errno-60",
            title="errno 60 (ETIMEDOUT) talking to a peer",
            cause=(
                "The peer did not answer in time: its runner is not up (yet), crashed, or is "
                "wedged; the cable or device pairing is wrong; or the peer's link-local "
                "address is gone. A leftover runner on the peer holding its side of the group "
                "produces the same silence."
            ),
            next_steps=(
                "check the peer node: is exo running, did its runner crash first (its log)?",
                "on the peer: " + SCAN_EVERY_NODE.split("#")[0].strip() + ", then sweep",
                DOCTOR,
            ),
            sources=(EXO_1847,),
            orphan_related=True,
        ),
    ),
    _rule(
        r"errno\s*=?\s*22\b|^\s*22\s*$|\bEINVAL\b",
        Explanation(
            key="rtr-errno-22",
            title="errno 22 (EINVAL) changing a queue pair to RTR: routing",
            cause=(
                "The queue pair's address attributes are invalid for this link: the "
                "Thunderbolt ports are members of the Thunderbolt Bridge (bridge0), or the "
                "MLX version picks a GID the Thunderbolt device does not have. Leftover "
                "runners do not cause this; a sweep will not fix it."
            ),
            next_steps=(
                "take the Thunderbolt ports out of bridge0 (Thunderbolt Bridge) on both nodes",
                "check which MLX version exo runs against the GID-selection bug in mlx #3467",
                DOCTOR,
            ),
            sources=(MLX_3207, MLX_3467, EXO_1390),
            orphan_related=False,
        ),
    ),
    _rule(
        r"allocate protection domain",
        Explanation(
            key="protection-domain",
            title="Couldn't allocate protection domain",
            cause=(
                "RDMA protection domains ran out. Each failed init/teardown cycle can leak "
                "one, and so does every orphaned rank that holds one (mlx.launch clusters "
                "counted over 100 ranks left under a stuck sshd). Leaked ones come back only "
                "with a reboot."
            ),
            next_steps=(
                "exo-orphan-guard scan --match 'YOUR_RANK_SCRIPT' --any-parent  # mlx.launch ranks",
                "exo-orphan-guard sweep --match 'YOUR_RANK_SCRIPT' --any-parent",
                "reboot the node: leaked protection domains are not returned otherwise",
            ),
            sources=(MLX_3207, VALENSAS, EXO_2111),
            orphan_related=True,
        ),
    ),
    _rule(
        r"recv failed with errno\s*=?\s*2\b",
        Explanation(
            key="recv-errno-2",
            title="[jaccl] Recv failed with errno=2: a peer connection was lost",
            cause=(
                "A rank lost its connection to a peer during setup or inference: the peer's "
                "runner died or its side of the RDMA link went away. It is often the second "
                "error of a pair: look for the node that failed first. Under heavy load it "
                "has been reported together with protection-domain exhaustion."
            ),
            next_steps=(
                "find the node whose runner failed first (its exo log)",
                SCAN_EVERY_NODE,
                SWEEP,
                DOCTOR,
            ),
            sources=(EXO_1847, EXO_2111),
            orphan_related=True,
        ),
    ),
    _rule(
        r"likely does not fit|\b503\b",
        Explanation(
            key="does-not-fit",
            title='exo 503 "likely does not fit"',
            cause=(
                "exo's placement saw too little free memory on a node. A leftover runner "
                "still holding a loaded model (hundreds of GB) makes the node report low "
                "available memory although no model of this exo is loaded."
            ),
            next_steps=(SCAN_EVERY_NODE, SWEEP, DOCTOR),
            sources=(PR_2205,),
            orphan_related=True,
        ),
    ),
)


def explain(text: str) -> list[Explanation]:
    """Every explanation whose pattern the text matches, most specific first."""
    return [rule.explanation for rule in RULES if rule.pattern.search(text)]


def render(text: str, explanations: list[Explanation]) -> str:
    if not explanations:
        known = ", ".join(rule.explanation.key for rule in RULES)
        return (
            f"No diagnosis for {text.strip()!r}: it matches nothing this tool knows "
            f"({known}). Try the exact error line from exo's log, or an errno number."
        )
    blocks: list[str] = []
    for explanation in explanations:
        steps = "\n".join(
            f"    {number}. {step}" for number, step in enumerate(explanation.next_steps, 1)
        )
        sources = "\n".join(f"    {source}" for source in explanation.sources)
        blocks.append(
            f"{explanation.title}\n  Cause: {explanation.cause}\n"
            f"  Next:\n{steps}\n  Sources:\n{sources}"
        )
    return "\n\n".join(blocks)
