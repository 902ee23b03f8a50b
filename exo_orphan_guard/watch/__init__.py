"""The parent watch inside every runner, its watchdog, the tree kill, and `exec`."""
