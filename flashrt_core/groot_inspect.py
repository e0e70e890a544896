"""flashrt-inspect on a GR00T N1.6 checkpoint folder (config.json with model_type Gr00tN1d6): the preset and the
sizes config.json gives, the weights' names and shapes against the preset's table, every embodiment the folder
can serve (projector id, camera views, joint groups, action horizon) and what stops the others, the tokenizer,
and whether GR00T's libraries are installed. Reads config.json, the processor files, the statistics and the
safetensors headers; no tensor data, no model built, no transformers or Pillow needed.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from flashrt_core.api import GROOT_MODULES
from flashrt_core.checkpoint import SAFETENSORS_DTYPES
from flashrt_core.errors import CheckpointError
from flashrt_core.groot_checkpoint import (CONFIG_FILE, INDEX_FILE, PRESET_KEY, SINGLE_FILE, check_names,
                                           find_tokenizer, read_shapes, resolve_groot_config)
from flashrt_core.groot_statistics import PROCESSOR_FILE, STATISTICS_FILE, load_embodiment

LAYOUT = "groot_n1.6"
LAYOUT_DESCRIPTION = (f"GR00T N1.6 (Isaac-GR00T's Gr00tN1d6): {CONFIG_FILE}, {INDEX_FILE} with its shards (or "
                      f"{SINGLE_FILE}), {PROCESSOR_FILE}, {STATISTICS_FILE}")


def _installed(module: str) -> bool:
    """Whether `module` can be imported (found on the path, or imported already), without importing it."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _candidate_tags(folder: Path, statistics: dict | None) -> list[str]:
    """The embodiments the processor config describes, in its order (load_embodiment says what each lacks)."""
    try:
        tags = list(json.loads((folder / PROCESSOR_FILE).read_text())["processor_kwargs"]["modality_configs"])
    except (OSError, ValueError, KeyError, TypeError):     # unreadable or malformed: load_embodiment says how
        tags = []
    return tags or sorted(statistics or {})


def inspect_groot(report, folder: Path, config: str | None = None, tokenizer: str | Path | None = None,
                  embodiment: str | None = None):
    """Fill `report` (checkpoint_inspect.Inspection) for a GR00T folder; problems land in report.missing.
    embodiment: the tag the caller will pass to load_model (None: every tag the folder describes is reported,
    and the folder is ready when at least one of them loads)."""
    report.family = "groot"
    report.layout, report.layout_description = LAYOUT, LAYOUT_DESCRIPTION
    cfg = None
    try:
        cfg = resolve_groot_config(config, folder)
        raw = json.loads((folder / CONFIG_FILE).read_text())
        preset_from = "--config" if config else (f"config.json's {PRESET_KEY}" if PRESET_KEY in raw else "default")
        report.model = {"config": cfg.name, "model_type": "Gr00tN1d6", "preset_from": preset_from,
                        "action_horizon": cfg.action_horizon, "num_steps": cfg.num_inference_timesteps,
                        "max_state_dim": cfg.max_state_dim, "max_action_dim": cfg.max_action_dim,
                        "max_num_embodiments": cfg.max_num_embodiments,
                        "widths": {"vision": cfg.vision.width, "llm": cfg.llm.width, "dit": cfg.hidden_size},
                        "layers": {"vision": cfg.vision.depth, "llm": cfg.llm.num_layers, "dit": cfg.dit.num_layers}}
    except CheckpointError as exc:
        report.missing.append(f"config: {exc}")
    try:
        _, shapes, dtypes = read_shapes(folder)
        report.tensors = len(shapes)
        report.weight_dtypes = sorted(str(SAFETENSORS_DTYPES[d]).removeprefix("torch.") if d in SAFETENSORS_DTYPES
                                      else d.lower() for d in dtypes)     # as the pi family's report names them
        if cfg is not None:
            ignored = check_names(shapes, cfg, str(folder))
            if ignored:
                report.notes.append(f"{len(ignored)} tensors known and unused are not loaded (the SigLIP2 pooling "
                                    "head, LLM layers past select_layer, the tied lm_head)")
    except CheckpointError as exc:
        report.missing.append(f"weights: {exc}")
    _inspect_embodiments(report, folder, cfg, embodiment)
    try:
        report.tokenizer = str(find_tokenizer(folder, tokenizer))
    except CheckpointError as exc:
        report.missing.append(f"tokenizer: {exc}")
    absent = [what for module, what in GROOT_MODULES.items() if not _installed(module)]
    if absent:
        report.missing.append(f"libraries: GR00T N1.6 needs {' and '.join(absent)}, not installed")
    return report


def _inspect_embodiments(report, folder: Path, cfg, embodiment: str | None) -> None:
    report.embodiments = []
    if cfg is None:
        return
    try:
        stats = json.loads((folder / STATISTICS_FILE).read_text())
        report.statistics = f"{folder / STATISTICS_FILE}: {sorted(stats)}"
    except (OSError, json.JSONDecodeError, TypeError):
        stats = None
    tags = [embodiment] if embodiment else _candidate_tags(folder, stats)
    failures = []
    for tag in tags:
        try:
            emb = load_embodiment(folder, tag, cfg.max_state_dim, cfg.max_action_dim,
                                  max_num_embodiments=cfg.max_num_embodiments)
        except CheckpointError as exc:
            failures.append(str(exc))
            continue
        report.embodiments.append({
            "tag": emb.tag, "id": emb.id, "views": list(emb.views), "action_horizon": emb.action_horizon,
            "state": [[g.name, g.dim] for g in emb.state], "action": [[g.name, g.dim] for g in emb.action]})
    if embodiment or not report.embodiments:
        report.missing += failures or [f"embodiments: {folder / PROCESSOR_FILE} describes none"]
    else:
        report.notes += [f"not servable: {line}" for line in failures]


def format_groot(report) -> list[str]:
    """The model and embodiment lines of the text report (checkpoint_inspect.format_inspection adds the rest)."""
    lines = []
    if report.model:
        m = report.model
        lines += [f"model:      {m['config']} ({m['model_type']}, preset from {m['preset_from']}), horizon "
                  f"{m['action_horizon']}, {m['num_steps']} steps, widths {m['widths']}, layers {m['layers']}",
                  f"robot:      state up to {m['max_state_dim']}, actions up to {m['max_action_dim']} values, "
                  f"{m['max_num_embodiments']} embodiment slots"]
    for e in report.embodiments or []:
        groups = lambda gs: ", ".join(f"{name} {dim}" for name, dim in gs)  # noqa: E731
        lines.append(f"embodiment: {e['tag']} (id {e['id']}): views {e['views']}, state [{groups(e['state'])}], "
                     f"action [{groups(e['action'])}]"
                     + (f", horizon {e['action_horizon']}" if e["action_horizon"] else ""))
    return lines

