# The two commands a fresh machine needs:  make demo   and   make test
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.llmsla-installed

.PHONY: demo test test-fast lint typecheck bootstrap clean

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

# the edit loop: everything not marked slow (integration runs of Flink, Prometheus, the demo)
test-fast: $(STAMP)
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
