"""flashrt-inspect on GR00T N1.6 folders: what a random-weight fixture in the released layout reports (preset,
sizes, weights, every embodiment it serves, tokenizer), and how each missing or wrong part is named, GR00T's
libraries included: the inspection itself needs neither transformers nor Pillow. flashrt-convert says that such
a folder loads as it is."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from checked_run import failure_report

from flashrt_core.checkpoint_inspect import inspect_checkpoint
from flashrt_core.checkpoint_inspect import main as inspect_main
from flashrt_core.groot_fixtures import write_random_groot_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def groot_folder(tmp_path_factory) -> Path:
    return write_random_groot_checkpoint(tmp_path_factory.mktemp("groot") / "tiny")


def copy_without(folder: Path, tmp_path: Path, *names: str) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(folder, out)
    for name in names:
        (out / name).unlink()
    return out


def test_a_released_layout_folder_is_ready_and_described(groot_folder, capsys):
    assert inspect_main([str(groot_folder)]) == 0
    out = capsys.readouterr().out
    assert "layout:     groot_n1.6" in out
    assert "model:      groot_n1.6_tiny (Gr00tN1d6, preset from config.json's flashrt_preset), horizon 16" in out
    assert ("embodiment: new_embodiment (id 10): views ['front', 'wrist'], state [single_arm 5, gripper 1], "
            "action [single_arm 5, gripper 1]") in out
    assert f"tokenizer:  {groot_folder / 'tokenizer.json'}" in out
    assert "ready:      yes" in out
    report = inspect_checkpoint(groot_folder)
    assert report.family == "groot" and report.ready and report.tensors > 100
    assert [e["tag"] for e in report.embodiments] == ["new_embodiment"]


def test_missing_statistics_and_tokenizer_are_named(groot_folder, tmp_path, capsys):
    folder = copy_without(groot_folder, tmp_path, "statistics.json", "tokenizer.json")
    assert inspect_main([str(folder), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["family"] == "groot" and not report["ready"] and report["embodiments"] == []
    assert any("statistics.json is missing" in line for line in report["missing"])
    assert any(line.startswith("tokenizer: GR00T tokenizer not found") and "Eagle-Block2A-2B-v2" in line
               for line in report["missing"])


def test_an_embodiment_the_folder_cannot_serve_is_named(groot_folder):
    report = inspect_checkpoint(groot_folder, embodiment="gr1")
    assert not report.ready and report.embodiments == []
    assert any("'gr1'" in line and "fine-tuned for ['new_embodiment']" in line for line in report.missing)


def test_a_config_json_that_does_not_fit_the_preset_is_named(groot_folder):
    report = inspect_checkpoint(groot_folder, config="groot_n1.6")
    assert report.model is None and not report.ready
    (config,) = [line for line in report.missing if line.startswith("config:")]
    assert "must equal llm.width=2048" in config


def test_a_mis_shaped_tensor_is_named(groot_folder, tmp_path):
    from safetensors.torch import load_file, save_file
    folder = copy_without(groot_folder, tmp_path)
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    tensors = load_file(shard)
    name = next(n for n, t in tensors.items() if t.ndim == 2 and t.shape[0] != t.shape[1])
    tensors[name] = tensors[name].t().contiguous()
    save_file(tensors, shard, metadata={"format": "pt"})
    report = inspect_checkpoint(folder)
    (weights,) = [line for line in report.missing if line.startswith("weights:")]
    assert "shape mismatches" in weights and name in weights
    assert report.embodiments and report.tensors == inspect_checkpoint(groot_folder).tensors


@pytest.mark.parametrize("missing", ["transformers", "PIL"])
def test_inspection_runs_without_gr00t_libraries_and_names_them(groot_folder, missing):
    code = (f"import sys\nsys.modules[{missing!r}] = None\n"
            "from flashrt_core.checkpoint_inspect import main\n"
            f"sys.exit(main([{str(groot_folder)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert done.returncode == 1, failure_report(done)
    from flashrt_core.api import GROOT_MODULES
    assert f"libraries: GR00T N1.6 needs {GROOT_MODULES[missing]}, not installed" in done.stdout
    assert "embodiment: new_embodiment (id 10)" in done.stdout and "Traceback" not in done.stderr


def test_convert_says_a_gr00t_folder_loads_as_it_is(groot_folder, tmp_path, capsys):
    from flashrt_core.checkpoint_convert import main as convert_main
    assert convert_main([str(groot_folder), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "is a GR00T N1.6 checkpoint: load_model reads its released layout as it is" in err
    assert "flashrt-inspect DIR" in err and not (tmp_path / "out").exists()


def _set(path: list[str], value):
    def mutate(data):
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return data
    return mutate


MALFORMED = {   # file, how its JSON is changed, what the error says
    "ids not an object": ("embodiment_id.json", lambda d: [1, 2], "(embodiment ids) must be a JSON object, got list"),
    "an id not an integer": ("embodiment_id.json", lambda d: {"new_embodiment": "10"},
                             "embodiment 'new_embodiment' has id '10'; ids are non-negative integers"),
    "an id beyond the model's slots": ("embodiment_id.json", lambda d: {"new_embodiment": 40},
                                       "embodiment 'new_embodiment' has id 40, beyond the model's "
                                       "max_num_embodiments=32"),
    "processor_kwargs a list": ("processor_config.json", lambda d: {"processor_kwargs": []},
                                "processor_kwargs must be a JSON object, got list"),
    "a modality a list": ("processor_config.json",
                          _set(["processor_kwargs", "modality_configs", "new_embodiment", "video"], ["front"]),
                          "embodiment 'new_embodiment' has an entry of an unexpected type"),
    "an embodiment's statistics a list": ("statistics.json", lambda d: {"new_embodiment": [1]},
                                          "statistics of embodiment 'new_embodiment' must be a JSON object"),
    "weight_map a list": ("model.safetensors.index.json", lambda d: {"weight_map": [1]},
                          "'weight_map' must map tensor names to shard file names"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_processor_or_index_file_is_named(groot_folder, tmp_path, case):
    from flashrt_core import load_model
    from flashrt_core.errors import CheckpointError
    name, mutate, says = MALFORMED[case]
    folder = copy_without(groot_folder, tmp_path)
    (folder / name).write_text(json.dumps(mutate(json.loads((folder / name).read_text()))))
    with pytest.raises(CheckpointError, match=re.escape(says)):
        load_model(folder, embodiment="new_embodiment", device="cpu")
    report = inspect_checkpoint(folder)
    assert not report.ready and any(says in line for line in report.missing), report.missing


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("kind", ["state", "action"])
def test_non_finite_statistics_are_refused(groot_folder, tmp_path, kind, bad):
    """NaN or inf bounds would turn every action into NaN; the load refuses them, naming the group."""
    from flashrt_core import load_model
    from flashrt_core.errors import CheckpointError
    folder = copy_without(groot_folder, tmp_path)
    stats = json.loads((folder / "statistics.json").read_text())
    stats["new_embodiment"][kind]["single_arm"]["max"][1] = bad
    (folder / "statistics.json").write_text(json.dumps(stats))
    says = f"statistics of embodiment 'new_embodiment', {kind} group 'single_arm' has non-finite values"
    with pytest.raises(CheckpointError, match=re.escape(says)):
        load_model(folder, embodiment="new_embodiment", device="cpu")
    assert any(says in line for line in inspect_checkpoint(folder).missing)
