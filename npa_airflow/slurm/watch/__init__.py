"""A submitted Slurm job followed to its end: the per-cluster poller, log tails, the trigger's cancels and events,
failure classification."""
