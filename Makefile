# runtime-contract: the two commands a newcomer needs are
#   make check-runtime-contract   the main job: every scenario against our implementation
#   make check                    what CI runs: fmt, clippy, docs, unit tests, the contract run
#   make fuzz                     long coverage-guided fuzzing of every decoder (fuzz/)
# Everything the targets need is installed by ci/setup.sh (idempotent, registries only).

CARGO   ?= cargo
# Honour CARGO_TARGET_DIR so the binaries run are the ones just built.
TARGET  := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/debug
HARNESS := $(TARGET)/contract-harness
IMPL    := $(TARGET)/contract-impl
FAMILY  ?= core_runtime
SIDE    ?= runtime
JOBS    ?=
HARNESS_ARGS ?=

.PHONY: check-runtime-contract check setup api-check mutants build test lint fmt fmt-check clippy doc proto-check proto-baseline \
        contract contract-refusals contract-core contract-worker contract-worker-host contract-engine contract-engine-client contract-plugin contract-plugin-python contract-plugin-go contract-plugin-host go-check coverage fuzz fuzz-seeds fuzz-smoke golden-review golden-accept golden-stable schema bench package clean

## The main job: build everything, replay every scenario against our binaries, print coverage.
check-runtime-contract: setup build contract contract-refusals contract-core contract-worker contract-worker-host contract-engine contract-engine-client contract-plugin contract-plugin-python contract-plugin-go contract-plugin-host coverage

## What CI runs (.ci/run): formatting, lints, docs, schema checks, unit tests, the
## contract suite (the Go and Python fixture plugins included), the property-based check
## of Core's public API and a bounded smoke run of every fuzz target.
check: setup fmt-check clippy go-check doc proto-check test api-check fuzz-smoke

setup:
	@ci/setup.sh

## Core's public API against its OpenAPI document (docs/core-api.openapi.yaml): a live
## Core with our Runtime connected, schemathesis with a fixed seed and API_EXAMPLES cases
## per operation; no 5xx but documented 503s, no hang, no answer the document forbids.
API_EXAMPLES ?= 100
api-check: build
	ci/api-check.sh $(IMPL) $(API_EXAMPLES)

build:
	$(CARGO) build --workspace --bins

## Replays scenarios/$(FAMILY) against `contract-impl runtime` through the launch contract.
contract: build
	$(HARNESS) run --family $(FAMILY) --side $(SIDE) \
	  --target-cmd '$(IMPL) runtime' $(if $(JOBS),--jobs $(JOBS)) $(HARNESS_ARGS)

## The refusal scenarios (`requires:` a capability `false`, not applicable to a Runtime
## that supports everything) against our Runtime, each launched lacking exactly the
## capabilities it requires `false` and declaring every other (`run --refusals`). The
## other scenarios' goldens record the full declaration, so only the refusals run here.
contract-refusals: build
	$(HARNESS) run --family core_runtime --side runtime --refusals \
	  --target-cmd '$(IMPL) runtime' $(if $(JOBS),--jobs $(JOBS)) $(HARNESS_ARGS)

## The same scenarios with Core as the target (`contract-impl core serve`; the harness plays
## the Runtime). Scenarios pending on side core are listed, not run.
contract-core: build
	$(HARNESS) run --family $(FAMILY) --side core \
	  --target-cmd '$(IMPL) core serve' $(if $(JOBS),--jobs $(JOBS)) $(HARNESS_ARGS)

## The worker family with our Python worker as the target (the harness plays the host).
contract-worker: build
	$(HARNESS) run --family worker --side worker \
	  --target-cmd '$(IMPL) worker python' $(if $(JOBS),--jobs $(JOBS)) $(HARNESS_ARGS)

## The worker family with our host as the target (the harness plays every worker it
## launches and drives it over its control channel, docs/worker-host-control.md).
contract-worker-host: build
	$(HARNESS) run --family worker --side host \
	  --target-cmd '$(IMPL) worker host' $(if $(JOBS),--jobs $(JOBS)) $(HARNESS_ARGS)

## The engine family with our daemon as the target (the harness plays its client over the
## Unix socket, docs/engine-launch-contract.md).
contract-engine: build
	$(HARNESS) run --family engine --side daemon \
	  --target-cmd '$(IMPL) engine serve' $(if $(JOBS),--jobs $(JOBS)) $(HARNESS_ARGS)

## The engine family with our client as the target (the harness plays its daemon and drives
## the client over its control channel, docs/engine-client-control.md).
contract-engine-client: build
	$(HARNESS) run --family engine --side client \
	  --target-cmd '$(IMPL) engine controlled' $(if $(JOBS),--jobs $(JOBS)) $(HARNESS_ARGS)

## The plugin family with our Rust fixture plugin as the target (the harness plays its
## host: launch secret, handshake line, calls; docs/plugin-launch-contract.md).
contract-plugin: build
	$(HARNESS) run --family plugin --side plugin \
	  --target-cmd '$(IMPL) plugin fixture' $(if $(JOBS),--jobs $(JOBS)) $(HARNESS_ARGS)

## The same scenarios and goldens with the Python fixture plugin (grpcio, on Python
## 3.12+, from the virtual environment ci/setup.sh installs) as the target: one black-box
## suite, every language ("Go and Python 3.12+ fixtures must pass the same black-box
## conformance suite").
contract-plugin-python: build
	$(HARNESS) run --family plugin --side plugin \
	  --target-cmd '$(CURDIR)/.tools/py/bin/python $(CURDIR)/impl/src/plugin/python/conformance_plugin.py' \
	  $(if $(JOBS),--jobs $(JOBS)) $(HARNESS_ARGS)

## The same scenarios and goldens with the Go fixture plugin (grpc-go, built from Debian's
## packages by ci/setup.sh, impl/src/plugin/go/conformance_plugin) as the target.
contract-plugin-go: build
	$(HARNESS) run --family plugin --side plugin \
	  --target-cmd '$(CURDIR)/.tools/go/bin/conformance-plugin-go' \
	  $(if $(JOBS),--jobs $(JOBS)) $(HARNESS_ARGS)

## The plugin family with our host as the target (the harness plays every plugin process
## it launches, through the relay, and drives it over its control channel,
## docs/plugin-host-control.md).
contract-plugin-host: build
	$(HARNESS) run --family plugin --side host \
	  --target-cmd '$(IMPL) plugin host' $(if $(JOBS),--jobs $(JOBS)) $(HARNESS_ARGS)

## Requirement coverage of every family.
coverage: build
	$(HARNESS) coverage --family core_runtime
	$(HARNESS) coverage --family worker
	$(HARNESS) coverage --family engine
	$(HARNESS) coverage --family plugin

## Both crates as packages that could be published (the harness carrying its scenarios,
## catalogs, features files and goldens; the implementation its schemas), each built
## from its package alone.
package:
	$(CARGO) package -p contract-impl -p contract-harness

## Unit tests of both crates plus harness/tests/contract.rs (one trial per scenario × side).
test:
	$(CARGO) test --workspace

lint: fmt-check clippy doc proto-check

## Schema governance (engine-protocol.md, "Compatibility"): buf lint, and buf breaking
## against the committed baseline image. After a deliberate, compatible schema change,
## `make proto-baseline` records the new baseline.
BUF ?= $(CURDIR)/.tools/node_modules/.bin/buf
proto-check:
	cd proto && $(BUF) lint && $(BUF) breaking --against baseline.binpb

proto-baseline:
	cd proto && $(BUF) build -o baseline.binpb

# The fuzz crate (fuzz/) is its own workspace: formatted with the main one.
fmt:
	$(CARGO) fmt --all
	cd fuzz && $(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all --check
	cd fuzz && $(CARGO) fmt --all --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## The Go fixture plugin's sources: gofmt, go vet and its unit tests, in the GOPATH
## ci/setup.sh generated the schema's Go code into (Debian's Go, GOPATH mode).
GO         ?= /usr/bin/go
GOFMT      ?= /usr/bin/gofmt
GO_FIXTURE := ./impl/src/plugin/go/conformance_plugin
GO_ENV     := GOPATH='$(CURDIR)/.tools/go:/usr/share/gocode' GO111MODULE=off GOFLAGS= GOPROXY=off GOCACHE='$(CURDIR)/.tools/go/cache'
go-check:
	@test -z "$$($(GOFMT) -l impl/src/plugin/go)" || { $(GOFMT) -l impl/src/plugin/go; echo "go-check: run gofmt -w impl/src/plugin/go"; exit 1; }
	$(GO_ENV) $(GO) vet $(GO_FIXTURE)
	$(GO_ENV) $(GO) test -count=1 $(GO_FIXTURE)

doc:
	RUSTDOCFLAGS='-D warnings' $(CARGO) doc --workspace --no-deps --quiet

## Fuzzing (fuzz/, cargo-fuzz and libFuzzer; cargo-fuzz installed by ci/setup.sh). One
## coverage-guided target per decoder: strict_json (the strict JSON decoder),
## core_runtime_frame (Frame::decode both directions, decode_envelope), launch_config (the
## Runtime's and Core's configuration parsers) and scenario_loader (parse_scenario). Each
## asserts properties beyond "never panics" (round trips, the bounds a parse promises).
##
## `make fuzz-seeds` extracts the seed corpus from scenarios/, golden/ and docs/ into
## fuzz/corpus/<target>/ (git-ignored, regenerated; entries found by `make fuzz` stay).
## Committed hand-written seeds are in fuzz/seeds/<target>/, and every input that ever
## crashed a target is in fuzz/regressions/<target>/ (with a unit test beside its decoder).
##
## `make fuzz-smoke` (part of `make check`): the stable toolchain, no sanitizer; each
## target replays every seed and regression, then runs a fixed number of inputs with a
## fixed seed (FUZZ_SMOKE: target:runs, each capped at FUZZ_SMOKE_SECONDS), and fails on any
## crash (the input is kept in fuzz/artifacts/<target>/). Its build has its own target
## directory, <target dir>/fuzz, so it never rebuilds the main binaries and stays warm.
##
## `make fuzz`: each target for FUZZ_SECONDS (default 300), adding what it finds to
## fuzz/corpus/<target>/; with nightly's address sanitizer when a nightly toolchain is
## installed, else as the smoke run. A crash stops it; reproduce with
## `.tools/cargo/bin/cargo-fuzz fuzz run --sanitizer none <target> fuzz/artifacts/<target>/crash-…`,
## fix the decoder (a typed error, never a panic), add the input to
## fuzz/regressions/<target>/ and a unit test beside the decoder.
CARGO_FUZZ ?= $(CURDIR)/.tools/cargo/bin/cargo-fuzz
FUZZ_DIR   := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/fuzz
FUZZ_TARGETS := strict_json core_runtime_frame launch_config scenario_loader
# target:runs of the smoke run (ten to twenty seconds each on 2 cores).
FUZZ_SMOKE ?= strict_json:200000 core_runtime_frame:100000 launch_config:200000 scenario_loader:20000
FUZZ_SMOKE_SECONDS ?= 30
FUZZ_SECONDS ?= 300
# Long runs: nightly's address sanitizer when nightly is there (its own target directory,
# so the smoke build stays warm), else the smoke run's stable build.
FUZZ_NIGHTLY = $(shell rustc +nightly --version >/dev/null 2>&1 && echo yes)
FUZZ_LONG    = $(if $(FUZZ_NIGHTLY),RUSTUP_TOOLCHAIN=nightly $(CARGO_FUZZ) fuzz run --target-dir $(FUZZ_DIR)-asan,$(CARGO_FUZZ) fuzz run --sanitizer none --target-dir $(FUZZ_DIR))

fuzz-seeds:
	@$(CARGO) run --quiet --manifest-path fuzz/Cargo.toml -p contract-fuzz-seeds \
	  --target-dir $(FUZZ_DIR) -- $(CURDIR) $(CURDIR)/fuzz/corpus

fuzz-smoke: fuzz-seeds
	@$(CARGO_FUZZ) fuzz build --sanitizer none --target-dir $(FUZZ_DIR)
	@for spec in $(FUZZ_SMOKE); do \
	  t=$${spec%%:*}; runs=$${spec#*:}; \
	  scratch=$(FUZZ_DIR)/smoke/$$t; rm -rf $$scratch; \
	  mkdir -p $$scratch fuzz/corpus/$$t fuzz/seeds/$$t fuzz/regressions/$$t fuzz/artifacts/$$t; \
	  if $(CARGO_FUZZ) fuzz run --sanitizer none --target-dir $(FUZZ_DIR) $$t \
	       $$scratch fuzz/corpus/$$t fuzz/seeds/$$t fuzz/regressions/$$t -- \
	       -runs=$$runs -seed=1 -max_total_time=$(FUZZ_SMOKE_SECONDS) -timeout=10 \
	       >$$scratch.log 2>&1; then \
	    echo "fuzz-smoke $$t: $$(grep -o 'Done [0-9]* runs in [0-9]* second(s)' $$scratch.log)"; \
	  else \
	    grep -v '^#[0-9]' $$scratch.log | tail -40; \
	    echo "fuzz-smoke $$t: FAILED (log $$scratch.log, input in fuzz/artifacts/$$t/)"; exit 1; \
	  fi; \
	done

fuzz: setup fuzz-seeds
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/corpus/$$t fuzz/seeds/$$t fuzz/regressions/$$t fuzz/artifacts/$$t; \
	  echo "fuzz $$t: $(FUZZ_SECONDS) s$(if $(FUZZ_NIGHTLY), (nightly, address sanitizer))"; \
	  $(FUZZ_LONG) $$t fuzz/corpus/$$t fuzz/seeds/$$t fuzz/regressions/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) -timeout=10 -print_final_stats=1 || exit 1; \
	done

## Replays every family and side of the registry (`contract-harness sides`) against our
## binaries, writes `<golden>.pending` for every changed or missing golden, shows the raw
## diffs, then the wire-change report (`golden changes`: per scenario, step and field,
## with the requirements each scenario covers). `GOLDEN_FAMILY=engine` limits the replay.
GOLDEN_FAMILY ?=
golden-review: build
	-$(HARNESS) golden refresh --impl '$(IMPL)' $(if $(GOLDEN_FAMILY),--family $(GOLDEN_FAMILY))
	$(HARNESS) golden review
	$(HARNESS) golden changes

## Moves every reviewed `.pending` golden (every family, every side) into place.
golden-accept: build
	$(HARNESS) golden accept

## Goldens must not depend on load: every scenario of every side replayed one at a time
## and in parallel writes byte-identical goldens (`make check` runs a sample of it).
golden-stable: build
	$(HARNESS) golden stable --impl '$(IMPL)' 

## Prints the JSON Schemas of the wires for third parties.
schema: build
	$(IMPL) schema core_runtime
	$(IMPL) schema worker

## Speed against the floor on this machine (never part of the tests): the host ↔ worker
## round trip of an empty cell and of a host request against a bare framed ping-pong; the
## engine daemon's unary round trip, event replay and durable writes against a bare tonic
## server on the same kind of socket and batched SQLite; a plugin Execute through our host
## and SDK against a bare tonic unary call.
bench:
	$(CARGO) build --release --workspace --bins
	$(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/release/contract-impl core bench
	$(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/release/contract-impl worker bench
	$(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/release/contract-impl engine bench
	$(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/release/contract-impl plugin bench

## Mutation testing of the protocol modules (not part of `make check`): cargo-mutants
## (installed by `ci/setup.sh --mutants`) mutates impl/src/core_runtime/{daemon,gateway,
## wire} and impl/src/wire (.cargo/mutants.toml) and judges each mutant by the scenario
## suite of both sides (impl/tests/mutants_scenarios.rs), with a harness built once from
## the unmutated tree. MUTANTS_SHARD picks a fixed sample (round-robin shard k/n of the
## mutants, the same every run); then the kill rate per directory and every survivor.
MUTANTS_SHARD ?= 0/80
MUTANTS_OUT   ?= $(CURDIR)/target/mutants
mutants: build
	@ci/setup.sh --mutants
	mkdir -p $(MUTANTS_OUT)
	cp $(HARNESS) $(MUTANTS_OUT)/contract-harness-unmutated
	CONTRACT_MUTANTS_HARNESS=$(MUTANTS_OUT)/contract-harness-unmutated \
	  CARGO_TARGET_DIR=$(MUTANTS_OUT)/target \
	  .tools/cargo/bin/cargo-mutants mutants --package contract-impl \
	  --shard $(MUTANTS_SHARD) --sharding round-robin --output $(MUTANTS_OUT) --no-shuffle \
	  --cargo-arg=--test=mutants_scenarios -- -- --ignored || true
	python3 ci/mutants-report.py $(MUTANTS_OUT)/mutants.out

clean:
	$(CARGO) clean
