"""The sweep: a process-table snapshot and the registry's records in, verdicts out
(`verdicts.decide`, pure), each target's ending planned (`sweep_endings.plan`, pure),
then ended by the one engine the guardian and exo's worker hook share too (`engine`).

Named `sweeper`, not `sweep`: `exo_orphan_guard.sweep` is the public function.
"""
