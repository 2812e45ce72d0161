# The two commands a fresh machine needs:  make demo   and   make test
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.llmsla-installed

.PHONY: demo test test-fast test-quick lint typecheck bootstrap clean

# the unit layer (tests/unit: the closed loop's pure decisions) and the other tests that start no
# service and run in seconds: the edit loop, under a minute (one process: starting workers would
# take longer than the tests)
FAST_TESTS := tests/unit tests/test_architecture.py tests/alerting/test_layering.py \
	tests/alerting/test_policy.py tests/forecaster/test_layering.py tests/forecaster/test_hysteresis.py \
	tests/control/test_ab_stats.py tests/test_histogram.py \
	tests/test_events.py tests/test_slo_catalog.py tests/test_config.py

$(STAMP): pyproject.toml scripts/bootstrap.sh
	VENV=$(VENV) bash scripts/bootstrap.sh
	touch $@

bootstrap: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/llmsla demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	PY=$(PY) bash scripts/typecheck.sh
	bash scripts/run-tests.sh

test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	PY=$(PY) bash scripts/typecheck.sh
	TEST_WORKERS=$${TEST_WORKERS:-0} bash scripts/run-tests.sh $(FAST_TESTS)

# everything not marked slow (skips the long integration runs of Flink, Prometheus, the demo;
# still starts PostgreSQL, Redis and the control API): minutes
test-quick: $(STAMP)
	$(VENV)/bin/ruff check .
	PY=$(PY) bash scripts/typecheck.sh
	bash scripts/run-tests.sh -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# mypy over the package as installed (the seams between components: llmsla/seams.py)
typecheck: $(STAMP)
	PY=$(PY) bash scripts/typecheck.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
