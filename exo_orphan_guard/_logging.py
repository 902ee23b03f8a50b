"""Warnings that must appear once per process, however often the hook runs."""

from __future__ import annotations

from loguru import logger

_already_warned: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _already_warned:
        _already_warned.add(message)
        logger.warning(message)
