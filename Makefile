# warren — see README.md. Every target works on a fresh clone with Go installed.
GO      ?= go
PKGS    ?= ./...
TESTFLAGS ?=

.PHONY: all build image run test lint proto bench bench-sandbox bench-egress bench-logstore bench-appends bench-failover bench-recovery bench-capacity bench-capacity-ci clean

all: build

build:
	$(GO) build -o bin/warren ./cmd/warren

# The demo (deploy/demo.sh): warren dev with real sandboxes, an agent task on
# a small buggy repository, its tests, diff checks, the branch pushed to a
# local remote and the PR record printed.
run: build bin/warren-guest
	./deploy/demo.sh

# Every test, with the race detector and the invariant checks compiled in.
test: lint
	$(GO) test -race -tags invariants -timeout 15m $(TESTFLAGS) $(PKGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags invariants $(PKGS)

# Regenerate the protobuf and Connect code (committed) with the pinned buf.
proto:
	$(GO) tool buf generate

bench: bench-logstore bench-appends bench-failover bench-recovery

bench-logstore:
	cd bench/logstore && $(GO) run . -out ../results/logstore.md

bench-appends:
	$(GO) run ./bench/appends -out bench/results/appends.md

bench-failover:
	$(GO) run ./bench/failover -out bench/results/failover.md

bench-recovery:
	$(GO) run ./bench/recovery -runs 3 -out bench/results/recovery.md

# The capacity benchmark (warren bench capacity): the default preset takes
# a long time; bench-capacity-ci is the small one CI runs.
bench-capacity: build
	./bin/warren bench capacity --preset default --out bench/results

bench-capacity-ci: build
	./bin/warren bench capacity --preset ci --out bench/results

clean:
	rm -rf bin .warren

# The guest agent, static: it is /init of every microVM.
bin/warren-guest: $(shell find guest cmd/warren-guest -name '*.go') go.mod
	CGO_ENABLED=0 $(GO) build -o bin/warren-guest ./cmd/warren-guest

# The guest template: kernel, initramfs and debootstrap root file system,
# in $WARREN_IMAGE_DIR (default /var/lib/warren/templates). Needs root,
# debootstrap, e2fsprogs, xz-utils, qemu-system-x86 and qemu-utils; .ci/run
# installs them. The kernel is warren's own, in two builds: SMP for guests
# with several vCPUs and uniprocessor for one-vCPU guests, the snapshot's
# and its clones' (deploy/kernel/build.sh [--up], from Debian's
# linux-source-6.1 with bc, bison, flex and libelf-dev: about 9 minutes
# each on 2 cores the first time, then cached under build/kernel) where
# that package is installed, or, without it or with KERNEL=debian, Debian's
# linux-image-amd64 alone.
KERNEL ?= warren
image: build bin/warren-guest
	@set -- --name default; \
	if [ "$(KERNEL)" != debian ] && [ -f /usr/src/linux-source-6.1.tar.xz ]; then \
		k=$$(./deploy/kernel/build.sh) || exit 1; \
		u=$$(./deploy/kernel/build.sh --up) || exit 1; \
		set -- "$$@" --kernel "$$k" --modules "$$(dirname "$$k")/modules/$${k##*/vmlinuz-}" \
			--kernel-up "$$u" --modules-up "$$(dirname "$$u")/modules/$${u##*/vmlinuz-}"; \
	elif [ "$(KERNEL)" != debian ]; then \
		echo "image: /usr/src/linux-source-6.1.tar.xz is missing, so the guest gets Debian's kernel (apt-get install linux-source-6.1 bc bison flex libelf-dev for warren's own, which restores clones faster: docs/sandboxes.md)"; \
	fi; \
	echo ./bin/warren image build "$$@"; \
	./bin/warren image build "$$@"

# Sandbox latency and memory: cold boot, snapshot restore, warm claim, the
# containerd+runc peer, PSS at 10 and 50 sandboxes (root, `make image`).
bench-sandbox:
	$(GO) run ./bench/sandbox -out bench/results/sandbox.md

# Per-sandbox network setup and teardown, with and without the namespace
# pool (root; the node side runs in a namespace of its own).
bench-egress:
	$(GO) run ./bench/egress -out bench/results/egress.md
