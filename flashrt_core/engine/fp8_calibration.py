"""The FP8 engine's activation scales: set from real observations, refused until then, kept in a scale cache.

An FP8 engine (EngineOptions.fp8) quantizes the inputs of the backbone's gate/up and down GEMMs with static
per-tensor scales (engine/fp8.py), one per GEMM: amax(input over the calibration observations) * CALIB_MARGIN /
fmax. Each executor of an FP8 engine holds an `Fp8Calibration`, which the executor asks before every run
(graph_executor's `_calibrate_fp8`):

- scales set: the run goes on (graph replay, or its capture);
- a calibration pass under way (`recording`): the run is one eager forward with the wide GEMMs in bf16, each GEMM
  input's amax recorded (max over the pass's observations); its bf16 actions are the call's output;
- a bf16 pass under way (`bf16_pass`, the accuracy gate's comparison): the same forward, nothing recorded;
- inside `warm_up()` (forward passes whose actions are discarded: the node's warm-up, graph capture): the FP8
  GEMMs run with placeholder scales, so the graphs are captured with the FP8 kernels;
- else `Fp8NotCalibrated`: an FP8 engine never serves actions from scales it did not get from real observations.

Setting the scales (`set_scales`) writes the scale tensors in place and captured graphs read them at each replay,
so nothing is re-captured after a calibration.

The scale cache (`ScaleCache`) keeps the amax of each GEMM in a JSON file named by the SHA-256 of its key: the
checkpoint's weight content (`checkpoint_digest`: SHA-256 over the weight files' bytes, memory-mapped; measured
on the 2-core development CPU with SHA-NI: 1.4 GB/s alone in memory, 0.6 GB/s from the page cache with the
cores shared, so 5-11 s for pi0.5's 6.7 GB of bf16 weights, twice that for fp32 files), the model configuration,
the engine dtype, the FP8 format, the margin, and a digest of the calibration observations as the engine sees them. A checkpoint with other weights
in the same folder gets another key. Nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import mmap
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from flashrt_core.errors import Fp8NotCalibrated
from flashrt_core.stopping import raise_if_stopped

from .tuning_cache import canonical, key_digest, write_json_atomically
from .fp8 import CALIB_MARGIN, FP8_DTYPES, quantize_wide, wide_linears
from .weights import EngineWeights

log = logging.getLogger(__name__)

SCALE_CACHE_FORMAT = 1
WEIGHT_FILES = ("model.safetensors",)      # the weights of a safetensors layout; else an Orbax params/ folder
ORBAX_PARAMS_DIR = "params"


class Fp8Calibration:
    """The calibration state of one FP8 executor; the methods take its (possibly shared) prepared weights."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.amax: dict[int, float] | None = None     # id(Linear) -> amax while a calibration pass records
        self._bf16_pass = False
        self._warm_up = 0

    @staticmethod
    def calibrated(weights: EngineWeights) -> bool:
        """Whether every wide GEMM has its FP8 layer with scales set from observations."""
        return all(lin.fp8 is not None and lin.fp8.calibrated for lin in wide_linears(weights))

    @property
    def warming_up(self) -> bool:
        return self._warm_up > 0

    @contextlib.contextmanager
    def warm_up(self):
        """Runs inside are warm-up passes: without scales they run with placeholders (actions meaningless)."""
        self._warm_up += 1
        try:
            yield
        finally:
            self._warm_up -= 1

    @contextlib.contextmanager
    def recording(self):
        """Runs inside are calibration forwards (bf16 wide GEMMs, input amax recorded); yields the amax dict."""
        self.amax = {}
        try:
            yield self.amax
        finally:
            self.amax = None

    @contextlib.contextmanager
    def bf16_pass(self):
        """Runs inside are the same forward with the wide GEMMs in bf16 (the gate's comparison), no recording."""
        self._bf16_pass = True
        try:
            yield
        finally:
            self._bf16_pass = False

    def before_run(self, ops, weights: EngineWeights, run_forward: Callable[[], None]) -> bool:
        """Called before each run of the executor. True: a calibration or bf16 forward ran (eagerly) and its
        actions are the call's output; False: the run goes on. Raises Fp8NotCalibrated (see the module doc)."""
        if self.amax is not None or self._bf16_pass:
            lins = wide_linears(weights)
            held = [lin.fp8 for lin in lins]
            for lin in lins:                     # bf16 GEMMs: the activations FP8 will see, unquantized
                lin.fp8 = None
            ops.calibration = self.amax          # None for the bf16 pass: nothing recorded
            try:
                run_forward()
            finally:
                ops.calibration = None
                for lin, fp8 in zip(lins, held):
                    lin.fp8 = fp8
            return True
        if self.calibrated(weights):
            return False
        if not self.warming_up:
            raise Fp8NotCalibrated(
                "the FP8 engine has no activation scales yet: calibrate it on real observations first "
                "(Policy.calibrate(observations), or the node's calibration_observations / calibration_bag); "
                "it never calibrates on whatever input comes first")
        quantize_wide(weights, None, self.fmt)               # placeholders: the graphs capture the FP8 kernels
        return False

    def set_scales(self, weights: EngineWeights, amax_by_index: list[float]) -> None:
        """Set every wide GEMM's input scale from its amax (wide_linears order), in place."""
        lins = wide_linears(weights)
        if len(amax_by_index) != len(lins):
            raise ValueError(f"{len(amax_by_index)} FP8 amax values for {len(lins)} wide GEMMs")
        quantize_wide(weights, None, self.fmt)
        for lin, amax in zip(lins, amax_by_index):
            lin.fp8.set_input_amax(amax)

    @staticmethod
    def amax_by_index(weights: EngineWeights, recorded: dict[int, float]) -> list[float]:
        """A calibration pass's amax in wide_linears order; ValueError when a wide GEMM was not seen."""
        lins = wide_linears(weights)
        missing = sum(id(lin) not in recorded for lin in lins)
        if missing:
            raise ValueError(f"FP8 calibration did not see {missing} of {len(lins)} wide GEMMs; run it on full "
                             "observations")
        return [float(recorded[id(lin)]) for lin in lins]


def calibrate(executor, runs: Iterable[Callable[[], object]]) -> list[float]:
    """Run each callable (one call of `executor` per observation) as a calibration forward and set the scales from
    the max amax over them. Returns the amax per wide GEMM (wide_linears order)."""
    calibration, count = executor.fp8_calibration, 0
    with calibration.recording() as recorded:
        for run in runs:
            raise_if_stopped(f"FP8 calibration: observation {count + 1}")
            run()
            count += 1
    if count == 0:
        raise ValueError("FP8 calibration needs at least one observation")
    amax = calibration.amax_by_index(executor.weights, recorded)
    calibration.set_scales(executor.weights, amax)
    return amax


def calibrate_executor(executor, observations) -> list[float]:
    """Explicit calibration of an executor on engine-level observations (engine/gate.py's Observation: images,
    tokens, token_mask, state, noise), for the engine's tests and tools; Policy.calibrate is the product's path."""
    return calibrate(executor, [lambda o=o: executor.predict_observation(o.images, o.tokens, o.token_mask, o.state,
                                                                          o.noise) for o in observations])


def scale_summary(amax: list[float], fmt: str) -> dict:
    """Per-GEMM input scales in brief: count, amax min / median / max, and the scales (amax * margin / fmax)."""
    fmax = float(torch.finfo(FP8_DTYPES[fmt]).max)
    scales = [max(a, 1e-6) * CALIB_MARGIN / fmax for a in amax]
    return {"gemms": len(amax), "amax_min": min(amax), "amax_median": statistics.median(amax),
            "amax_max": max(amax), "scale_min": min(scales), "scale_max": max(scales), "margin": CALIB_MARGIN,
            "format": fmt}



# ---------------------------------------------------------------------------------------------------- scale cache
def weight_files(checkpoint_dir: str | os.PathLike) -> list[Path]:
    """The files that hold a checkpoint's weights: model.safetensors, else every file of an Orbax params/ folder."""
    root = Path(checkpoint_dir)
    files = [root / name for name in WEIGHT_FILES if (root / name).is_file()]
    if not files and (root / ORBAX_PARAMS_DIR).is_dir():
        files = sorted(p for p in (root / ORBAX_PARAMS_DIR).rglob("*") if p.is_file())
    if not files:
        raise ValueError(f"{root} has no weight files ({', '.join(WEIGHT_FILES)} or {ORBAX_PARAMS_DIR}/)")
    return files


def checkpoint_digest(checkpoint_dir: str | os.PathLike) -> str:
    """SHA-256 over the weight files' names (relative) and bytes: what the checkpoint computes, not its name."""
    root = Path(checkpoint_dir)
    digest = hashlib.sha256()
    start, size = time.perf_counter(), 0
    for path in weight_files(root):
        digest.update(f"{path.relative_to(root).as_posix()}\0".encode())
        with open(path, "rb") as f:
            length = os.fstat(f.fileno()).st_size
            if length:                     # mapped, not read: no copy of the bytes (hashlib drops the GIL on it)
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    digest.update(mapped)
            size += length
    log.info("checkpoint content digest of %s: %.2f GB hashed in %.2f s", root, size / 1e9,
             time.perf_counter() - start)
    return digest.hexdigest()


def observations_digest(arrays: Iterable[Iterable[np.ndarray | None]]) -> str:
    """SHA-256 over the calibration observations as the engine receives them (each a sequence of arrays: images,
    tokens, token mask, state), shapes and dtypes included."""
    digest = hashlib.sha256()
    for observation in arrays:
        digest.update(b"obs\0")
        for array in observation:
            if array is None:
                digest.update(b"none\0")
                continue
            a = np.ascontiguousarray(array)
            digest.update(f"{a.dtype.str}{a.shape}\0".encode())
            digest.update(a.tobytes())
    return digest.hexdigest()


class ScaleCache:
    """One directory of FP8 scale entries. load() and store() never raise for what is in the directory: an entry
    that cannot be read or matched is logged and treated as missing; a directory that cannot be written is logged."""

    def __init__(self, directory: str | os.PathLike):
        if not str(directory):
            raise ValueError("ScaleCache needs a directory")
        self.directory = Path(directory).expanduser()

    def path(self, key: dict) -> Path:
        return self.directory / f"fp8-scales-{key_digest(key)[:32]}.json"

    def load(self, key: dict, gemms: int) -> list[float] | None:
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            entry = json.loads(path.read_text())
            if not isinstance(entry, dict) or entry.get("format") != SCALE_CACHE_FORMAT:
                raise ValueError("unknown format")
            if entry.get("key") != canonical(key):
                raise ValueError("its key differs from this calibration's (a hash collision or an edited file)")
            amax = entry.get("amax")
            if not (isinstance(amax, list) and len(amax) == gemms
                    and all(isinstance(a, (int, float)) and 0.0 <= a < float("inf") for a in amax)):
                raise ValueError(f"expected {gemms} finite amax values")
            return [float(a) for a in amax]
        except (OSError, ValueError) as err:
            log.warning("FP8 scale cache entry %s is not usable, calibrating instead: %s", path, err)
            return None

    def store(self, key: dict, amax: list[float], report: dict) -> Path | None:
        path = self.path(key)
        entry = {"format": SCALE_CACHE_FORMAT, "key": canonical(key), "amax": amax, "report": canonical(report),
                 "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        return write_json_atomically(path, entry, "FP8 scale cache entry")


def scale_key(checkpoint_digest_: str, config, dtype: torch.dtype, fmt: str, observations: str) -> dict:
    """What the calibrated amax depends on: the weights' content, the model configuration, the engine dtype, the
    FP8 format and margin, and the calibration observations."""
    return {"format": SCALE_CACHE_FORMAT, "checkpoint_sha256": checkpoint_digest_,
            "model": dataclasses.asdict(config), "dtype": str(dtype), "fp8_format": fmt, "margin": CALIB_MARGIN,
            "observations_sha256": observations}


__all__ = ["Fp8Calibration", "Fp8NotCalibrated", "ScaleCache", "calibrate", "calibrate_executor", "checkpoint_digest",
           "observations_digest", "scale_key", "scale_summary", "weight_files"]
