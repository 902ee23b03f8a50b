"""Warnings that must appear once per process, however often the hook runs."""

from __future__ import annotations

from collections.abc import Callable

_already_warned: set[str] = set()
_sink: Callable[[str], None] | None = None


def warn_to(sink: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """Where this process's warnings go from now on, and where they went: the command
    line says them on its stderr in its own words; elsewhere (None: exo's processes)
    they go through loguru."""
    global _sink
    before, _sink = _sink, sink
    return before


def warn_once(message: str) -> None:
    if message in _already_warned:
        return
    _already_warned.add(message)
    if _sink is not None:
        _sink(message)
        return
    # Imported here: the CLI's commands run without loguru unless they warn.
    from loguru import logger

    logger.warning(message)
