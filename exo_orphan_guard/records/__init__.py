"""What runners and sweeps write down and read back: the registry of runners, the
endings log, the host key that names the registry's directory, and the freeze journal.

Below both `watch` (runners record themselves and their endings) and `sweeper` (which
reads those records and journals its stops), so that neither needs the other.
"""
