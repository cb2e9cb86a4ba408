#!/usr/bin/env bash
# Runs every optimizer benchmark (issue 6 item 6) and writes bench/results/*.csv and *.png.
#   bench/run_all.sh            full modes (each script about 5-10 min of one core; see bench/README.md)
#   bench/run_all.sh --quick    tiny budgets (about a minute in all), results named *_quick.*
# Extra arguments are passed to every script (e.g. --no-plot, --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
for script in eval_throughput strong_scaling weak_scaling ablations stability convergence enumeration; do
  echo "== bench/${script}.py $*"
  start=$(date +%s)
  "$PY" "bench/${script}.py" "$@"
  echo "== bench/${script}.py took $(( $(date +%s) - start )) s"
done
