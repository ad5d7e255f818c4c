# linnet — two commands on a fresh machine (as root):
#   make demo   start VMs' networks and show them working
#   make test   unit tests, then the integration suite in throwaway namespaces

CARGO ?= cargo
SANDBOX := scripts/sandbox

.PHONY: all build guest deps test unit integration lint demo clean

all: build

build:
	$(CARGO) build --workspace --release

deps:
	scripts/install-deps

# The tiny test/demo VM (kernel + initramfs from Debian packages), rebuilt
# only when its inputs change.
guest: deps
	scripts/build-guest

unit:
	$(CARGO) test --workspace

# The integration suite creates bridges, rules and sysctls: it runs only
# inside scripts/sandbox, whose namespaces vanish when it ends.
integration: deps guest
	$(CARGO) build --workspace --bins --tests
	$(SANDBOX) $(CARGO) test --offline --test integration -- --test-threads=2

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# The integration suite is test = false, so --all-targets skips it.
	$(CARGO) clippy --test integration -- -D warnings

test: deps lint unit integration

demo: deps build guest
	$(SANDBOX) scripts/demo

clean:
	$(CARGO) clean
