# The two commands of the README: `make run` and `make test` (`make test ARGS='tests/app -x'`
# passes arguments on to both pytest phases).
VENV ?= .venv
PYTHON ?= python3

.PHONY: run test install lint

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

run: $(VENV)/.installed
	$(VENV)/bin/chatgate serve --first-run

test: $(VENV)/.installed
	bash scripts/test.sh $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy app channels tests bench
