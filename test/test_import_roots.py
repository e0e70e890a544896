"""No folder this repository puts on sys.path hides an installed module.

Code runs from the repository root (`python -c ...`, the tools) and the test suite adds its import roots
(test/conftest.py IMPORT_ROOTS, plus the folder of each collected test file). A regular package or module there
that shares its name with an installed one wins the import: a top-level kernels/__init__.py hid the third-party
`kernels` package that transformers imports, and test/__init__.py the standard library's `test` package. The
checks below look at every importable name of every such folder and at the import transformers really makes."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import os
import sys
from pathlib import Path

from checked_run import run_checked
from conftest import IMPORT_ROOTS, REPO_ROOT

# Folders whose names become importable: the roots the suite adds, the folders pytest adds for the test files it
# collects (rootdir-relative, no __init__.py), and tools/, which the benchmarks and their tests add.
SEARCHED_FOLDERS = sorted({*IMPORT_ROOTS, REPO_ROOT / "test", REPO_ROOT / "test" / "gpu", REPO_ROOT / "tools"})
# The names this repository provides on purpose (its three packages).
OWN_PACKAGES = {"flashrt_core", "flashrt_ros", "flashrt_kernels"}


def importable_names(folder: Path) -> set[str]:
    """Top-level names a folder on sys.path makes importable as regular modules or packages (a folder without
    __init__.py is a namespace portion, which never wins over a regular module elsewhere on the path)."""
    names = set()
    for entry in folder.iterdir():
        if entry.suffix == ".py" and entry.is_file():
            names.add(entry.stem)
        elif entry.is_dir() and (entry / "__init__.py").is_file():
            names.add(entry.name)
    return names


def installed_elsewhere(name: str) -> str | None:
    """Where `name` is found on sys.path outside the folders this repository adds to it (the venv inside the
    checkout counts as outside), or None."""
    own = {folder.resolve() for folder in SEARCHED_FOLDERS}
    outside = [p for p in sys.path if p and Path(p).resolve() not in own]
    spec = importlib.machinery.PathFinder.find_spec(name, outside)
    if spec is None or spec.origin in (None, "namespace"):
        return None
    return spec.origin


def hidden_modules(folders: list[Path]) -> dict[str, str]:
    """'folder/name' -> the installed module it hides, for every importable name of the folders."""
    hidden = {}
    for folder in folders:
        for name in sorted(importable_names(folder) - OWN_PACKAGES):
            origin = installed_elsewhere(name)
            if origin is not None:
                hidden[f"{folder}/{name}"] = origin
    return hidden


def test_no_folder_on_the_import_path_hides_an_installed_module():
    hidden = hidden_modules(SEARCHED_FOLDERS)
    assert not hidden, f"names of this repository that hide installed modules: {hidden}"


def test_a_kernels_or_test_package_at_a_root_is_reported(tmp_path):
    """The check has teeth: the installed modules it protects are found, and a folder holding a regular package
    named like them (the layout this repository had) is reported."""
    for name in ("kernels", "test"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / "flashrt_kernels").mkdir()
    (tmp_path / "flashrt_kernels" / "__init__.py").write_text("")
    assert set(hidden_modules([tmp_path])) == {f"{tmp_path}/kernels", f"{tmp_path}/test"}


def test_transformers_paligemma_imports_from_the_repository_root():
    """From the repository root (the current directory is first on sys.path), `kernels` is the installed
    third-party package and transformers' PaliGemma imports."""
    installed = Path(importlib.metadata.distribution("kernels").locate_file("kernels/__init__.py")).resolve()
    assert installed.is_file(), "the third-party kernels package (a dependency of transformers) is not installed"
    probe = ("import kernels, transformers; from transformers import PaliGemmaForConditionalGeneration; "
             "print(kernels.__file__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = run_checked([sys.executable, "-c", probe], cwd=REPO_ROOT, env=env, timeout=300)
    assert Path(result.stdout.strip().splitlines()[-1]).resolve() == installed, result.stdout
