# The two commands of the README: `make run` and `make test` (`make test ARGS='tests/app -x'`
# passes arguments on to both pytest phases).
VENV ?= .venv
PYTHON ?= python3

.PHONY: run test install lint

# The packages go in with uv (itself from PyPI, into the venv): the same versions as pip
# resolves (`pip freeze` compared), in ~6 s instead of ~44 on a new machine. Where uv cannot
# be had, pip does it. Bytecode: `make run` and `make install` compile the installed packages
# (where PYTHONDONTWRITEBYTECODE is set, every start would otherwise compile them again);
# `make test` does not, since scripts/test.sh keeps the suite's bytecode in a
# PYTHONPYCACHEPREFIX of its own and would never read those files (~20 s of CPU saved).
COMPILE ?= yes
test: COMPILE := no

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	if $(VENV)/bin/pip install --quiet uv; then \
	  $(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python \
	    $(if $(filter yes,$(COMPILE)),--compile-bytecode) -e '.[dev]'; \
	else \
	  $(VENV)/bin/pip install --quiet --upgrade pip \
	  && $(VENV)/bin/pip install --quiet $(if $(filter yes,$(COMPILE)),,--no-compile) -e '.[dev]'; \
	fi
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
