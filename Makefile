# mmwf: `make demo` sets everything up and runs the demo; `make test` runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mmwf-installed

.PHONY: install demo test quick lint docs benchmark

install: $(STAMP)

$(STAMP): tools/install.sh requirements.txt requirements/stack.txt requirements/tests.txt requirements/deploy.txt \
          requirements/generation.txt requirements/docs.txt setup.cfg
	bash tools/install.sh
	touch $(STAMP)

demo: install
	$(PY) tools/demo.py

lint: install
	$(VENV)/bin/ruff check .

# the documentation site (mkdocs.yml) into site/: warnings (a broken link, a docstring it cannot read) are errors
docs: install
	$(VENV)/bin/mkdocs build --strict --quiet

# two pytest-xdist workers per two cores (one torch thread each); a file's tests share a worker, slow files first
# (tests/conftest.py)
test: install lint docs
	$(PY) -m pytest -n auto --dist loadgroup -m "not benchmark"

# the edit-test loop: everything but the slow tests
quick: install
	$(PY) -m pytest -n auto --dist loadgroup -m "not slow and not benchmark"

benchmark: install
	$(PY) tools/analysis/benchmark.py inference
