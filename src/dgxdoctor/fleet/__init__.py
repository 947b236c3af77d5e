"""The fleet: the results store, peers' /state snapshots and the node comparison (checks, exporters, daemon use it)."""
