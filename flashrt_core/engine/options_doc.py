"""docs/engine_options.md, generated from the options' own metadata (engine/options.py).

    python -m flashrt_core.engine.options_doc            # print it
    python -m flashrt_core.engine.options_doc --write    # rewrite docs/engine_options.md
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .options import PRODUCT_ENVIRONMENT, EngineOptions, env_name

DOC = Path(__file__).resolve().parents[2] / "docs" / "engine_options.md"


def options_markdown() -> str:
    """docs/engine_options.md: every EngineOptions field and every other FLASHRT_* variable the product reads."""
    lines = ["# Engine options and environment variables", "",
             "Generated from `flashrt_core/engine/options.py` (`python -m flashrt_core.engine.options_doc "
             "--write`); a test keeps this file equal to it.", "",
             "`EngineOptions(field=value)` sets an option in code (`load_model(engine_options=...)`, "
             "`flashrt_core.engine.build_executor`); `EngineOptions.from_env(options)` puts the environment on top. "
             "`build_executor` and `load_model` apply the environment once, to the defaults, when given no "
             "options; the ROS node applies it to its parameters' options. Boolean variables take 0 or 1.", "",
             "| option | variable | default | what it does | off |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(EngineOptions):
        default = f.default
        if isinstance(default, tuple):
            default = ",".join(map(str, default))
        elif isinstance(default, bool):
            default = int(default)
        elif default is None:
            default = "{}"
        lines.append(f"| `{f.name}` | `{env_name(f.name)}` | `{default}` | {f.metadata['what']} | "
                     f"{f.metadata['off']} |")
    lines += ["", "Product variables outside the engine:", "", "| variable | default | what it does |",
              "|---|---|---|"]
    lines += [f"| `{v.name}` | `{v.default}` | {v.what} |" for v in PRODUCT_ENVIRONMENT]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite {DOC} instead of printing it")
    args = ap.parse_args(argv)
    if args.write:
        DOC.write_text(options_markdown())
    else:
        print(options_markdown(), end="")


if __name__ == "__main__":
    main()
