"""devcluster's tests on the session's cluster of real nodes (the ``real_cluster`` fixture,
shared with tests/e2e): ``scripts/run-suites.sh`` runs them in the real-node session. A test
that brings up a cluster of its own lives beside this package."""
