# HeraldLab. `make test` is the test command; `make demo` the main job on the simulated lab.
SWIFT ?= swift
SHELL := /bin/bash
# What `swift build` needs (make build, make demo): only these on a newcomer's first run.
BUILD_APT := pkg-config libdbus-1-dev libbluetooth-dev libsqlite3-dev
# What the tests drive besides: a private dbus-daemon, the fixture's xz, a browser, Prometheus,
# and libcurl for the toolchain's FoundationNetworking (URLSession in two test files; the product has none).
TEST_APT := dbus xz-utils chromium chromium-driver prometheus libcurl4
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps deps-build build release release-static lab deb-binary deb test-deb test test-integration test-results-server test-calibration bench-calibration test-ci test-dashboard test-badinput bench bench-results bench-sim bench-analysis bench-harness bench-lab bench-crowd bench-scale simulate demo test-bluez test-dongles test-lab clean

all: build

# Installs the system packages the build needs, only those that are missing.
deps-build:
	@missing=""; for p in $(BUILD_APT); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps-build: installing$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

# ... and those the tests need (system packages and the Python test peers).
deps: deps-build
	@missing=""; for p in $(TEST_APT); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	@python3 -c "import dbus_fast" 2>/dev/null || python3 -m pip install -q dbus-fast
	@python3 -c "import selenium" 2>/dev/null || python3 -m pip install -q selenium==4.51.0

build: deps-build
	$(SWIFT) build

release: deps-build
	$(SWIFT) build -c release

# herald-lab_<version>_<arch>.deb in dist/: the release binary with the Swift runtime linked in
# (it runs on a node without Swift), units for agents, the coordinator and the air, the udev rule.
DEB_OUT ?= dist
# The one release configuration (static Swift runtime, .build-deb): the packaged binary, which the
# .deb ships and test-lab, test-bluez, test-dongles and test-deb run, and herald-lab-bench, whose
# calibrate is make test-calibration. Built once; the second product reuses every module.
DEB_BIN := .build-deb/release/herald-lab
BENCH_STATIC := .build-deb/release/herald-lab-bench
release-static: deps-build
	$(SWIFT) build -c release --static-swift-stdlib --product herald-lab --scratch-path .build-deb
	$(SWIFT) build -c release --static-swift-stdlib --product herald-lab-bench --scratch-path .build-deb

deb-binary: release-static

deb: deb-binary
	@dpkg-query -W -f='$${Status}' dpkg-dev 2>/dev/null | grep -q 'ok installed' || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq dpkg-dev; }
	@rm -f $(DEB_OUT)/herald-lab_*.deb
	@scripts/deb/build.sh $(DEB_BIN) $(DEB_OUT)

# The .deb installed into clean Debian 12 and Debian 13 roots (mmdebstrap, root): --version, its
# libraries, user, units, and an agent from the root registering with a coordinator here.
test-deb: deb
	@dpkg-query -W -f='$${Status}' mmdebstrap 2>/dev/null | grep -q 'ok installed' || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq mmdebstrap; }
	$(SUDO) scripts/deb/test.sh $$(ls $(DEB_OUT)/herald-lab_*.deb) $(DEB_BIN)

# The tiers. `make test` (the README's test command, every commit): unit and in-memory tests,
# at most 300 s of test time here (.ci/run fails it past 600 s). Tests whose classes or names
# match INTEGRATION need labs of real processes (herald-lab air, coordinator and agents; a fake
# bluetoothd beside a private dbus-daemon; the herald-lab binary), a browser or Prometheus:
# `make test-integration` runs them, side by side (they mostly wait). `make test-calibration`
# runs the seeded A/A, known-effect and false-alarm loops in the release build.
INTEGRATION := LabHarnessTests\.(FaultTests|HarnessTests|HostileAgentTests|IdentityTests|ImpostorTests|LabScriptTests|MetricsScrapeTests|RunAttachTests|ServiceShutdownTests|StudyRunTests|SubmissionErrorTests)|HeraldAnalysisTests\.(CommandTests|CLIFlagTests|FourLevelStudyTests|InputValidationCommandTests|ShippedPlansTests)|BlueZRadioTests\.(BlueZTransportTests|AgentDongleTests)|/test[A-Za-z0-9]*InChromium
# The shared results store (issue 41) against a real PostgreSQL the test starts and stops
# (Debian's postgresql, installed when missing): in neither make test nor make test-integration.
RESULTS_SERVER := LabResultsTests\.SharedResultsStoreTests|LabResultsTests\.SharedHistoryReadingTests
INTEGRATION_WORKERS ?= 3
TEST_TIMING := results/test-timing
test: deps
	$(SWIFT) build --build-tests
	@mkdir -p $(TEST_TIMING)
	@set -o pipefail; $(SWIFT) test --skip-build --disable-swift-testing --skip '$(INTEGRATION)|$(RESULTS_SERVER)' 2>&1 | tee $(TEST_TIMING)/test.log; \
	 status=$$?; scripts/test-timing.py $(TEST_TIMING)/test.log | tee $(TEST_TIMING)/test.txt; exit $$status

test-integration: deps
	$(SWIFT) build --build-tests
	@mkdir -p $(TEST_TIMING)
	@set -o pipefail; $(SWIFT) test --skip-build --disable-swift-testing --parallel --num-workers $(INTEGRATION_WORKERS) --filter '$(INTEGRATION)' --xunit-output $(TEST_TIMING)/integration.xml 2>&1 | tee $(TEST_TIMING)/integration.log; \
	 status=$$?; scripts/test-timing.py $(TEST_TIMING)/integration.xml | tee $(TEST_TIMING)/integration.txt; exit $$status

# HERALDLAB_REQUIRE_POSTGRES: here a missing server fails the test rather than skipping it. Then
# two labs of the real herald-lab write to one store, PostgreSQL stopped during the second lab's
# run, then 3 coordinators at once and prune (scripts/results-server/e2e.sh, about 130 s).
test-results-server: deps-build
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo "make test-results-server: installing postgresql"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql; }
	$(SWIFT) build --build-tests
	@mkdir -p $(TEST_TIMING)
	@set -o pipefail; HERALDLAB_REQUIRE_POSTGRES=1 $(SWIFT) test --skip-build --disable-swift-testing --filter '$(RESULTS_SERVER)' 2>&1 | tee $(TEST_TIMING)/results-server.log
	scripts/results-server/e2e.sh .build/debug/herald-lab

test-calibration: release-static
	$(BENCH_STATIC) calibrate

# The full count (issue 38): every calibration loop with devices and runs that differ, 200 seeds
# (aa-paired 100): a true 10 % false-call rate fails the 5 % check with probability > 99 %.
# Minutes; its table is in docs/STATISTICS.md.
bench-calibration: release-static
	$(BENCH_STATIC) calibrate --variance --seeds 200

# docs/CI.md's GitHub Actions job, run as written against the simulated lab, four nights in a row
# (scripts/ci/test_recipes.py): run, regress against the history, the bundle kept, junit.xml there.
test-ci: deps build
	python3 scripts/ci/test_recipes.py .build/debug/herald-lab 4

# The coordinator's dashboard in headless Chromium (Selenium, chromium-driver) against the lab of
# `make lab`: sign-in, every page without console errors or Content-Security-Policy violations, a
# live run's numbers changing on screen, a stranger getting nothing, a CSRF-protected button;
# screenshots of each page in results/test-dashboard/.
test-dashboard: deps build
	python3 scripts/dashboard/test.py .build/debug/herald-lab results/test-dashboard

# Bad-input suite: 1,000 mutated plans (plan check, then a short simulate) and 300 mutated log
# folders (analyse, compare, regress) through the built herald-lab; counts crashes, hangs, escapes.
test-badinput: deps build
	python3 scripts/badinput/run.py --seed $${BADINPUT_SEED:-1}

# The main job on the built-in simulated lab: the air, a coordinator and three agents on
# loopback run plans/smoke.yaml; the bundle and its report land in results/.
demo: deps-build
	$(SWIFT) build --product herald-lab
	@scripts/lab.sh plans/smoke.yaml 3 results; status=$$?; \
	 if [ $$status -le 1 ]; then echo "demo: report in $$(ls -td results/smoke-*/ | head -1)report/report.html"; fi; exit $$status

# The simulated lab on loopback, left running: the air, a coordinator and three agents, with the
# coordinator's URL and the operator's credential printed; Ctrl-C stops every process it started.
lab: deps-build
	$(SWIFT) build --product herald-lab
	@scripts/lab.sh --serve 3 results

# Simulates the office plan in virtual time into results/.
simulate: build
	$(SWIFT) run herald-lab simulate plans/office-10.yaml --out results/office-10-sim

# Real bluetoothd: a QEMU guest (Debian's kernel over this machine's root file system) with
# Bumble virtual controllers and phone personas runs plans/bluez-3.yaml through a coordinator and
# three agents with radio bluez (bluetoothd is killed once mid-run), and bleak reads a node's
# payload; scripts/bluez-guest/check.py checks the bundle. One run per stack, no second chance:
# Debian 12 as a lab should run it (BlueZ 5.66 on bookworm-backports' kernel 6.12) and Debian 13
# (kernel 6.12, BlueZ 5.82); BLUEZ_STACK=bookworm-backports, trixie or bookworm (Debian 12's own
# kernel 6.1, whose Bluetooth BUG wedges a node now and then: not in CI) picks one.
# Outputs, bluetoothd -d log included: $(BLUEZ_OUT)/<stack>.
BLUEZ_APT := qemu-system-x86 busybox-static bluez cpio kmod mmdebstrap
BLUEZ_OUT ?= results/test-bluez
BLUEZ_STACKS := $(or $(BLUEZ_STACK),bookworm-backports trixie)
test-bluez: deb-binary
	@missing=""; for p in $(BLUEZ_APT); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make test-bluez: installing$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	@python3 -c "import bumble, bleak" 2>/dev/null || python3 -m pip install -q bumble==0.0.236 bleak==3.1.0
	python3 scripts/bluez-guest/test_personas.py
	python3 scripts/bluez-guest/test_checks.py
	@for stack in $(BLUEZ_STACKS); do BLUEZ_STACK=$$stack scripts/bluez-guest/guest.sh prepare || exit 1; done
	@rm -rf $(BLUEZ_OUT); failed=""; \
	 for stack in $(BLUEZ_STACKS); do \
	   started=$$(date +%s); out=$(BLUEZ_OUT)/$$stack; \
	   BLUEZ_STACK=$$stack HERALD_LAB=$(CURDIR)/$(DEB_BIN) scripts/bluez-guest/guest.sh run $$out scripts/bluez-guest/run-in-guest.sh; guest=$$?; \
	   python3 scripts/bluez-guest/check.py $$out plans/bluez-3.yaml scripts/bluez-guest/model.json > $$out/check.txt 2>&1; check=$$?; \
	   cat $$out/check.txt; \
	   echo "test-bluez $$stack: $$(( $$(date +%s) - started )) s wall; guest exit $$guest, check exit $$check; outputs in $$out"; \
	   [ $$check -eq 0 ] && [ $$guest -le 1 ] || failed="$$failed $$stack"; \
	 done; \
	 for stack in $$failed; do scripts/bluez-guest/why-failed.sh $(BLUEZ_OUT)/$$stack; done; \
	 [ -z "$$failed" ] || { echo "test-bluez: FAILED on$$failed"; exit 1; }

# Many dongles per host, and a fleet that looks after itself: the same QEMU guest with six Bumble
# controllers of several makes and firmware versions, two hosts of three dongles each installed
# by agents/install.sh (--stage) and started as the template unit herald-lab-agent@NAME starts
# them; a health check, one controller going mute, a second check, then plans/dongles-5.yaml (5
# nodes, 1 spare): the mute dongle fails its pre-flight, is quarantined with the evidence, and the
# spare runs its node. scripts/bluez-guest/check-dongles.py checks the outputs: $(DONGLES_OUT).
# One run, no second chance, about 5 minutes, bounded by DONGLES_TIMEOUT s.
# On Debian 13's stack (DONGLES_STACK=bookworm-backports or bookworm for Debian 12's): Linux
# 6.1's own kernel BUG in hci_chan_del (ARCHITECTURE.md) wedged every controller of the guest in
# one of three bookworm runs; test-bluez runs Debian 12's BlueZ as well.
DONGLES_OUT ?= results/test-dongles
DONGLES_STACK ?= trixie
DONGLES_TIMEOUT ?= 720
test-dongles: deb-binary
	@missing=""; for p in $(BLUEZ_APT); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make test-dongles: installing$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	@python3 -c "import bumble" 2>/dev/null || python3 -m pip install -q bumble==0.0.236
	python3 scripts/bluez-guest/test_checks.py
	BLUEZ_STACK=$(DONGLES_STACK) scripts/bluez-guest/guest.sh prepare
	@rm -rf $(DONGLES_OUT); started=$$(date +%s); \
	 BLUEZ_STACK=$(DONGLES_STACK) BLUEZ_GUEST_TIMEOUT=$(DONGLES_TIMEOUT) HERALD_LAB=$(CURDIR)/$(DEB_BIN) scripts/bluez-guest/guest.sh run $(DONGLES_OUT) scripts/bluez-guest/run-dongles-in-guest.sh; guest=$$?; \
	 python3 scripts/bluez-guest/check-dongles.py $(DONGLES_OUT) scripts/bluez-guest/model-dongles.json > $(DONGLES_OUT)/check.txt 2>&1; check=$$?; \
	 cat $(DONGLES_OUT)/check.txt; \
	 echo "test-dongles: $$(( $$(date +%s) - started )) s wall, one run; guest exit $$guest, check exit $$check; outputs in $(DONGLES_OUT)"; \
	 [ $$check -eq 0 ] && [ $$guest -le 1 ] || { scripts/bluez-guest/why-failed.sh $(DONGLES_OUT); echo "test-dongles: FAILED"; exit 1; }

# A multi-host lab in network namespaces (root): coordinator+air, three agents and a client, each
# its own host on a bridge, one agent behind a user-space delay/loss relay; the real herald-lab
# through plain runs and faults, checked from the bundles (scripts/netlab/). The hosts are
# installed from the .deb as README.md and agents/README.md say (install-coordinator.sh, enrolment,
# install.sh's env files), and every service starts as the package's unit starts it. Outputs and
# every service's log: $(LAB_OUT).
LAB_APT := iproute2 ethtool curl
LAB_OUT ?= results/test-lab
# The package's release binary, as agents are deployed (the debug build's slower request parsing
# alone skews a clock probe by about a millisecond).
test-lab: deb
	@missing=""; for p in $(LAB_APT); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make test-lab: installing$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	$(SUDO) python3 scripts/netlab/netlab.py test --deb $$(ls $(DEB_OUT)/herald-lab_*.deb) --out $(LAB_OUT)

clean:
	rm -rf .build .build-bluez .build-deb dist

# Benchmarks (release build): figures and ratios, never asserted in tests.
bench: bench-sim bench-analysis bench-harness bench-lab bench-crowd bench-scale bench-variance bench-calibration bench-results

bench-sim: release
	@echo "== simulator: plans/longevity-10.yaml (10 nodes x 8 h, virtual time); target <= 30 s wall, < 1 GB"
	@rm -rf .build/bench/longevity-10
	@/usr/bin/time -f "simulate: %e s wall, %M KB peak" .build/release/herald-lab simulate plans/longevity-10.yaml --out .build/bench/longevity-10 --quiet

# Herald's R script (TestAnalysis.R) is located or cloned at run time by scripts/bench-r.sh
# (HERALD_R_SCRIPT, HERALD_ANALYSIS_REPO); without it or without R the ratio is skipped.
FIXTURE := ../shared/herald/fixtures/herald-2020-12-08.tar.xz
bench-analysis: release
	@echo "== analyser: Herald's published 2020-12-08 test (4 phones, 12 h, 43 MB), herald parameters, beside Herald's R script"
	@mkdir -p .build/bench && [ -d .build/bench/herald-2020-12-08 ] || tar -xJf $(FIXTURE) -C .build/bench
	@scripts/bench-analysis.sh

bench-harness: release
	@echo "== harness: start skew across 5 agent processes on loopback (target p99 <= 2 ms)"
	@BIN=.build/release/herald-lab scripts/lab.sh plans/skew-5.yaml 5 .build/bench/results | grep -E "start skew|verdict"
	@echo "== harness: arm 1000 heartbeating agents, each with its own listener, in one process; coordinator in its own (target <= 3 s, < 300 MB)"
	@.build/release/herald-lab-bench arm --agents 1000 2>&1 | grep -E "^arm|^  CPU|^  clocks"
	@echo "== harness: gather throughput on loopback, SHA-256 verified and fsynced (target >= 1 GB/s)"
	@for i in 1 2 3; do .build/release/herald-lab-bench gather --megabytes 1000 | grep -E "^gather|this disk"; done

bench-lab: release
	@echo "== lab in network namespaces: true start skew and clock offset error, one agent behind a 20 ms +- 5 ms, 1 % loss relay, then without delay"
	@missing=""; for p in $(LAB_APT); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; fi
	@$(SUDO) python3 scripts/netlab/netlab.py bench --bin .build/release/herald-lab --out results/bench-lab

# Crowding (docs/SIMULATOR.md): 2 m grids of 10 to 150 nodes, 3 minutes each, radio.crowding on
# and off; detection, continuity, time to first read, RSSI rows per pair per second, wall time.
CROWD_SIZES ?= 10 30 100 150
CROWD_DURATION ?= 3m
bench-crowd: release
	@echo "== crowding: 2 m grid, 10 columns, $(CROWD_DURATION) each (sensor defaults); crowding off vs on"
	@printf "%-6s %-4s %10s %12s %14s %14s %12s %9s\n" nodes mode "detect%" "continuity%" "ttfr-mean-s" "ttfr-max-s" "rows/pair/s" "wall-s"
	@mkdir -p .build/bench/crowd; for n in $(CROWD_SIZES); do for mode in off on; do \
	  dir=.build/bench/crowd/grid-$$n-$$mode; rm -rf $$dir; \
	  printf "name: crowd-grid-%s-%s\nduration: $(CROWD_DURATION)\nwarmup: 10s\nnodes: {count: %s, prefix: node, grid: {columns: 10, spacing: 2m}}\nradio:\n  crowding: %s\n" $$n $$mode $$n $$mode > $$dir.yaml; \
	  t0=$$(date +%s.%N); .build/release/herald-lab simulate $$dir.yaml --out $$dir --quiet >/dev/null || exit 1; t1=$$(date +%s.%N); \
	  .build/release/herald-lab analyse $$dir --no-history >/dev/null 2>&1; \
	  python3 -c "import json,csv,sys; s=json.load(open('$$dir/report/summary.json'))['strict']; rows=list(csv.DictReader(open('$$dir/report/pairs.csv'))); \
t=[float(r['time_to_first_read_s']) for r in rows if r['time_to_first_read_s'] not in ('','nan')]; d=$$(echo $(CROWD_DURATION) | sed 's/m$$/*60/;s/s$$//')-10; \
print('%-6s %-4s %10.2f %12.2f %14.1f %14.1f %12.2f %9.1f' % ($$n, '$$mode', s['detectionpct'], s['continuitypct'], sum(t)/len(t) if t else float('nan'), max(t) if t else float('nan'), sum(int(r['rssi_samples']) for r in rows)/len(rows)/d, $$t1-$$t0))"; \
	done; done

# How simulate, analyse and arm grow with nodes (10, 30, 100, 150 nodes x 1 h; 10, 100, 1000
# agents). Long: a 100-node hour is several GB of logs. DURATION=10m NODES="10 30" for a quick look.
bench-variance: release-static
	@echo "== simulator with devices and runs that differ (radio.devices, radio.environment, crowding on) beside off; calibration with them on (false calls reported)"
	@BIN=.build-deb/release/herald-lab scripts/bench-variance.sh
	@.build-deb/release/herald-lab-bench calibrate --variance --seeds 200 | grep -E "^REPORT|^calibrate|^FAIL"

# The shared results store's scale (issue 41): the insert rate of 3 writers at once, and the
# Trends series and `regress --baseline history` over a simulated 1-year, 10-lab history
# (73,000 runs), on a PostgreSQL of Debian's packages the script starts (installed when missing).
# Figures in docs/RESULTS-SERVER.md.
bench-results: deps-build
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo "make bench-results: installing postgresql"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql; }
	$(SWIFT) build -c release --product herald-lab-bench
	@scripts/results-server/bench.sh .build/release/herald-lab-bench

bench-scale: release
	@echo "== scale: simulate and analyse a grid plan, arm heartbeating agents"
	@scripts/bench-scale.sh
