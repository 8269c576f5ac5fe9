#!/usr/bin/env bash
# Idempotent set-up for `make check` and `make check-runtime-contract`.
# Installs only from the package registries; prints nothing when all is in place.
set -euo pipefail

need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "setup: '$1' is required but not installed ($2)" >&2
    exit 1
  fi
}

need cargo "the Rust toolchain (cargo, rustc)"
# The end-to-end test's example Harness program (impl/tests/fixtures/echo_agent.py) is
# stdlib-only Python.
need python3 "CPython 3 (standard library only), for the example command Harness program"
# rustfmt and clippy ship as toolchain components; report clearly if they are absent.
cargo fmt --version >/dev/null 2>&1 || { echo "setup: rustfmt component missing (rustup component add rustfmt)" >&2; exit 1; }
cargo clippy --version >/dev/null 2>&1 || { echo "setup: clippy component missing (rustup component add clippy)" >&2; exit 1; }

# buf (schema lint and breaking checks of proto/), pinned, from the npm registry into
# .tools/ (git-ignored). Installed once; later runs find it in place.
BUF_VERSION=1.75.0
BUF=".tools/node_modules/.bin/buf"
if [ "$("$BUF" --version 2>/dev/null || true)" != "$BUF_VERSION" ]; then
  need npm "Node.js's npm, to install buf from the npm registry"
  npm install --prefix .tools --no-audit --no-fund --silent --no-save "@bufbuild/buf@$BUF_VERSION" >/dev/null
  [ "$("$BUF" --version 2>/dev/null || true)" = "$BUF_VERSION" ] || { echo "setup: buf $BUF_VERSION did not install" >&2; exit 1; }
fi

# grpcio and grpcio-tools (the independent Python client of the engine daemon's test),
# pinned, from the Python package registry into a virtual environment in .tools/py.
GRPCIO_VERSION=1.85.1
PY=".tools/py/bin/python"
if [ "$("$PY" -c 'import grpc, grpc_tools; print(grpc.__version__)' 2>/dev/null || true)" != "$GRPCIO_VERSION" ]; then
  python3 -m venv .tools/py
  "$PY" -m pip install --quiet --disable-pip-version-check "grpcio==$GRPCIO_VERSION" "grpcio-tools==$GRPCIO_VERSION" >/dev/null
  [ "$("$PY" -c 'import grpc, grpc_tools; print(grpc.__version__)' 2>/dev/null || true)" = "$GRPCIO_VERSION" ] || { echo "setup: grpcio $GRPCIO_VERSION did not install" >&2; exit 1; }
fi

# schemathesis (the property-based check of Core's public API against
# docs/core-api.openapi.yaml, ci/api-check.sh), pinned, from the Python package registry
# into its own virtual environment in .tools/st.
SCHEMATHESIS_VERSION=4.32.5
ST=".tools/st/bin/schemathesis"
if [ "$("$ST" --version 2>/dev/null || true)" != "schemathesis, version $SCHEMATHESIS_VERSION" ]; then
  python3 -m venv .tools/st
  .tools/st/bin/python -m pip install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION" >/dev/null
  [ "$("$ST" --version 2>/dev/null || true)" = "schemathesis, version $SCHEMATHESIS_VERSION" ] || { echo "setup: schemathesis $SCHEMATHESIS_VERSION did not install" >&2; exit 1; }
fi

# A cargo-installed tool, pinned, from the Rust package registry into .tools/cargo:
# cargo_tool CRATE VERSION VERSION_COMMAND... (quiet unless the install fails; cargo warns
# that .tools/cargo/bin is not on PATH).
cargo_tool() {
  local crate=$1 version=$2; shift 2
  if [ "$("$@" 2>/dev/null || true)" != "$crate $version" ]; then
    if ! log=$(cargo install --quiet --locked --root .tools/cargo "$crate" --version "$version" 2>&1); then
      echo "$log" >&2
    fi
    [ "$("$@" 2>/dev/null || true)" = "$crate $version" ] || { echo "setup: $crate $version did not install" >&2; exit 1; }
  fi
}

# cargo-fuzz (the fuzz targets of fuzz/: `make fuzz-smoke`, `make fuzz`). It runs on the
# stable toolchain without a sanitizer (`--sanitizer none`); `make fuzz` uses nightly's
# address sanitizer when a nightly toolchain happens to be installed.
cargo_tool cargo-fuzz 0.13.2 .tools/cargo/bin/cargo-fuzz --version

# cargo-mutants (`make mutants` only: `ci/setup.sh --mutants`).
if [ "${1:-}" = "--mutants" ]; then
  cargo_tool cargo-mutants 27.1.0 .tools/cargo/bin/cargo-mutants mutants --version
fi
