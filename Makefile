# linnet — two commands on a fresh machine (as root):
#   make demo   start VMs' networks and show them working
#   make test   unit tests, then the integration suite in throwaway namespaces
#   make bench  linnet against the kernel and its peers (bench/README.md)

CARGO ?= cargo
# The Go client's toolchain: on PATH, else where Go's own tarball puts it
# (scripts/install-deps installs Debian's golang-go when there is neither).
# `=`, not `:=`: looked up when used, after `deps` may have installed it.
GO ?= $(shell command -v go || echo /usr/local/go/bin/go)
export GO
GO_CLIENT := clients/go/linnet
SANDBOX := scripts/sandbox

.PHONY: all build guest guest-debian deps check-install test unit integration compat lint demo bench bench-smoke fuzz fuzz-smoke clean install deb

all: build

# --locked everywhere: a Cargo.lock (the workspace's, fuzz/'s) that a
# build would change fails the build instead of building from versions
# nobody committed.
build:
	$(CARGO) build --locked --workspace --release

deps:
	scripts/install-deps

# scripts/install-deps run in a bare Debian root file system (mmdebstrap,
# cached by install-deps' hash under /var/cache/linnet), then every program
# of scripts/programs found there (.ci/run runs it before the tests).
check-install:
	scripts/check-install

# The tiny test/demo VM (kernel + initramfs from Debian packages), rebuilt
# only when its inputs change.
guest: deps
	scripts/build-guest

# The Debian 12 guest of the distro tests (systemd-networkd, NetworkManager,
# cloud-init), cached by its inputs under /var/cache/linnet.
guest-debian: deps
	scripts/build-guest-debian

unit:
	$(CARGO) test --locked --workspace
	# The daemon's unit tests need no privilege: run them again as nobody.
	scripts/unit-as-nobody
	# The benchmark's judgement (unstable cells, targets, the docs' blocks).
	PYTHONPATH=bench PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s bench/tests
	# scripts/programs lists every program the sources call (check-install finds them).
	PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s scripts/tests
	# The Go client against a fake daemon (its live test runs in the integration suite).
	cd $(GO_CLIENT) && GOTOOLCHAIN=local $(GO) test -count=1 ./...

# The integration suite creates bridges, rules and sysctls: it runs only
# inside scripts/sandbox, whose namespaces vanish when it ends.
integration: deps guest guest-debian
	$(CARGO) build --locked --workspace --bins --tests
	$(SANDBOX) $(CARGO) test --locked --offline --test integration -- --test-threads=2

# What Debian does not package, run with linnet: lima (scripts/build-lima
# builds it from the Go module proxy) to its shell on a network's socket
# (tests/integration/lima.rs), and Firecracker and Cloud Hypervisor on
# linnet's TAPs (tests/integration/vmms.rs), built by hand from their own
# sources, found through LINNET_FIRECRACKER and LINNET_CLOUD_HYPERVISOR or
# under /var/cache/linnet/vmms; a missing one fails its test, saying so.
# Not part of `make test`.
compat: deps guest guest-debian
	scripts/build-lima
	$(CARGO) build --locked --workspace --bins --tests
	$(SANDBOX) $(CARGO) test --locked --offline --test integration -- --test-threads=2 --ignored vmms:: lima::

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings
	# The integration suite is test = false, so --all-targets skips it.
	$(CARGO) clippy --locked --test integration -- -D warnings
	python3 -m py_compile bench/linnet_bench/*.py bench/tests/*.py scripts/programs.py scripts/tests/*.py
	# Layers one way: no import circle among the modules of any parent.
	scripts/check-layers
	out=$$(cd $(GO_CLIENT) && "$$($(GO) env GOROOT)/bin/gofmt" -l .) && test -z "$$out" || { echo "gofmt: $(GO_CLIENT): $$out"; exit 1; }
	cd $(GO_CLIENT) && GOTOOLCHAIN=local $(GO) vet ./...
	# It builds where lima runs too (macOS), saying there is no daemon there.
	cd $(GO_CLIENT) && GOOS=darwin GOTOOLCHAIN=local $(GO) vet ./...
	# The docs' benchmark figures are the committed results' (bench/linnet_bench/docs.py).
	PYTHONPATH=bench PYTHONDONTWRITEBYTECODE=1 python3 -m linnet_bench.docs --check

# The benchmark's machinery, quickly: a kernel setup, linnet's tap and
# dgram datapaths (with and without the virtio-net header, and the two on
# one network), its rootless daemon, egress by name and half a minute of
# the churn soak (one daemon restart), one short run each, no figures
# kept. Fails if a setup or a soak's attach fails, or anything is left behind.
bench-smoke: deps
	$(CARGO) build --locked --workspace --bins
	$(SANDBOX) bench/run --bin target/debug --only '^veth$$|^linnet (tap|dgram|rootless)( \+ vnet)?$$|mixed: the bare|^linnet egress by name$$' --mtu 1500 \
		--runs 1 --seconds 1 --attaches 20 --interfaces 100 --clones 10 --soak 0.5 --out target/bench-smoke --strict >/dev/null

test: deps lint unit integration bench-smoke fuzz-smoke

# Every fuzz target (fuzz/targets, src/fuzzing.rs) for FUZZ_SECONDS each,
# coverage-guided on the stable toolchain; fails on any finding, which
# lands in fuzz/artifacts/ (scripts/fuzz says what to do with it).
FUZZ_SECONDS ?= 60
fuzz: deps
	scripts/fuzz $(FUZZ_SECONDS)

# ...and briefly, within `make test`.
fuzz-smoke: deps
	scripts/fuzz 10

demo: deps build guest
	$(SANDBOX) scripts/demo

# Throughput, CPU and control-plane figures, written to bench/results/.
# BENCH_ARGS passes options, e.g. BENCH_ARGS="--only linnet --runs 5".
bench: deps build
	scripts/install-deps bench
	$(SANDBOX) bench/run $(BENCH_ARGS)

# The binaries, systemd units, man pages and completions under
# $(DESTDIR)$(PREFIX) (units: $(UNITDIR)), for distributions without the
# Debian package.
PREFIX ?= /usr/local
UNITDIR ?= $(PREFIX)/lib/systemd/system
install: build
	scripts/install-files target/release "$(DESTDIR)" "$(PREFIX)" "$(UNITDIR)"
	@echo "linnet: installed. Make the group whose members may attach (the networks' default allow) and start the daemon:"
	@echo "  groupadd --system linnet    # or: addgroup --system linnet"
	@echo "  systemctl daemon-reload && systemctl enable --now linnet.socket && systemctl enable linnet.service"

# The Debian package, in target/deb (scripts/build-deb says why dpkg-deb).
deb: build
	scripts/build-deb target/release target/deb

clean:
	$(CARGO) clean
