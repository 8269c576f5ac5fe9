#!/usr/bin/env bash
# Idempotent set-up for `make check` and `make check-runtime-contract`.
# Installs only from the package registries (npm, PyPI, crates.io, and Debian's archive
# through apt-get for the Go fixture plugin); prints nothing when all is in place.
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

# The Python fixture plugin (impl/src/plugin/python/conformance_plugin.py) runs on
# Python 3.12+ (plugin-protocol.md: "Go and Python 3.12+ fixtures must pass the same
# black-box conformance suite"): .tools/py is made from the newest CPython >= 3.12 found
# (on PATH, in /usr/bin or /usr/local/bin, or a pyenv version), never from an older one.
# python_312: the path of that interpreter, or nothing.
python_312() {
  local roots=() candidates=() c best="" best_version=0 version
  command -v pyenv >/dev/null 2>&1 && roots+=("$(pyenv root 2>/dev/null || true)")
  roots+=("${PYENV_ROOT:-}" "${HOME:-/root}/.pyenv")
  for c in python3.{12..19} python3; do
    command -v "$c" >/dev/null 2>&1 && candidates+=("$(command -v "$c")")
  done
  for c in /usr/bin/python3.1[2-9] /usr/local/bin/python3.1[2-9]; do
    candidates+=("$c")
  done
  for root in "${roots[@]}"; do
    [ -n "$root" ] || continue
    for c in "$root"/versions/3.1[2-9]*/bin/python3; do
      candidates+=("$c")
    done
  done
  for c in "${candidates[@]}"; do
    [ -x "$c" ] || continue
    # A pyenv shim of a version that is not selected fails here and is skipped; the
    # interpreter's own path is what the virtual environment is made from.
    version=$("$c" -c 'import sys, venv, ensurepip; v = sys.version_info; print(v[0] * 1000 + v[1], sys.executable)' 2>/dev/null) || continue
    if [ "${version%% *}" -ge 3012 ] && [ "${version%% *}" -gt "$best_version" ]; then
      best_version=${version%% *}
      best=${version#* }
    fi
  done
  [ -n "$best" ] && echo "$best"
}

# grpcio and grpcio-tools (the Python fixture plugin, and the independent Python client
# of the engine daemon's test), pinned, from the Python package registry into a virtual
# environment in .tools/py (on Python 3.12+; one of an older Python is made again).
GRPCIO_VERSION=1.85.1
PY=".tools/py/bin/python"
py_ready() {
  "$PY" -c 'import sys, grpc, grpc_tools; assert sys.version_info >= (3, 12); print(grpc.__version__)' 2>/dev/null || true
}
if [ "$(py_ready)" != "$GRPCIO_VERSION" ]; then
  PYTHON312=$(python_312) || true
  if [ -z "$PYTHON312" ]; then
    echo "setup: CPython 3.12 or newer is required for .tools/py (the Python fixture plugin); none found as python3.12+ on PATH, in /usr/bin, /usr/local/bin or a pyenv version" >&2
    exit 1
  fi
  "$PYTHON312" -m venv --clear .tools/py
  "$PY" -m pip install --quiet --disable-pip-version-check "grpcio==$GRPCIO_VERSION" "grpcio-tools==$GRPCIO_VERSION" >/dev/null
  [ "$(py_ready)" = "$GRPCIO_VERSION" ] || { echo "setup: grpcio $GRPCIO_VERSION did not install on $PYTHON312" >&2; exit 1; }
fi

# The Go fixture plugin (impl/src/plugin/go/conformance_plugin), built from Debian's
# packages alone, in GOPATH mode: Go 1.19, grpc-go 1.33 and the protobuf API v2 (their
# sources under /usr/share/gocode), protoc and its Go plugins. Missing packages are
# installed with apt-get (its package lists updated first, once); the schema's Go code
# is generated from proto/ into .tools/go (a GOPATH) and the binary built to
# .tools/go/bin/conformance-plugin-go, again only when its sources, the protos or the
# toolchain changed (a SHA-256 stamp).
GO_DEBS=(golang-go golang-google-grpc-dev golang-google-protobuf-dev protoc-gen-go protoc-gen-go-grpc protobuf-compiler)
go_debs_missing() {
  local p
  for p in "${GO_DEBS[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = "install ok installed" ] || echo "$p"
  done
}
missing=$(command -v dpkg-query >/dev/null 2>&1 && go_debs_missing || echo "${GO_DEBS[*]}")
if [ -n "$missing" ]; then
  need apt-get "Debian's apt, to install the Go fixture plugin's packages (${missing//$'\n'/ })"
  # shellcheck disable=SC2086 # one word per package
  if ! log=$( { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing; } </dev/null 2>&1); then
    echo "$log" >&2
    echo "setup: installing $(echo $missing) with apt-get failed (run as root)" >&2
    exit 1
  fi
  [ -z "$(go_debs_missing)" ] || { echo "setup: $(echo $(go_debs_missing)) did not install" >&2; exit 1; }
fi
GO_PATH="$PWD/.tools/go"
GO_PLUGIN="$GO_PATH/bin/conformance-plugin-go"
GO_STAMP="$GO_PATH/conformance-plugin-go.sha256"
GO_PROTOS=(common/v1/common.proto plugin/v1/plugin.proto)
go_inputs() {
  # The recipe's version, the sources, the protos, and the toolchain's packages.
  echo "recipe 1"
  find impl/src/plugin/go -type f -name '*.go' | LC_ALL=C sort | xargs sha256sum
  (cd proto && sha256sum "${GO_PROTOS[@]}")
  dpkg-query -W -f='${Package} ${Version}\n' "${GO_DEBS[@]}"
}
go_sha=$(go_inputs | sha256sum | cut -d' ' -f1)
if [ ! -x "$GO_PLUGIN" ] || [ "$(cat "$GO_STAMP" 2>/dev/null || true)" != "$go_sha" ]; then
  rm -rf "$GO_PATH/src/runtimecontract"
  mkdir -p "$GO_PATH/src" "$GO_PATH/bin"
  # Each schema file's Go package (proto/ declares no go_package).
  go_packages="Mcommon/v1/common.proto=runtimecontract/proto/common/v1;commonv1,Mplugin/v1/plugin.proto=runtimecontract/proto/plugin/v1;pluginv1"
  if ! log=$(/usr/bin/protoc -Iproto \
      --plugin=protoc-gen-go=/usr/bin/protoc-gen-go --go_out="$GO_PATH/src" --go_opt="$go_packages" \
      --plugin=protoc-gen-go-grpc=/usr/bin/protoc-gen-go-grpc --go-grpc_out="$GO_PATH/src" --go-grpc_opt="$go_packages" \
      "${GO_PROTOS[@]}" 2>&1) ||
    ! log=$(GOPATH="$GO_PATH:/usr/share/gocode" GO111MODULE=off GOFLAGS= GOPROXY=off GOCACHE="$GO_PATH/cache" \
      /usr/bin/go build -trimpath -o "$GO_PLUGIN.new" ./impl/src/plugin/go/conformance_plugin 2>&1); then
    echo "$log" >&2
    echo "setup: the Go fixture plugin did not build" >&2
    exit 1
  fi
  mv -f "$GO_PLUGIN.new" "$GO_PLUGIN"
  echo "$go_sha" >"$GO_STAMP"
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
