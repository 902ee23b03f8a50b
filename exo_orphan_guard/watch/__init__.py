"""The package's own parent watch, for a program that calls `guard_runner` (exo's
runners never do: exo's own code hands them their Shutdown), its watchdog, the verified
tree kill, and `exec`."""
