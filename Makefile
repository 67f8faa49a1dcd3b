# amtpu: build/test entry points. `make` lists the targets.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.ONESHELL:
.DEFAULT_GOAL := help

VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

# Simulator for the cocotb tests (icarus | verilator) and whether tests write waveforms
# (FST + a .gtkw save file under build/). Exported to the tests.
SIM   ?= icarus
WAVES ?= 0
export SIM WAVES

# `make demo`: network (mlp | cnn | onnx), configuration, transport (rtl | isa | serial), the
# serial port (PORT=/dev/ttyUSB1 or socket://host:port), RTL simulator, images.
NET       ?= mlp
CONFIG    ?= default
TRANSPORT ?= rtl
PORT      ?=
DEMO_SIM  ?= verilator
IMAGES    ?=

# `make bitstream`: board (icebreaker | ulx3s) and extra arguments (BOARD_ARGS="--clock 20").
BOARD      ?= icebreaker
BOARD_ARGS ?=

# `make synth`: the array's board and options (SYNTH_ARGS="--board ulx3s --runs 4").
SYNTH_ARGS ?= --board icebreaker

# `make report`: extra arguments (REPORT_ARGS="--rerun" also measures simulation speed,
# "--synth" reruns the synthesis sweep, "--cached" only redraws from bench/results/).
REPORT_ARGS ?=

# pytest-xdist workers, extra pytest arguments (ARGS="-k pe -x"), test filter for `make waves`.
# Work stealing: a worker that runs out takes tests from the other's queue, so a few long RTL
# runs queued behind each other on one worker no longer leave the other idle at the end
# (xdist's default `load` hands each worker a fixed share up front).
JOBS ?= 2
XDIST = -n $(JOBS) --dist worksteal
ARGS ?=
TEST ?=

# Run tools from the venv with the outer make's jobserver/flags removed, so the `make` that
# cocotb's runner starts (Verilator's Vtop.mk, cocotb makefiles) is not confused by them.
# The Verilator PCH workaround (MAKEFLAGS=CFG_CXXFLAGS_PCH_I=-include) is set by sim/'s runner.
# PYTHONDONTWRITEBYTECODE (set on some machines) is dropped: without byte-code caches each
# pytest worker compiles and assertion-rewrites the whole tree again (4 s of its 7.6 s of
# collection), and so does every simulator's Python; __pycache__/ is ignored by git.
RUN := env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS -u MAKEFILES -u PYTHONDONTWRITEBYTECODE \
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH"

# Debian packages: Icarus Verilog (default simulator); g++, make and perl to build Verilator
# models; lz4 and zlib headers for Verilator FST tracing.
APT_PKGS := iverilog g++ make perl liblz4-dev zlib1g-dev
# Optional Debian packages, installed where apt is available; setup succeeds without them:
# GTKWave (make waves, make tour; its fst2vcd lets .gtkw files name internal signals), ccache
# (Verilator's objects shared between builds), gemmlowp's header (the reference that
# tests/firmware/test_fixedpoint.py also compiles, beside its committed table).
APT_OPTIONAL := gtkwave ccache libgemmlowp-dev

.PHONY: help setup test regression soak test-all mutations lint demo synth bitstream bench report \
        waves clean

help:
	@printf '%s\n' \
	  'amtpu make targets:' \
	  '  setup     create $(VENV), pip install -e .[dev], Debian packages (as root), verilator wrapper' \
	  '  test      the fast tier: pytest -n $(JOBS) --dist worksteal -m "not slow and not soak"' \
	  '  regression the rest, with a share of the volume (CI runs it): pytest -n $(JOBS) --dist worksteal -m "slow and not soak"' \
	  '  soak      the deep volume past the regression'"'"'s share: pytest -n $(JOBS) --dist worksteal -m soak' \
	  '  test-all  all of them in one run' \
	  '  mutations plant each deliberate break of tests/mutations/*.patch in a scratch worktree; make test must catch it (NAMES=...)' \
	  '  lint      ruff check .' \
	  '  demo      amtpu demo: a quantised digits network on the simulated core (NET=mlp|cnn|onnx)' \
	  '  synth     the array placed and routed, its Fmax: python -m boards build --target array (SYNTH_ARGS="--board ulx3s --runs 4")' \
	  '  bitstream the whole core for a board: python -m boards build --target board --board BOARD (BOARD=icebreaker|ulx3s)' \
	  '            (any FPGA build: python -m boards build --target array|block|core|board --board icebreaker|ulx3s; --help)' \
	  '  formal    python -m sim.formal -j FORMAL_JOBS (SymbiYosys proofs, each with a time limit; FORMAL_JOBS=2, ARGS="pe --fast" or "--limit 0"); counterexamples: make waves' \
	  '  bench     python -m bench.utilisation, bench.gemm, bench.simspeed and bench.transport' \
	  '  report    python -m bench.report: measure, plot, write docs/performance.md (REPORT_ARGS=--rerun|--synth|--cached)' \
	  '  waves     open the newest build/**/*.gtkw (path matching TEST=...) in GTKWave' \
	  '  tour      one matmul on the 4x4 core, checked against the ISA simulator, opened in GTKWave (docs/tour.md); STOP=attention: k.T made on chip; STOP=windows: a convolution over the image itself' \
	  '  tour-png  the tour'"'"'s screenshot, docs/img/tour.png (GTKWave under Xvfb: apt-get install xvfb x11-apps)' \
	  '  clean     remove build/ and caches' \
	  'variables: SIM=icarus|verilator (now $(SIM))  WAVES=0|1 (now $(WAVES))  JOBS=$(JOBS)' \
	  '           NET=mlp|cnn|onnx CONFIG=default TRANSPORT=rtl|isa|serial PORT=url DEMO_SIM=verilator IMAGES=n (demo)' \
	  '           BOARD=icebreaker|ulx3s BOARD_ARGS="--clock 20" (bitstream)  SYNTH_ARGS="--board ulx3s" (synth)' \
	  '           ARGS="extra pytest arguments"  TEST=substring of a build path (for waves)'

setup:
	@is_installed() { dpkg-query -W -f='$${Status}' "$$1" 2>/dev/null | grep -q 'install ok installed'; }
	apt_updated=0
	apt_install() {
	  if [ "$$(id -u)" -ne 0 ]; then return 1; fi
	  if ! command -v apt-get >/dev/null; then return 1; fi
	  if [ "$$apt_updated" = 0 ]; then apt-get update; apt_updated=1; fi
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$$@"
	}
	missing=()
	# System packages first (dpkg check; iverilog also counts if built from source).
	need=()
	for pkg in $(APT_PKGS); do
	  if [ "$$pkg" = iverilog ] && command -v iverilog >/dev/null; then continue; fi
	  if [ "$$pkg" = make ] && command -v make >/dev/null; then continue; fi
	  if [ "$$pkg" = g++ ] && command -v g++ >/dev/null; then continue; fi
	  is_installed "$$pkg" || need+=("$$pkg")
	done
	# `python3 -m venv` needs ensurepip, which Debian ships in python3-venv.
	if [ ! -x $(PY) ] && ! python3 -c 'import ensurepip' 2>/dev/null; then need+=(python3-venv); fi
	if [ $${#need[@]} -gt 0 ]; then
	  echo "setup: installing Debian packages: $${need[*]}"
	  apt_install "$${need[@]}" || missing+=("$${need[@]}")
	fi
	if [ ! -x $(PY) ]; then
	  echo "setup: creating $(VENV)"
	  python3 -m venv $(VENV)
	fi
	$(PIP) install --disable-pip-version-check -e '.[dev]'
	# cocotb loads libpython into the simulator; Debian ships it separately from python3.
	if ! $(VENV)/bin/find_libpython >/dev/null 2>&1; then
	  libpy="libpython$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
	  echo "setup: cocotb cannot find libpython; installing $$libpy"
	  apt_install "$$libpy" || missing+=("$$libpy")
	fi
	$(PY) -m sim.rtl.verilator_wrapper
	# YoWASP compiles each tool's WebAssembly on its first run (yosys about 40 s): here, once,
	# not inside the first test or bitstream.
	for tool in yosys nextpnr-ice40 nextpnr-ecp5; do
	  $(VENV)/bin/yowasp-$$tool --version >/dev/null
	done
	for pkg in $(APT_OPTIONAL); do
	  if ! is_installed "$$pkg" && ! command -v "$$pkg" >/dev/null; then
	    apt_install "$$pkg" || \
	      echo "setup: note: $$pkg (optional: gtkwave for make waves and make tour, ccache to share Verilator's runtime objects between builds, libgemmlowp-dev for the fixed-point reference test) is not installed: apt-get install $$pkg"
	  fi
	done
	if [ $${#missing[@]} -gt 0 ]; then
	  echo >&2
	  echo "setup: INCOMPLETE: missing Debian packages: $${missing[*]}" >&2
	  echo "setup: install them as root:  apt-get install -y $${missing[*]}" >&2
	  exit 1
	fi
	echo "setup: done"

test:
	$(RUN) $(PY) -m pytest $(XDIST) -m "not slow and not soak" $(ARGS)

regression:
	$(RUN) $(PY) -m pytest $(XDIST) -m "slow and not soak" $(ARGS)

soak:
	$(RUN) $(PY) -m pytest $(XDIST) -m soak $(ARGS)

test-all:
	$(RUN) $(PY) -m pytest $(XDIST) $(ARGS)

# Each patch of tests/mutations/ (NAMES=substrings picks some) in build/mutations/worktree.
NAMES ?=
mutations:
	$(RUN) $(PY) tests/mutations/run.py $(NAMES)

lint:
	$(RUN) ruff check .

demo:
	$(RUN) $(VENV)/bin/amtpu demo --net $(NET) --config $(CONFIG) --transport $(TRANSPORT) \
	  --sim $(DEMO_SIM) $(if $(IMAGES),--images $(IMAGES)) $(if $(filter 1,$(WAVES)),--waves) \
	  $(if $(PORT),--port $(PORT))

synth:
	$(RUN) $(PY) -m boards build --target array $(SYNTH_ARGS)

bitstream:
	$(RUN) $(PY) -m boards build --target board --board $(BOARD) $(BOARD_ARGS)

# Proofs at once: each is one solver process.
FORMAL_JOBS ?= 2

.PHONY: formal
formal:
	$(RUN) $(PY) -m sim.formal -j $(FORMAL_JOBS) $(ARGS)

bench:
	$(RUN) $(PY) -m bench.utilisation
	$(RUN) $(PY) -m bench.gemm
	$(RUN) $(PY) -m bench.simspeed
	$(RUN) $(PY) -m bench.transport

report:
	$(RUN) $(PY) -m bench.report $(REPORT_ARGS)

waves:
	@if ! command -v gtkwave >/dev/null; then
	  echo "waves: gtkwave is not installed; install it with: apt-get install gtkwave" >&2
	  exit 1
	fi
	f=$$(find build -name '*.gtkw' -path '*$(TEST)*' -printf '%T@ %p\n' 2>/dev/null \
	     | sort -rn | head -n 1 | cut -d ' ' -f 2-)
	if [ -z "$$f" ]; then
	  echo "waves: no .gtkw file under build/ matching '$(TEST)'; run e.g. make test WAVES=1" >&2
	  exit 1
	fi
	echo "waves: $$f"
	exec gtkwave "$$f"

.PHONY: tour tour-png
tour:
	$(RUN) $(PY) -m sim.waves.tour $(if $(STOP),--stop $(STOP))

tour-png:
	$(RUN) $(PY) -m sim.waves.tour --no-gui --screenshot docs/img/tour.png

clean:
	rm -rf build/ sim_build/ .pytest_cache/ .ruff_cache/ results.xml *.egg-info/
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
