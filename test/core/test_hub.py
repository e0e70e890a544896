"""Hub ids where a folder is expected, through huggingface_hub's cache: a cache laid out as huggingface_hub lays it
out (models--org--name/blobs, snapshots/<commit>/ of links to the blobs, refs/main), offline, no network."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from checked_run import failure_report

from flashrt_core import hub
from flashrt_core.api import load_model
from flashrt_core.checkpoint_layout import Layout
from flashrt_core.errors import CheckpointError
from flashrt_core.fixture_layouts import tokenizer_for_tests, write_layout

REPO_ROOT = Path(__file__).resolve().parents[2]
HUB_ID = "fixture-org/pi05_tiny_lerobot"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
IMAGES = [np.full((32, 48, 3), 60, np.uint8)] * 3
NOISE = np.random.default_rng(4).standard_normal((10, 32)).astype(np.float32)


def populate_cache(cache: Path, repo_id: str, folder: Path, commit: str = COMMIT) -> Path:
    """Put `folder` into a huggingface_hub cache as repo_id at `commit` (branch main); returns the snapshot."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(path.read_bytes())
            link = snapshot / path.relative_to(folder)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    folder = write_layout(base / "folder", Layout.LEROBOT, seed=6)
    snapshot = populate_cache(base / "cache", HUB_ID, folder)
    return base / "cache", folder, snapshot, tokenizer_for_tests(base / "tokenizer.model")


@pytest.fixture()
def offline_cache(cached, monkeypatch):
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cached[0]))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cached


def predict(checkpoint, tokenizer):
    policy = load_model(checkpoint, device="cpu", hardware="reference", tokenizer=tokenizer)
    try:
        return policy, policy.predict(IMAGES, "fold the towel", state=np.zeros(8), noise=NOISE)
    finally:
        policy.close()


def test_hub_ids_are_told_from_paths():
    for text in ("lerobot/pi05_base", "lerobot/pi05_base@main", "org-1/model.v2@3f2a"):
        assert hub.is_hub_id(text), text
    for text in ("/abs/folder", "./rel", "a/b/c", "single", "lerobot/", "../x/y"):
        assert not hub.is_hub_id(text), text


def test_a_hub_id_loads_the_cached_snapshot_like_its_folder(offline_cache):
    _, folder, snapshot, tokenizer = offline_cache
    assert hub.checkpoint_path(HUB_ID) == snapshot and hub.checkpoint_path(f"{HUB_ID}@main") == snapshot
    policy, from_hub = predict(HUB_ID, tokenizer)
    _, from_folder = predict(folder, tokenizer)
    np.testing.assert_array_equal(from_hub, from_folder)
    assert policy.model_id == f"pi05_tiny:{HUB_ID}"


def test_an_existing_folder_wins_over_a_hub_id(offline_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fixture-org" / "pi05_tiny_lerobot").mkdir(parents=True)
    assert hub.checkpoint_path(HUB_ID) == Path(HUB_ID)


def test_an_uncached_hub_id_offline_says_how_to_get_it(offline_cache):
    with pytest.raises(CheckpointError) as info:
        load_model("fixture-org/not_downloaded", device="cpu")
    message = str(info.value)
    assert "no folder here" in message and "hf download fixture-org/not_downloaded" in message


def test_flashrt_inspect_takes_a_hub_id(cached):
    """The executable, in a fresh process, with the cache named by HF_HUB_CACHE and HF_HUB_OFFLINE=1."""
    cache, _, snapshot, tokenizer = cached
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    code = f"import sys; sys.argv = ['inspect', {HUB_ID!r}, '--tokenizer', {str(tokenizer)!r}]\n" \
           "from flashrt_ros.console_scripts import run\nsys.exit(run('inspect'))\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, failure_report(done)
    assert f"checkpoint: {HUB_ID}" in done.stdout and f"folder:     {snapshot}" in done.stdout
    assert "layout:     lerobot" in done.stdout and "ready:      yes" in done.stdout
