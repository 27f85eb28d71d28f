# mmwf: `make demo` sets everything up and runs the demo; `make test` runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mmwf-installed

.PHONY: install demo test lint benchmark

install: $(STAMP)

$(STAMP): tools/install.sh requirements.txt requirements/tests.txt requirements/deploy.txt setup.cfg
	bash tools/install.sh
	touch $(STAMP)

demo: install
	$(PY) tools/demo.py

lint: install
	$(VENV)/bin/ruff check .

test: install lint
	$(PY) -m pytest -m "not benchmark"

benchmark: install
	$(PY) tools/analysis/benchmark.py
