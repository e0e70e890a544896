"""What every loaded policy (the pi family's Policy, GrootPolicy) does at its end: close() releases the executor and
the model's weights, collects and returns the GPU's cached memory; `with policy:` closes it on leaving."""

from __future__ import annotations

import gc

import torch


class PolicyLifetime:
    """Mixin over `executor`, `model` and `device` attributes. predict raises after close (each policy checks
    `executor is None`)."""

    executor: object
    model: object
    device: torch.device

    def close(self) -> None:
        """Release the weights (and GPU memory). predict raises afterwards."""
        if self.executor is not None and hasattr(self.executor, "close"):
            self.executor.close()
        self.executor = None
        self.model = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
