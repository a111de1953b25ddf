"""Burst e2e job: rank 0 prints "tick <i> of <n>" once a second (n = NPA_TICKS, default 600)."""

import os
import time

n = int(os.environ.get("NPA_TICKS", "600"))
for i in range(1, n + 1):
    if os.environ.get("RANK", "0") == "0":
        print(f"tick {i} of {n}", flush=True)
    time.sleep(1)
