"""Hardware detection: what the engine runs on, found once per process.

`detect_hardware("auto")` looks at the torch build and the device: CPU, NVIDIA CUDA with its compute capability,
or AMD ROCm with its gfx architecture. A name instead of "auto" pins the target, so that the dispatch table can be
exercised for hardware that is not present (tests, bug reports): "cpu", "reference", "sm90", "sm89", "sm120",
"gfx942", "gfx950".
"""

from __future__ import annotations

import enum
import functools
import logging
import re
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


class Vendor(str, enum.Enum):
    CPU = "cpu"
    NVIDIA = "nvidia"
    AMD = "amd"


@dataclass(frozen=True)
class Hardware:
    """One target. `capability` is the CUDA compute capability (major, minor), `gfx_arch` the ROCm arch."""

    vendor: Vendor
    name: str                                  # device name as the driver reports it, or the pinned target name
    capability: tuple[int, int] | None = None  # NVIDIA only
    gfx_arch: str | None = None                # AMD only, e.g. "gfx942"
    reference_only: bool = False               # hardware="reference": the eager reference path, whatever the device

    @property
    def is_gpu(self) -> bool:
        return self.vendor is not Vendor.CPU

    @property
    def sm(self) -> int | None:
        """Compute capability as one number (9.0 -> 90), None off NVIDIA."""
        return None if self.capability is None else self.capability[0] * 10 + self.capability[1]

    def describe(self) -> str:
        if self.vendor is Vendor.NVIDIA:
            return f"{self.name} (sm{self.sm})"
        if self.vendor is Vendor.AMD:
            return f"{self.name} ({self.gfx_arch})"
        return self.name


CPU = Hardware(Vendor.CPU, "cpu")

# Targets that can be named without the hardware being present.
_PINNED_NVIDIA = re.compile(r"^sm(\d{2,3})$")          # sm90 -> (9, 0), sm120 -> (12, 0)
_PINNED_AMD = re.compile(r"^(gfx9\d\d|gfx1\d\d\d)$")


def _detect_device(device: torch.device) -> Hardware:
    if device.type != "cuda" or not torch.cuda.is_available():
        return CPU
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip is not None:
        arch = getattr(props, "gcnArchName", "") or ""
        gfx = arch.split(":")[0] or None
        return Hardware(Vendor.AMD, props.name, gfx_arch=gfx)
    return Hardware(Vendor.NVIDIA, props.name, capability=(props.major, props.minor))


@functools.lru_cache(maxsize=None)
def _detect_cached(device_str: str) -> Hardware:
    hw = _detect_device(torch.device(device_str))
    log.info("detected hardware: %s", hw.describe())
    return hw


def detect_hardware(hardware: str | Hardware = "auto", device: str | torch.device = "cuda") -> Hardware:
    """Resolve `hardware` ("auto", "reference", "cpu", "sm90", "gfx942", ... or a Hardware) to a Hardware.

    Raises ValueError naming the value when it is not one of those forms.
    """
    if isinstance(hardware, Hardware):
        return hardware
    if not isinstance(hardware, str):
        raise ValueError(f"hardware must be a string or Hardware, got {type(hardware).__name__}")
    key = hardware.strip().lower()
    if key == "auto":
        return _detect_cached(str(torch.device(device)))
    if key == "reference":
        detected = _detect_cached(str(torch.device(device)))
        return Hardware(detected.vendor, detected.name, detected.capability, detected.gfx_arch, reference_only=True)
    if key == "cpu":
        return CPU
    m = _PINNED_NVIDIA.match(key)
    if m:
        sm = int(m.group(1))
        return Hardware(Vendor.NVIDIA, key, capability=(sm // 10, sm % 10))
    if _PINNED_AMD.match(key):
        return Hardware(Vendor.AMD, key, gfx_arch=key)
    raise ValueError(
        f"unknown hardware {hardware!r}: expected 'auto', 'reference', 'cpu', 'smXY' (e.g. 'sm90') or 'gfxNNN' "
        "(e.g. 'gfx942')"
    )
