"""exo.worker: the series' hooks module is loaded here from `exo_tree/`."""
