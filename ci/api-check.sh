#!/usr/bin/env bash
# Property-based check of Core's public API against docs/core-api.openapi.yaml.
#
# Starts `contract-impl core serve` on loopback with a fresh data directory and a Project
# API key, connects our Runtime to it as a device (so device-bound routes answer, not
# only `no_device`), and runs schemathesis (installed by ci/setup.sh) with a fixed seed
# and a bounded number of examples per operation. Fails on any 5xx other than a
# documented 503, a response that contradicts the schema, a request the schema calls
# invalid that Core accepts, an operation reachable without the key, or a hang
# (every request is bounded by --request-timeout).
#
# usage: ci/api-check.sh IMPL [MAX_EXAMPLES]
set -euo pipefail

IMPL=${1:?usage: ci/api-check.sh IMPL [MAX_EXAMPLES]}
EXAMPLES=${2:-25}
ST=".tools/st/bin/schemathesis"
SPEC="docs/core-api.openapi.yaml"

work=$(mktemp -d)
chmod 700 "$work"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

key="proj_$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
secret="daemon_$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"

# Core, on an ephemeral loopback port; the ready line names its base URL.
mkfifo "$work/core.out"
CONTRACT_API_KEY="$key" CONTRACT_DEVICE_ID=device-api-check CONTRACT_DAEMON_CREDENTIAL="$secret" \
  "$IMPL" core serve --listen 127.0.0.1:0 --data-dir "$work/core" \
  >"$work/core.out" 2>"$work/core.log" &
pids+=($!)
base=""
while IFS= read -r line; do
  base=$(printf '%s' "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ready"]["base_url"])' 2>/dev/null || true)
  [ -n "$base" ] && break
done <"$work/core.out"
[ -n "$base" ] || { echo "api-check: Core never printed its ready line" >&2; cat "$work/core.log" >&2; exit 1; }
# Keep draining Core's stdout so it never blocks on a full pipe.
cat "$work/core.out" >/dev/null &
pids+=($!)

# Our Runtime, connected as device-api-check with a self-hosted workspace.
mkdir -m 700 "$work/workspace"
CONTRACT_CORE_URL="$base" CONTRACT_DEVICE_ID=device-api-check CONTRACT_DAEMON_CREDENTIAL="$secret" \
  "$IMPL" runtime --workspace "$work/workspace" --adapter command --command-program cat \
  >"$work/runtime.out" 2>"$work/runtime.log" &
pids+=($!)

# Wait (bounded) until Core has applied the Runtime's declaration.
for _ in $(seq 1 100); do
  if python3 - "$base" "$key" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/v1/devices/device-api-check",
                             headers={"Authorization": "Bearer " + sys.argv[2]})
try:
    with urllib.request.urlopen(req, timeout=2) as r:
        sys.exit(0 if json.load(r)["declaration_known"] else 1)
except Exception:
    sys.exit(1)
PY
  then ready=1; break; fi
  sleep 0.1
done
[ "${ready:-}" = 1 ] || { echo "api-check: the Runtime never declared itself to Core" >&2; tail -20 "$work/runtime.log" >&2; exit 1; }

# A Session on the Runtime's own Environment binding (its launch default), so the files
# and environment operations reach a real workspace instead of only refusals.
ids=$(python3 - "$base" "$key" <<'PY'
import json, sys, urllib.request
base, key = sys.argv[1], sys.argv[2]
def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)
env = post("/v1/environments", {"type": "self_hosted",
                                "environment_id": "00000000-0000-4000-8000-000000000001"})
agent = post("/v1/agents", {"agent_kind": "command", "model": "m", "system_prompt": "p"})
session = post("/v1/sessions", {"agent_id": agent["agent_id"], "environment_id": env["environment_id"]})
print(env["environment_id"], session["session_id"])
PY
)
read -r env_id session_id <<<"$ids"

# A credential of a second device, for the revocation route to revoke for real (200, then
# 409 already_revoked) without ending the connected device's connection.
revoke_id=$("$IMPL" core credential issue --data-dir "$work/core" --device-id device-api-revoke \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["credential_id"])')

run_st() {
  API_KEY="$key" ENV_ID="$env_id" SESSION_ID="$session_id" REVOKE_ID="$revoke_id" "$ST" --config-file ci/schemathesis.toml \
    run "$SPEC" --url "$base" \
    --max-examples "$EXAMPLES" --seed 20261203 --generation-database none \
    --request-timeout 20 --no-color \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,negative_data_rejection,ignored_auth,unsupported_method,missing_required_header \
    "$@" ${API_CHECK_ARGS:-}
}
# Everything but `quiesce` first: a quiesced Environment refuses every later admission,
# which would leave the files operations nothing but `preparation_refused`. Then the
# fences alone.
run_st --exclude-operation-id quiesceEnvironment \
  --report junit --report-junit-path "${API_CHECK_JUNIT:-$work/junit.xml}"
run_st --include-operation-id quiesceEnvironment --include-operation-id resumeEnvironment \
  --phases examples,coverage,fuzzing \
  --report junit --report-junit-path "${API_CHECK_JUNIT:-$work/junit}-fences.xml"
