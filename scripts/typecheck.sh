#!/usr/bin/env bash
# mypy over the whole llmsla package, as it is installed.
#
# Why a script: pyproject maps llmsla.exporters -> exporters/, llmsla.control -> control/ and so on
# (tool.setuptools.package-dir). mypy's finder knows nothing of that mapping, so `mypy exporters`
# would check `exporters` as a top-level module and every cross-import would turn into Any. This
# builds a throwaway tree of symlinks laid out like the installed package, checks `-p llmsla` there,
# and rewrites the error paths back to the repository's (exporters/gateway.py:12: error: ...).
# Exits with mypy's status: 0 clean, 1 type errors, 2 a crash or bad usage.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-${VENV:-$ROOT/.venv}/bin/python}"
# absolute (the check runs from a temporary directory): a relative path as make passes it, or a
# bare name on PATH; the venv's own path is kept, not the interpreter it links to
case "$PY" in
  /*) ;;
  */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;
  *) PY="$(command -v "$PY")" ;;
esac
TREE="$(mktemp -d)"
trap 'rm -rf "$TREE"' EXIT

# the mapping, read from pyproject so there is one list: "llmsla.exporters exporters" lines
MAPPING="$("$PY" - "$ROOT/pyproject.toml" <<'PYEOF'
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
for package, folder in dirs.items():
    if package.count(".") == 1 and package != folder:
        print(package.split(".", 1)[1], folder)
PYEOF
)"

mkdir "$TREE/llmsla"
for entry in "$ROOT"/llmsla/* "$ROOT"/llmsla/.[!.]*; do
  [ -e "$entry" ] && ln -s "$entry" "$TREE/llmsla/$(basename "$entry")"
done
SED_ARGS=()
while read -r sub folder; do
  [ -n "$sub" ] || continue
  ln -s "$ROOT/$folder" "$TREE/llmsla/$sub"
  SED_ARGS+=(-e "s#^llmsla/$sub/#$folder/#")
done <<< "$MAPPING"

cd "$TREE"
set +e
"$PY" -m mypy --config-file "$ROOT/pyproject.toml" --cache-dir "$ROOT/.mypy_cache" \
  -p llmsla "$@" 2>&1 | sed "${SED_ARGS[@]}"
status=${PIPESTATUS[0]}
set -e
exit "$status"
