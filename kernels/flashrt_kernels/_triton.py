"""Triton, or a stand-in that keeps the plain-PyTorch references importable where Triton is not installed.

Without Triton, `triton.jit` returns a function that raises when launched, and `tl.constexpr` is a plain type so
that kernel signatures still evaluate. `HAVE_TRITON` tells which one was loaded.
"""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # CPU-only installs: the references run, the kernels raise when launched
    import types

    HAVE_TRITON = False

    def _jit(fn=None, **_kwargs):
        def wrap(f):
            return _Unlaunchable(f.__name__)
        return wrap(fn) if fn is not None else wrap

    class _Unlaunchable:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, _grid):
            raise RuntimeError(f"Triton is not installed: kernel {self.name} cannot run")

    triton = types.SimpleNamespace(jit=_jit, cdiv=lambda a, b: (a + b - 1) // b,
                                   next_power_of_2=lambda n: 1 << max(0, (int(n) - 1).bit_length()))
    tl = types.SimpleNamespace(constexpr=int)

# Triton's CPU interpreter (TRITON_INTERPRET=1, used to check kernel logic without a GPU) has no griddepcontrol:
# there, PDL kernels run their wait as a no-op, which is exact since the interpreter runs programs one by one.
INTERPRETED = HAVE_TRITON and os.environ.get("TRITON_INTERPRET", "0") == "1"   # kernels run on CPU tensors too
_GRID_DEPENDENCY_CONTROL = tl.constexpr(not INTERPRETED)


# PDL (a kernel's constexpr): 0 / False: plain stream order. 1 / True: the next kernel may launch once every program of
# this one has passed its wait_for_inputs. EARLY_TRIGGER (2): it may launch as soon as every program of this one has
# started (release_dependents at the top of each kernel), so several kernels ahead can be resident and streaming
# their weights while this one waits or works. Both are safe for the same reason: a kernel's wait returns only
# after the kernel ahead has completed, and that one's wait only after the one before it, so the chain's order holds
# however early a kernel starts; what runs before the wait may only read load-time data (weights, tables).
EARLY_TRIGGER = 2


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """First statement of every PDL kernel: with PDL == EARLY_TRIGGER, let the next kernel in the stream launch now.
    Otherwise nothing (wait_for_inputs releases it)."""
    if PDL == 2 and _GRID_DEPENDENCY_CONTROL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Programmatic dependent launch (sm90+): with PDL the kernel may start before the kernel ahead of it in the
    stream has finished. Everything before this call may only read data no earlier kernel of the predict writes
    (weights); after it, every earlier kernel's writes are visible. With PDL == 1 the kernel after this one may
    start from here (with EARLY_TRIGGER it already could: release_dependents).
    Without PDL (the launcher's `pdl=False`) this compiles to nothing."""
    if PDL and _GRID_DEPENDENCY_CONTROL:
        tl.extra.cuda.gdc_wait()
        if PDL != 2:
            tl.extra.cuda.gdc_launch_dependents()


def launch_options(pdl: bool | int) -> dict:
    """Extra launch keywords of a kernel launched with programmatic dependent launch (none without). pdl: False,
    True (1) or EARLY_TRIGGER (2), see release_dependents."""
    return {"launch_pdl": True} if pdl else {}


__all__ = ["EARLY_TRIGGER", "HAVE_TRITON", "INTERPRETED", "triton", "tl", "release_dependents", "wait_for_inputs",
           "launch_options"]
