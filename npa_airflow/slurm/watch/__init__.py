"""A submitted Slurm job followed to its end: the per-cluster poller, log tails and offsets, the trigger's cancels and
events, native states, states without accounting, failure classification."""
