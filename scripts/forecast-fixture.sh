#!/usr/bin/env bash
# Regenerate forecaster/pretrained: the default LSTM, trained deterministically (seed
# forecast.seed, forecast.threads torch threads, on the CPU) on the default data set, exactly as
# `llmsla forecast dataset && llmsla forecast train` make it. The online test
# (tests/forecaster/test_online.py) runs it through the store, the scorer and the alerts; rerun
# this when the features, the model or the data set change (the artifact then no longer loads or
# no longer matches), and commit the result. Takes minutes on two cores (most of it training).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$VENV/bin/llmsla" forecast dataset --out "$WORK/dataset.npz"
"$VENV/bin/llmsla" forecast train --data "$WORK/dataset.npz" --out "$WORK/model"
rm -rf forecaster/pretrained
mkdir -p tests/forecaster/fixtures
cp -r "$WORK/model" forecaster/pretrained
echo "fixture: forecaster/pretrained ($(du -sh forecaster/pretrained | cut -f1))"
