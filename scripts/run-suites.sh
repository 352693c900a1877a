#!/usr/bin/env bash
# The README's test suites, as two pytest sessions side by side:
#   - the cluster suites (tests/devcluster, tests/e2e): devcluster's clusters, mostly waiting on
#     kubelets, containers and pods; their output goes to .logs/cluster-suites.log and is
#     printed when both sessions are done;
#   - unit and integration (tests/unit, tests/integration): CPU-bound, no cluster; at a lower
#     priority (nice), so that the clusters' kubelets, operator and pods, the longer session,
#     get the CPU when they need it and these tests fill the rest.
# Each session tears its clusters down when it ends, so none idles through the other suites.
# Each prints its slowest tests and writes every test's time to .logs/<suite>.xml (JUnit XML);
# the script fails if either session fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .logs
LOG=.logs/cluster-suites.log
started=$(date +%s)
"$PY" -m pytest -q --durations=10 --junitxml=.logs/cluster-suites.xml tests/devcluster tests/e2e "$@" >"$LOG" 2>&1 &
clusters=$!
nice -n 10 "$PY" -m pytest -q --durations=10 --junitxml=.logs/unit-integration.xml \
    tests/unit tests/integration "$@"
units=$?
echo "==> unit and integration: exit $units after $(( $(date +%s) - started )) s"
wait "$clusters"
cluster_status=$?
echo "==> the cluster suites (tests/devcluster, tests/e2e; $LOG):"
cat "$LOG"
echo "==> the cluster suites: exit $cluster_status after $(( $(date +%s) - started )) s"
[ "$units" -eq 0 ] && [ "$cluster_status" -eq 0 ]
