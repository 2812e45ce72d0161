#!/usr/bin/env bash
# Run the test suite. pytest exits 5 when it collected no test: for this project that means the
# suite is broken (a bad path or an import error hidden by a filter), so it is a failure too.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
# the dashboard type-check's npm packages (no-op when .tools/ already has the pinned versions)
"$VENV/bin/python" -m llmsla.dashboards.typecheck install || exit 1
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=15 "$@"
rc=$?
if [[ $rc -eq 5 ]]; then
  echo "run-tests: pytest collected no tests; treating as failure" >&2
  exit 1
fi
exit $rc
