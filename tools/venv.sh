# Sourced by tools/bootstrap.sh, tools/run_tests.sh and tools/run_demo.sh: the venv they use, in one place.
# FLASHRT_DEPENDENCIES=pinned (default): .venv, with the versions of tools/constraints.txt;
# FLASHRT_DEPENDENCIES=newest: .venv-newest, with the newest releases tools/requirements-venv.txt admits;
# FLASHRT_VENV overrides the folder.
DEPENDENCIES="${FLASHRT_DEPENDENCIES:-pinned}"
case "$DEPENDENCIES" in
  pinned) VENV="${FLASHRT_VENV:-$REPO/.venv}";;
  newest) VENV="${FLASHRT_VENV:-$REPO/.venv-newest}";;
  *) printf 'FLASHRT_DEPENDENCIES=%s: use pinned (tools/constraints.txt) or newest\n' "$DEPENDENCIES" >&2; exit 2;;
esac
