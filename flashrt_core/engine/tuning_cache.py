"""The engine's load-time tuning results kept on disk, so a later load of the same model on the same GPU, software
and options reuses them instead of measuring again (opt-in: EngineOptions.tuning_cache / FLASHRT_TUNING_CACHE).

What is kept: the picks of the decoder GEMM tuning (each kind's configuration by name, the launch policy), of the
prefix attention and of the vision attention's SDPA backend. On the H200 the measuring took 36-41 s per engine
load, nearly all of it the chain tuning; a robot's node pays that at every configure.
Reused picks also make two loads of one setup run the same kernels.

A cache entry is a JSON file named by the SHA-256 of its key: the format, a fingerprint of the engine's and the
kernels' Python sources (code_fingerprint: other code never reads an entry), the GPU (name, compute capability,
SM count), the torch / CUDA / Triton versions, the model configuration, the engine dtype, the rows and workspace
the tuning ran at, every EngineOptions field but tuning_cache, and the dispatch table. The key is stored in the
file too and compared on load. The file holds names only; the engine maps each to one of its own candidates and
checks it (graph_executor: a decoder GEMM pick's product against the library GEMM's), so a file cannot make the
engine run anything it would not have picked itself. Nothing is unpickled.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TUNING_CACHE_FORMAT = 1


@functools.lru_cache(maxsize=None)
def code_fingerprint() -> str:
    """SHA-256 over the names and bytes of the engine's (flashrt_core/engine) and the kernels' Python sources: any
    change to either gives other keys, so no entry written by other code is read."""
    from .kernel_import import load_kernels
    digest = hashlib.sha256()
    for root in (Path(__file__).resolve().parent, Path(load_kernels().__file__).resolve().parent):
        for path in sorted(root.glob("*.py")):
            digest.update(f"{root.name}/{path.name}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def canonical(value: Any) -> Any:
    """value as JSON would give it back (tuples as lists, enums and dtypes as strings): keys compare equal before
    and after a round trip through a file."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(canonical(key), sort_keys=True).encode()).hexdigest()


def write_json_atomically(path: Path, entry: dict, what: str) -> Path | None:
    """Write `entry` as JSON to `path` through a temporary file in its directory and a rename, so that a reader
    never sees half an entry; returns the path, or None where it could not be written (logged as `what`)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp",
                                         delete=False) as f:
            tmp = f.name
            json.dump(entry, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
        return path
    except OSError as err:
        log.warning("could not write the %s %s: %s", what, path, err)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        return None


class TuningCache:
    """One directory of tuning entries. load() and store() never raise for what is in the directory: an entry that
    cannot be read, parsed or matched is logged and treated as missing, a directory that cannot be written is
    logged and the engine goes on with the picks it measured."""

    def __init__(self, directory: str | os.PathLike):
        if not str(directory):
            raise ValueError("TuningCache needs a directory")
        self.directory = Path(directory).expanduser()

    def path(self, key: dict) -> Path:
        return self.directory / f"tuning-{key_digest(key)[:32]}.json"

    def load(self, key: dict) -> dict | None:
        """The picks stored under `key`, or None (no entry, or one that is unreadable or for another key)."""
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            entry = json.loads(path.read_text())
            if not isinstance(entry, dict) or entry.get("format") != TUNING_CACHE_FORMAT:
                raise ValueError(f"format {entry.get('format') if isinstance(entry, dict) else entry!r}, "
                                 f"expected {TUNING_CACHE_FORMAT}")
            if entry.get("key") != canonical(key):
                raise ValueError("its key differs from this engine's (a hash collision or an edited file)")
            picks = entry.get("picks")
            if not isinstance(picks, dict):
                raise ValueError("no picks")
            return picks
        except (OSError, ValueError) as err:    # json.JSONDecodeError is a ValueError
            log.warning("tuning cache entry %s is not usable, measuring instead: %s", path, err)
            return None

    def store(self, key: dict, picks: dict, timings: dict | None = None) -> Path | None:
        """Write the entry for `key` atomically (a temporary file in the directory, then a rename); returns its
        path, or None where it could not be written (logged)."""
        path = self.path(key)
        entry = {"format": TUNING_CACHE_FORMAT, "key": canonical(key), "picks": canonical(picks),
                 "timings": canonical(timings or {}),
                 "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        return write_json_atomically(path, entry, "tuning cache entry")


def pick_by_name(candidates, name: str, what: str):
    """The candidate whose str() is `name`; ValueError naming `what` and the choices when none is."""
    for candidate in candidates:
        if str(candidate) == name:
            return candidate
    raise ValueError(f"tuning cache: {what} {name!r} is not among this engine's candidates "
                     f"{[str(c) for c in candidates]}")


__all__ = ["TUNING_CACHE_FORMAT", "TuningCache", "canonical", "code_fingerprint", "key_digest", "pick_by_name",
           "write_json_atomically"]
