#!/usr/bin/env bash
# Run the test suite. pytest exits 5 when it collected no test: for this project that means the
# suite is broken (a bad path or an import error hidden by a filter), so it is a failure too.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
# the dashboard type-check's npm packages (no-op when .tools/ already has the pinned versions)
"$VENV/bin/python" -m llmsla.dashboards.typecheck install || exit 1
# Tests run in TEST_WORKERS processes (pytest-xdist; default 3; 0: one process, in order). Most
# of the suite's wall time is waiting on the services it starts (PostgreSQL, Flink, the demo's
# real workers), so three processes finish in about half the time even on two cores; each worker
# has its own embedded PostgreSQL and temporary tree, work-stealing evens out the long tests, and
# a test marked `exclusive` (a latency the machine gives it) runs with nothing beside it.
WORKERS="${TEST_WORKERS:-3}"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=15 -n "$WORKERS" --dist worksteal "$@"
rc=$?
if [[ $rc -eq 5 ]]; then
  echo "run-tests: pytest collected no tests; treating as failure" >&2
  exit 1
fi
exit $rc
