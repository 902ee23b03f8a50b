"""The sweep: a process-table snapshot and the registry's records in, verdicts out
(`verdicts.decide`, pure), then the kills (`killing`) and the report.

Named `sweeper`, not `sweep`: `exo_orphan_guard.sweep` is the public function.
"""
