"""Warnings that must appear once per process, however often the hook runs."""

from __future__ import annotations

_already_warned: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _already_warned:
        _already_warned.add(message)
        # Imported here: the CLI's commands run without loguru unless they warn.
        from loguru import logger

        logger.warning(message)
