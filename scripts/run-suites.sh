#!/usr/bin/env bash
# The README's test suites and the lint step, side by side (a 2-core machine; the longest
# session sets the time, see docs/development.md):
#   - the end-to-end suite (tests/e2e): the operator on one cluster of real nodes for the
#     session, mostly waiting on kubelets, containers and pods; output in
#     .logs/cluster-suites.log, printed when all is done;
#   - unit and integration (tests/unit, tests/integration): CPU-bound, no cluster;
#   - tests/devcluster (on process nodes, the images, then on a real-node cluster of its own,
#     and one more brought down after a crash) and the chart's template tests: mostly waiting
#     on their clusters and builds, done long before the others; output in
#     .logs/devcluster.log, printed when all is done;
#   - the lint step (make lint): output in .logs/lint.log, printed when all is done.
# All but the end-to-end suite run at a lower priority (nice), so that its kubelets, operator
# and pods get the CPU when they need it and the others fill the rest: unit and integration,
# which take the longest, at nice 5, the devcluster session and the lint step (done early) at
# nice 10.
# A test marked quiet runs while the other sessions' tests wait (its checks depend on the
# machine's load). Each pytest session tears its clusters down when it ends, prints its slowest
# tests and writes every test's time to .logs/<suite>.xml (JUnit XML); the script fails if
# any step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# Keep the bytecode of the project's modules and of the tests: every worker process a test
# starts imports the runtime, and every session collects the tests (an environment that says
# not to write bytecode made each of them compile the sources again: 0.07 CPU-s a worker,
# 3.5 CPU-s a collection).
unset PYTHONDONTWRITEBYTECODE
mkdir -p .logs
CLUSTER_LOG=.logs/cluster-suites.log
LINT_LOG=.logs/lint.log
DEVCLUSTER_LOG=.logs/devcluster.log
# The real-node tests last: by then the images are built (by either session) and the seed made.
DEVCLUSTER=(tests/devcluster/test_*.py tests/e2e/test_helm_chart.py tests/devcluster/real_nodes)
# The real-node clusters' address blocks (10.<16 + net>.x.y), one per session and a next one
# for the devcluster session's cluster that is brought down after a crash
# (tests/support/cluster_fixtures.py); from this script's PID, so that two runs on one machine
# are unlikely to meet.
E2E_REAL_NET=$(( 20 + $$ % 50 * 4 ))
started=$(date +%s)
# Tests marked quiet run while the other session's tests wait (tests/support/quiet_gate.py).
ELASTICJOB_QUIET_GATE=$(mktemp -d)
export ELASTICJOB_QUIET_GATE
trap 'rm -rf "$ELASTICJOB_QUIET_GATE"' EXIT
since() { echo "$(( $(date +%s) - started )) s"; }
# Run a session and write when it ended (seconds since the start) to .logs/<name>.ended.
timed() {
    local name=$1 status=0
    shift
    "$@" || status=$?
    since >".logs/$name.ended"
    return "$status"
}
# The machine's CPU time so far, busy and in all (jiffies of /proc/stat's first line).
cpu_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
cpu_all() { awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
busy_at_start=$(cpu_busy) all_at_start=$(cpu_all)

DEVCLUSTER_REAL_TEST_NET=$E2E_REAL_NET \
    timed cluster-suites "$PY" -m pytest -q --durations=10 --junitxml=.logs/cluster-suites.xml \
    tests/e2e --ignore=tests/e2e/test_helm_chart.py "$@" \
    >"$CLUSTER_LOG" 2>&1 &
clusters=$!
DEVCLUSTER_REAL_TEST_NET=$(( E2E_REAL_NET + 1 )) \
    timed devcluster nice -n 10 "$PY" -m pytest -q --durations=5 --junitxml=.logs/devcluster.xml \
    "${DEVCLUSTER[@]}" "$@" >"$DEVCLUSTER_LOG" 2>&1 &
devcluster=$!
nice -n 10 make --no-print-directory lint >"$LINT_LOG" 2>&1 &
lint=$!

nice -n 5 "$PY" -m pytest -q --durations=10 --junitxml=.logs/unit-integration.xml \
    tests/unit tests/integration "$@"
units=$?
echo "==> unit and integration: exit $units after $(since)"

wait "$lint"
lint_status=$?
echo "==> lint ($LINT_LOG):"
cat "$LINT_LOG"
echo "==> lint: exit $lint_status"
wait "$devcluster"
devcluster_status=$?
echo "==> tests/devcluster and the chart ($DEVCLUSTER_LOG):"
cat "$DEVCLUSTER_LOG"
echo "==> tests/devcluster and the chart: exit $devcluster_status after $(cat .logs/devcluster.ended)"
wait "$clusters"
cluster_status=$?
echo "==> the end-to-end suite (tests/e2e; $CLUSTER_LOG):"
cat "$CLUSTER_LOG"
echo "==> the end-to-end suite: exit $cluster_status after $(cat .logs/cluster-suites.ended)"
echo "==> the machine's CPU: $(( ($(cpu_busy) - busy_at_start) / $(getconf CLK_TCK) )) s busy of" \
    "$(( ($(cpu_all) - all_at_start) / $(getconf CLK_TCK) )) s ($(nproc) cores)"
[ "$units" -eq 0 ] && [ "$devcluster_status" -eq 0 ] && [ "$lint_status" -eq 0 ] \
    && [ "$cluster_status" -eq 0 ]
