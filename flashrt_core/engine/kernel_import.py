"""Import the kernels package `flashrt_kernels` that belongs to this flashrt_core.

In a source checkout it is kernels/flashrt_kernels/ beside flashrt_core/, loaded here from its path (registered in
sys.modules so its relative imports work). In a colcon/pip install there is no such directory beside the installed
flashrt_core, and the installed `flashrt_kernels` package is imported. The checkout wins when both exist, so a stale
install (colcon copies kernels/flashrt_kernels/ at build time) never shadows the source being run.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

PACKAGE = "flashrt_kernels"
SOURCE_DIR = Path(__file__).resolve().parents[2] / "kernels" / PACKAGE


@functools.lru_cache(maxsize=None)
def load_kernels() -> ModuleType:
    """The flashrt_kernels module. Raises ImportError naming both places looked at when neither exists."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    init = SOURCE_DIR / "__init__.py"
    if not init.is_file():
        installed = importlib.util.find_spec(PACKAGE)
        if installed is not None and installed.origin is not None:  # an empty install dir is a namespace: skip
            return importlib.import_module(PACKAGE)
        raise ImportError(f"{PACKAGE} is not installed and there is no source checkout at {init}")
    spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[str(SOURCE_DIR)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PACKAGE]
        raise
    log.debug("loaded %s from %s", PACKAGE, SOURCE_DIR)
    return module


def triton_available() -> bool:
    """True where the kernels package imports and Triton is installed."""
    try:
        return bool(load_kernels().HAVE_TRITON)
    except ImportError:
        return False
