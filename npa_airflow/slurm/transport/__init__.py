"""How a Slurm cluster is reached: the SSH transport, the async hook and its command mixins (queries, submission,
cancels), the per-cluster channel and its kill batch."""
