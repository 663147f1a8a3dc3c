# The two commands of the README: `make run` and `make test` (`make test ARGS='tests/app -x'`
# passes arguments on to both pytest phases).
VENV ?= .venv
PYTHON ?= python3

.PHONY: run test install lint

# --no-compile: pip would compile every installed module to bytecode (15 s of a fresh
# install); Python compiles what it imports on first use instead (`make test` keeps its
# bytecode outside the tree, PYTHONPYCACHEPREFIX, where pip's would not be read anyway).
$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet --no-compile -e '.[dev]'
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
