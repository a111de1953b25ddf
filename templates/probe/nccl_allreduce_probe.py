"""Cheap all-reduce across every rank of a job: proves the collective transport works before a real run.

Run under torchrun (one torchrun per node). NCCL when CUDA is available, gloo otherwise, so the same probe
runs for real on CPU-only nodes. Rank 0 prints ``NCCL_PROBE_OK world_size=<n> backend=<b> result=<sum>``
when every rank contributed; any failure exits non-zero. A hang is caught by the caller's timeout.

Test-only knob: NPA_PROBE_TEST_HANG_UNLESS=<VAR> makes rank 0 stall before the collective (so every other
rank blocks in it, like the intra-node P2P hang) unless the environment variable <VAR> is set to a non-empty
value other than "0". It exists so tests can prove that the caller escalates knob sets; never set it in
production.
"""

from __future__ import annotations

import datetime
import os
import sys
import time


def _hang_requested(rank: int) -> bool:
    guard = os.environ.get("NPA_PROBE_TEST_HANG_UNLESS", "")
    if not guard or rank != 0:
        return False
    return os.environ.get(guard, "") in ("", "0")


def main() -> int:
    import torch
    import torch.distributed as dist

    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    timeout = datetime.timedelta(seconds=float(os.environ.get("NPA_PROBE_COLLECTIVE_TIMEOUT", "600")))
    dist.init_process_group(backend=backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    if _hang_requested(rank):
        print(f"probe rank {rank}: stalling (test knob NPA_PROBE_TEST_HANG_UNLESS)", flush=True)
        while True:
            time.sleep(60)

    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    expected = world * (world + 1) / 2
    got = float(value.item())
    dist.destroy_process_group()
    if got != expected:
        print(f"NCCL_PROBE_BAD rank={rank} world_size={world} result={got:g} expected={expected:g}", flush=True)
        return 2
    if rank == 0:
        host = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
        print(f"NCCL_PROBE_OK world_size={world} backend={backend} result={got:g} host={host}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
