#!/usr/bin/env bash
# Prepare a fresh machine: system services the tests and demo run for real (installed with apt
# when missing and running as root, otherwise printed), then a venv with llmsla installed
# editable with its dev extra. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v prometheus-alertmanager >/dev/null || command -v alertmanager >/dev/null || need_apt+=(prometheus-alertmanager)
command -v redis-server >/dev/null || need_apt+=(redis-server)
# dashboards: tsc + @grafana/schema (npm) type-check the JSON; headless Chromium opens the report
command -v npm >/dev/null || need_apt+=(nodejs npm)
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || need_apt+=(chromium)
if ((${#need_apt[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "bootstrap: installing ${need_apt[*]} with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "bootstrap: missing system packages: ${need_apt[*]}" >&2
    echo "bootstrap: install them, e.g.: sudo apt-get install ${need_apt[*]}" >&2
    exit 1
  fi
fi
# Debian starts these as system services on install; llmsla runs its own instances on free
# ports, so stop the packaged ones to keep the machine quiet (ignore where there is no systemd).
for svc in prometheus prometheus-alertmanager redis-server prometheus-node-exporter; do
  (command -v systemctl >/dev/null && systemctl stop "$svc" 2>/dev/null) || true
done

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "bootstrap: $PYTHON is $("$PYTHON" --version 2>&1); llmsla needs Python >= 3.11 (set PYTHON=...)" >&2
  exit 1
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "bootstrap: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
echo "bootstrap: pip install -e '.[dev]' (first time: a few minutes)"
"$VENV/bin/python" -m pip install -q -e '.[dev]'
echo "bootstrap: npm packages for the dashboard type-check into .tools/ (pinned in dashboards/typecheck.py)"
"$VENV/bin/python" -m llmsla.dashboards.typecheck install
echo "bootstrap: pinned kubectl (kustomize) into .tools/bin for the offline manifest checks (llmsla/app/k8s/kubectl.py)"
"$VENV/bin/python" -m llmsla.app.k8s.kubectl install >/dev/null
echo "bootstrap: ok"
