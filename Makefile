# The two commands the README starts with are `make demo` and `make test`.
PY := .venv/bin/python
# The set-up runs as quiet stages: a line each on the terminal, the tools' output in .logs/.
STAGE := python3 -m devcluster.stages

.PHONY: venv prereqs demo demo-fast demo-local test lint unit integration devcluster-tests bench gpu-check clean

venv: .venv/.installed
.venv/.installed: pyproject.toml scripts/setup-venv.sh
	@$(STAGE) "the virtual environment: torch (CPU build) and the project, with pip" \
		.logs/venv.log -- bash scripts/setup-venv.sh
	@touch $@

# etcd, the Kubernetes binaries of the control plane and of real nodes (built once per machine
# and cached outside the checkout: the first run takes about 10 minutes, see README.md) and helm.
prereqs:
	@$(STAGE) "devcluster's prerequisites: Debian packages, Kubernetes built from source (about 10 minutes the first time, cached after), helm" \
		.logs/prereqs.log -- bash scripts/devcluster-prereqs.sh

# The ElasticJob operator on a real Kubernetes cluster on this machine (devcluster): real
# nodes (kubelet, containerd, the project's images).
demo: venv prereqs
	@$(PY) examples/digits/cluster_demo.py

# The same on process nodes (pods as host processes): quicker to start, no containers.
demo-fast: venv prereqs
	@$(PY) examples/digits/cluster_demo.py --runtime process

# The same training under the local launcher, without Kubernetes.
demo-local: venv
	$(PY) examples/digits/demo.py

# mypy's cache lives outside the checkout, as the Kubernetes build does: a fresh clone checks
# only what changed (torch's stubs and the unchanged modules come from the cache; mypy compares
# each file's hash before it trusts its entry). Cold, the check costs about 35 CPU-seconds.
MYPY_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/elasticjob/mypy

lint: venv
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy --cache-dir "$(MYPY_CACHE)"
	.venv/bin/mypy --cache-dir "$(MYPY_CACHE)" devcluster
	.venv/bin/lint-imports
	$(PY) scripts/check_modules.py

unit: venv
	$(PY) -m pytest tests/unit -q

integration: venv
	$(PY) -m pytest tests/integration -q

devcluster-tests: venv prereqs
	$(PY) -m pytest tests/devcluster -q

# The lint step and three pytest sessions side by side (scripts/run-suites.sh): the
# end-to-end suite, unit with integration, and the devcluster session.
test: venv prereqs
	@PY=$(PY) bash scripts/run-suites.sh

bench: venv
	$(PY) bench/recovery.py

# What one GPU can show (bench/gpu_check.py), within 10 minutes; a clear skip without CUDA.
gpu-check: venv
	$(PY) bench/gpu_check.py

clean:
	rm -rf .venv .mypy_cache .ruff_cache .pytest_cache .hypothesis
