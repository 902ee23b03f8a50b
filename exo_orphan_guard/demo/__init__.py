"""`make demo` (`python -m exo_orphan_guard.demo`): the problem and the fix, shown."""
