"""How many CPUs this process may use, and whether torch's host threads outnumber them.

torch sizes its intra-op thread pool from the CPUs it sees (the affinity mask), not from a container's CPU quota
(`docker run --cpus`, a Kubernetes CPU limit): on a large host with a small quota it runs many more threads than
it gets CPUs for, and each of its small host ops (the per-call image conversions and copies of a predict) then
waits for threads that are not running. `load_model` checks this once and warns with the fix; it does not change
torch's setting itself, which belongs to the application.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import torch

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs' worth of time the process's cgroup may use (cgroup v2 `cpu.max` "quota period", v1
    `cpu/cpu.cfs_quota_us` over `cpu.cfs_period_us`), or None where there is no quota or none can be read."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cpus(root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process can run on at once: its affinity mask, bounded by its cgroup's quota (rounded up)."""
    visible = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota(root)
    return max(1, min(visible, math.ceil(quota))) if quota else visible


def warn_if_oversubscribed(log: logging.Logger, root: Path = CGROUP_ROOT) -> bool:
    """Log a warning when torch's intra-op threads outnumber the usable CPUs; True when it did."""
    threads, cpus = torch.get_num_threads(), usable_cpus(root)
    if threads <= cpus:
        return False
    log.warning("torch runs %d host threads on %d usable CPUs (affinity and CPU quota): its small host ops per "
                "predict slow down. Call torch.set_num_threads(%d) (or set OMP_NUM_THREADS=%d) before loading.",
                threads, cpus, cpus, cpus)
    return True
