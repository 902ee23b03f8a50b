"""A stand-in for exo's package, only what a guarded runner touches (`rig.exo_runner`):
the task types and the multiprocessing channels, shaped as exo has them since
v1.0.61. On `sys.path` only in the scenario worker and the runners it spawns."""
