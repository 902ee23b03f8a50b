"""The operator's commands: `exo-orphan-guard` and what its subcommands run."""
