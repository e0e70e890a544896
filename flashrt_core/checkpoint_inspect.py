"""flashrt-inspect DIR: what a checkpoint folder is, the model it holds, its dimensions and statistics, and what
is missing to load it (each with how to supply it). Reads the config, the statistics and the tensor names and
shapes; no tensor data. pi0 / pi0.5 / pi0-FAST folders here, GR00T N1.6 folders in groot_inspect.py.

CLI:  flashrt-inspect DIR|HUB_ID [--config PRESET] [--asset-id ID] [--tokenizer PATH] [--embodiment TAG] [--json]
Exit status 0 when load_model can load the folder as it is, 1 when something is missing or wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

from flashrt_core import hub, normalization
from flashrt_core.api import SUPPLY_TOKENIZER, tokenizer_candidates
from flashrt_core.checkpoint import check_weights, open_tensors
from flashrt_core.checkpoint_config import FLASHRT_CONFIG_FILE, declares_no_stats, fit_robot_dims, resolve_config
from flashrt_core.checkpoint_layout import DESCRIPTIONS, Layout, detect_layout
from flashrt_core.config import ModelType
from flashrt_core.errors import CheckpointError
from flashrt_core.groot_checkpoint import is_groot_checkpoint
from flashrt_core.model.groot.config import is_groot_config


# What a layout does not record of the config (checkpoint_config's resolution order).
UNRECORDED = {Layout.OPENPI_JAX: "action_horizon or prompt mode", Layout.SAFETENSORS: "action_horizon or prompt mode",
              Layout.OPENPI_PYTORCH: "prompt mode (openpi's discrete_state_input)"}


@dataclasses.dataclass
class Inspection:
    """What flashrt-inspect reports; `missing` holds one line per problem, each saying how to fix it."""

    checkpoint: str
    folder: str
    layout: str | None = None
    layout_description: str | None = None
    model: dict | None = None
    tensors: int | None = None
    weight_dtypes: list[str] | None = None
    statistics: str | None = None
    state_dim_stats: int | None = None
    action_dim_stats: int | None = None
    tokenizer: str | None = None
    missing: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    family: str = "pi"                     # "pi" (pi0, pi0.5, pi0-FAST) or "groot" (GR00T N1.6)
    embodiments: list[dict] | None = None  # GR00T: the embodiments the folder can serve

    @property
    def ready(self) -> bool:
        return not self.missing


def inspect_checkpoint(checkpoint: str | Path, config: str | None = None, asset_id: str | None = None,
                       tokenizer: str | Path | None = None, embodiment: str | None = None) -> Inspection:
    """Inspect a folder or hub id; problems land in Inspection.missing instead of raising (except a folder that
    cannot be found at all). A GR00T N1.6 folder (or config naming a GR00T preset) goes to groot_inspect, where
    `embodiment` is the tag to check (None: every one the folder describes); asset_id is the pi family's."""
    folder = hub.checkpoint_path(checkpoint)
    report = Inspection(str(checkpoint), str(folder))
    if is_groot_config(config) or (config is None and folder.is_dir() and is_groot_checkpoint(folder)):
        from flashrt_core.groot_inspect import inspect_groot
        return inspect_groot(report, folder, config, tokenizer, embodiment)
    layout = detect_layout(folder)
    report.layout, report.layout_description = layout.value, DESCRIPTIONS[layout]
    if config is None and layout in UNRECORDED:
        report.notes.append(f"{layout.value} records no {UNRECORDED[layout]}: the preset's are assumed below; "
                            "if the training config differs, give its values with `flashrt-convert SRC DST --set "
                            "action_horizon=N --set prompt_mode=no_state` (openpi's pi05_libero: no_state)")
    cfg = explicit = None
    try:
        cfg, explicit = resolve_config(config, folder)
    except CheckpointError as exc:
        report.missing.append(f"config: {exc}")
    stats = None
    try:
        location = normalization.locate_norm_stats(folder, asset_id)
        report.statistics = location.note
        stats = normalization.load_norm_stats(folder, asset_id)
        if stats is None and declares_no_stats(folder):
            report.statistics += f" ({FLASHRT_CONFIG_FILE} declares none: the policy runs unnormalized)"
        elif stats is None:
            report.missing.append(f"statistics: {location.note}. To supply them, {normalization.SUPPLY_STATS}")
        else:
            report.state_dim_stats = None if stats.state is None else stats.state.dim
            report.action_dim_stats = None if stats.actions is None else stats.actions.dim
    except CheckpointError as exc:
        report.missing.append(f"statistics: {exc}")
    if cfg is not None:
        try:
            cfg = fit_robot_dims(cfg, stats, explicit, folder)
            report.model = _model_summary(cfg)
        except CheckpointError as exc:
            report.missing.append(f"config: {exc}")
    try:
        with open_tensors(folder) as f:
            keys = f.keys()
            report.tensors = len(keys)
            report.weight_dtypes = sorted({str(f.dtype(k)).removeprefix("torch.") for k in keys})
        if cfg is not None:
            check_weights(folder, cfg)
    except CheckpointError as exc:
        report.missing.append(f"weights: {exc}")
    if tokenizer is not None:
        report.tokenizer = str(tokenizer) if Path(tokenizer).is_file() else None
    else:
        report.tokenizer = next((str(p) for p in tokenizer_candidates(folder) if p.is_file()), None)
    if report.tokenizer is None:
        tried = [str(tokenizer)] if tokenizer is not None else [str(p) for p in tokenizer_candidates(folder)]
        report.missing.append(f"tokenizer: not found (tried {', '.join(tried)}). {SUPPLY_TOKENIZER}")
    if cfg is not None and cfg.model_type == ModelType.PI0_FAST:
        from flashrt_core.pi0_fast_policy import find_fast_tokenizer
        try:
            report.notes.append(f"pi0-FAST: FAST tokenizer {find_fast_tokenizer(folder)}, greedy decoding of at "
                                f"most {cfg.fast.max_decoding_steps} tokens (the steps and expert width above "
                                "are unused)")
        except CheckpointError as exc:
            report.missing.append(str(exc))
    return report


def _model_summary(cfg) -> dict:
    return {"config": cfg.name, "model_type": cfg.model_type.value, "action_horizon": cfg.action_horizon,
            "state_dim": cfg.state_dim, "action_dim": cfg.action_dim, "max_action_dim": cfg.max_action_dim,
            "views": list(cfg.view_names), "prompt_mode": cfg.prompt_mode.value, "norm_mode": cfg.norm_mode.value,
            "max_token_len": cfg.max_token_len, "num_steps": cfg.num_steps,
            "widths": {"vision": cfg.vision.width, "paligemma": cfg.paligemma.width, "expert": cfg.expert.width}}


def format_inspection(report: Inspection) -> str:
    lines = [f"checkpoint: {report.checkpoint}"]
    if report.folder != report.checkpoint:
        lines.append(f"folder:     {report.folder}")
    lines.append(f"layout:     {report.layout} ({report.layout_description})")
    if report.family == "groot":
        from flashrt_core.groot_inspect import format_groot
        lines += format_groot(report)
    elif report.model:
        m = report.model
        lines += [f"model:      {m['config']} ({m['model_type']}), horizon {m['action_horizon']}, "
                  f"{m['num_steps']} steps, widths {m['widths']}",
                  f"robot:      state_dim {m['state_dim']}, action_dim {m['action_dim']} "
                  f"(padded to {m['max_action_dim']})",
                  f"inputs:     views {m['views']}, prompt {m['prompt_mode']} (max {m['max_token_len']} tokens), "
                  f"normalization {m['norm_mode']}"]
    if report.tensors is not None:
        lines.append(f"weights:    {report.tensors} tensors, {'/'.join(report.weight_dtypes)}")
    dims = [f"{k} {v}" for k, v in (("state", report.state_dim_stats), ("actions", report.action_dim_stats)) if v]
    lines.append(f"statistics: {report.statistics}" + (f" ({', '.join(dims)})" if dims else ""))
    lines.append(f"tokenizer:  {report.tokenizer or 'missing'}")
    lines += [f"note:       {note}" for note in report.notes]
    if report.ready and report.family == "groot":
        lines.append("ready:      yes (load_model(DIR, embodiment=TAG) with a tag above)")
    elif report.ready:
        lines.append("ready:      yes (flashrt-convert SRC DST makes it one self-contained folder)")
    else:
        lines.append(f"missing ({len(report.missing)}):")
        lines += [f"  - {line}" for line in report.missing]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashrt-inspect", description=(
        "Say what a pi0 / pi0.5 / pi0-FAST or GR00T N1.6 checkpoint folder (or hub id) is: layout, model, "
        "dimensions, statistics (GR00T: embodiments), and what is missing to load it. Exit status 0 when it loads "
        "as it is."))
    parser.add_argument("checkpoint", help="checkpoint folder or hub id (org/name[@revision])")
    parser.add_argument("--config", help="preset name to check the weights against instead of the folder's")
    parser.add_argument("--asset-id", help="which assets/<asset_id>/norm_stats.json of an openpi checkpoint")
    parser.add_argument("--tokenizer", help="the tokenizer you would pass to load_model (pi: PaliGemma's "
                        "tokenizer.model; GR00T: Eagle's tokenizer folder or tokenizer.json)")
    parser.add_argument("--embodiment", help="GR00T: the embodiment tag to check (default: every one the folder "
                        "describes)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        report = inspect_checkpoint(args.checkpoint, args.config, args.asset_id, args.tokenizer,
                                    args.embodiment)
    except CheckpointError as exc:
        print(f"flashrt-inspect: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**dataclasses.asdict(report), "ready": report.ready}, indent=2))
    else:
        print(format_inspection(report))
    return 0 if report.ready else 1


if __name__ == "__main__":
    sys.exit(main())
