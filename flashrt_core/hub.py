"""Hugging Face hub ids where a checkpoint folder is expected: "lerobot/pi05_base" (or "org/name@revision").

A `checkpoint` argument that is an existing folder is that folder. Otherwise, when it reads as a hub id, it is
resolved through huggingface_hub's cache (`snapshot_download`): the snapshot folder of the cache
($HF_HUB_CACHE, default ~/.cache/huggingface/hub, laid out as models--org--name/snapshots/<commit>/ with
refs/<branch> naming the commit) once downloaded, downloading it first when the hub can be reached. With
HF_HUB_OFFLINE=1 nothing is downloaded and only the cache is read. huggingface_hub is an optional dependency
(`pip install 'flashrt-ros[hub]'`), imported only here and only for a hub id.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from flashrt_core.errors import CheckpointError

log = logging.getLogger(__name__)

# org/name with an optional @revision; names as the hub allows them (letters, digits, "-", "_", ".")
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?")
INSTALL_HUB = ("huggingface_hub, which resolves hub ids: `pip install 'flashrt-ros[hub]'` "
               "(or `pip install huggingface_hub`)")


def is_hub_id(text: str) -> bool:
    return HUB_ID.fullmatch(text) is not None


def checkpoint_path(checkpoint: str | Path) -> Path:
    """The local folder of `checkpoint`: the folder itself, or the cached snapshot of a hub id."""
    path = Path(checkpoint)
    if path.exists() or isinstance(checkpoint, Path) or not is_hub_id(str(checkpoint)):
        return path
    return snapshot(str(checkpoint))


def snapshot(hub_id: str) -> Path:
    """The snapshot folder of a hub model repository ("org/name[@revision]"), from huggingface_hub's cache."""
    match = HUB_ID.fullmatch(hub_id)
    if match is None:
        raise CheckpointError(f"{hub_id!r} is not a hub id (org/name or org/name@revision)")
    try:
        import huggingface_hub
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ModuleNotFoundError as exc:
        raise CheckpointError(f"{hub_id!r} is no folder here; as a hub id it needs {INSTALL_HUB}") from exc
    try:
        folder = huggingface_hub.snapshot_download(match["repo"], revision=match["revision"])
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{hub_id!r} is no folder here, and huggingface_hub could not provide it as a hub id: {exc}. Download it "
            f"where the hub can be reached (`hf download {match['repo']}`, into $HF_HUB_CACHE) or pass its folder"
        ) from exc
    log.info("hub id %s -> %s", hub_id, folder)
    return Path(folder)
