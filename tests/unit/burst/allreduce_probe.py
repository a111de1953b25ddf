"""A gloo all-reduce across every process torchrun started: the CPU analogue of the NCCL probe."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
expected = world * (world + 1) / 2
print(
    f"allreduce rank={rank} world={world} sum={value.item():g} expected={expected:g} "
    f"master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    flush=True,
)
dist.destroy_process_group()
raise SystemExit(0 if value.item() == expected else 1)
