#!/usr/bin/env python3
"""The Python fixture plugin of `plugin.v1`: the conformance tool set on grpcio.

This is the second implementation of the plugin side of the plugin protocol
(`plugin-protocol.md`, "RFC 0005: Runtime Tool Plugin Protocol"), next to the Rust one
(`contract-impl plugin fixture`, on `impl/src/plugin/sdk`). It speaks the launch contract
of `docs/plugin-launch-contract.md` exactly as the Rust SDK does, so the same black-box
scenarios run against either language's plugin:

1. it reads `RUNTIME_PLUGIN_PROTOCOL`, `RUNTIME_PLUGIN_SOCKET` and `RUNTIME_PLUGIN_SECRET`
   (then removes the secret from its environment), and refuses to start without them
   (one line on stderr naming the variable, never the secret; exit status 2);
2. it serves `plugin.v1.PluginService` with grpcio on the Unix socket (0600), and only
   then writes the handshake line `plugin.v1 ready` on stdout, which it then points at
   stderr, so a stray print never contaminates the protocol channel;
3. it checks the host's proof (`authorization: Bearer <hex HMAC-SHA256(secret,
   "plugin.v1 host")>`) on every call before decoding it, answers one `Initialize` with
   the proof of the secret, and refuses a second one;
4. it validates every `Execute` in the SDK's order (identifier grammar, draining,
   duplicate call ID, unknown tool, payload bound, strict JSON, the tool's schema, the
   concurrency bound) and streams bounded progress followed by exactly one result or
   typed failure; `Cancel` and a dropped stream cancel a call;
5. it exits at once (status 0) when stdin ends, and after a `Drain` once the calls in
   flight ended or the drain's timeout passed.

The tools (`echo`, `progress`, `slow`, `mutate`, `output`, `crash`, `spawn_detached`)
have the Rust fixture's names, descriptions, schemas (the same JSON text, byte for byte),
mutating flags and capabilities (`impl/src/plugin/fixture.rs`).

The Python modules of the schema are generated at startup from the repository's
`proto/` directory (found from this file's path, or `RUNTIME_PLUGIN_PROTO_ROOT`) with
`grpc_tools.protoc` into a private temporary directory, removed once they are imported.
It needs grpcio and grpcio-tools (the virtual environment `.tools/py` that
`ci/setup.sh` creates); run by another interpreter without them, it re-executes itself
with that environment's interpreter.

Written for Python 3.11 and 3.12+ (no syntax or library newer than 3.11).

Exit status: 0 after the host went away (stdin ended) or a drain ended; 2 when the launch
environment is missing or wrong (or the socket cannot be served); 70 when the `crash`
tool ran.
"""

import collections
import hashlib
import hmac
import importlib
import inspect
import json
import os
import signal
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
from concurrent import futures
from pathlib import Path

# ---------------------------------------------------------------------------------------
# The wire's constants (impl/src/plugin/wire.rs).

PROTOCOL_ENV = "RUNTIME_PLUGIN_PROTOCOL"
SOCKET_ENV = "RUNTIME_PLUGIN_SOCKET"
SECRET_ENV = "RUNTIME_PLUGIN_SECRET"
PROTO_ROOT_ENV = "RUNTIME_PLUGIN_PROTO_ROOT"
PROTOCOL = "plugin.v1"
HANDSHAKE_LINE = "plugin.v1 ready"
PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 0
SECRET_HEX_LEN = 64
PROOF_DOMAIN = "plugin.v1 initialize "
HOST_DOMAIN = "plugin.v1 host"
AUTH_METADATA = "authorization"
MAX_PAYLOAD_BYTES = 256 * 1024
MAX_PROGRESS_MESSAGES = 1000
MAX_PROGRESS_TEXT_BYTES = 1024
MAX_CONCURRENT_CALLS = 16
MAX_CALL_ID_BYTES = 128
MAX_FAILURE_TEXT_BYTES = 4096
MAX_MESSAGE_BYTES = 512 * 1024
MAX_DRAIN_TIMEOUT_MS = 600_000

# The SDK's own bounds (impl/src/plugin/sdk/service.rs).
REMEMBERED_CALL_IDS = 65_536
FLUSH_GRACE_S = 2.0
# Enough workers for max_concurrent_calls streams plus refused calls and control calls.
WORKERS = 48

# Exit statuses (impl/src/plugin/sdk/mod.rs, impl/src/plugin/fixture.rs).
EXIT_OK = 0
EXIT_LAUNCH = 2
CRASH_STATUS = 70

# serde_json's nesting bound: a container at this depth is refused (`recursion limit
# exceeded`), and the Rust SDK's strict parser inherits it.
JSON_MAX_DEPTH = 128

NAME = "conformance-fixture"
# The conformance tool set's version and description, the same in every fixture.
VERSION = "1.0.0"
DESCRIPTION = "The plugin.v1 conformance tool set."
SERVICE = "plugin.v1.PluginService"

# The repository: impl/src/plugin/python/conformance_plugin.py -> parents[4].
REPO = Path(__file__).resolve().parents[4]


def _ensure_grpc():
    """Imports grpcio; without it, re-executes this file with `.tools/py`'s interpreter."""
    try:
        import grpc  # noqa: F401
        from grpc_tools import protoc  # noqa: F401
    except ImportError:
        venv = REPO / ".tools" / "py"
        python = venv / "bin" / "python"
        if python.exists() and Path(sys.prefix).resolve() != venv.resolve():
            os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])
        print("plugin: grpcio and grpcio-tools are required (run ci/setup.sh)", file=sys.stderr)
        sys.exit(EXIT_LAUNCH)


_ensure_grpc()

import grpc  # noqa: E402

# ---------------------------------------------------------------------------------------
# Rust's text conventions, so that messages read as the Rust SDK's.


def _is_grapheme_extend(c):
    return unicodedata.category(c) in ("Mn", "Me") or 0x1F3FB <= ord(c) <= 0x1F3FF


def _escape_debug(c, quote):
    """One character as Rust's `Debug` writes it inside `quote` ('"' for str, "'" for char)."""
    simple = {"\0": "\\0", "\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\"}
    if c in simple:
        return simple[c]
    if c == quote:
        return "\\" + c
    if (c != " " and not c.isprintable()) or _is_grapheme_extend(c):
        return "\\u{%x}" % ord(c)
    return c


def rust_str_debug(s):
    """`format!("{s:?}")` of a Rust `&str`."""
    return '"' + "".join(_escape_debug(c, '"') for c in s) + '"'


def rust_char_debug(c):
    """`format!("{c:?}")` of a Rust `char`."""
    return "'" + _escape_debug(c, "'") + "'"


def rust_f64(x):
    """`format!("{x}")` of a Rust `f64` (never an exponent)."""
    if x == int(x):
        return ("-" if str(x).startswith("-") else "") + str(abs(int(x)))
    text = repr(x)
    if "e" not in text:
        return text
    return format(x, "f").rstrip("0").rstrip(".")


def clip(text, max_bytes):
    """The longest prefix of `text` of at most `max_bytes` UTF-8 bytes (whole characters)."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", errors="ignore")


# ---------------------------------------------------------------------------------------
# Launch secret, proofs, identifiers (impl/src/plugin/wire.rs).


def _mac_hex(secret, message):
    return hmac.new(secret.encode("ascii"), message.encode("utf-8"), hashlib.sha256).hexdigest()


def secret_proof(secret, challenge):
    """The plugin's proof for `challenge` (`InitializeResponse.secret_proof`)."""
    return _mac_hex(secret, PROOF_DOMAIN + challenge)


def host_proof(secret):
    """The host's proof on every call."""
    return _mac_hex(secret, HOST_DOMAIN)


def is_secret_shaped(s):
    """Whether `s` is 64 lowercase hexadecimal characters."""
    return len(s) == SECRET_HEX_LEN and all(c in "0123456789abcdef" for c in s)


def check_call_id(field, value):
    """`None`, or why `value` breaks the call-ID grammar (`invalid_call_id: …`)."""
    size = len(value.encode("utf-8"))
    if size == 0 or size > MAX_CALL_ID_BYTES:
        return f"invalid_call_id: {field} is 1 to {MAX_CALL_ID_BYTES} bytes, not {size}"
    for c in value:
        if not ((c.isascii() and c.isalnum()) or c in "_.:-"):
            return f"invalid_call_id: {field} holds {rust_char_debug(c)}"
    return None


# ---------------------------------------------------------------------------------------
# Strict JSON (impl/src/wire/strict.rs `parse_strict`): refuses duplicate keys, `null`,
# NaN/Infinity and numbers out of range, as serde_json under the Rust SDK does. Syntax
# errors are found first for the whole document; the other faults in document order.


class JsonFault(Exception):
    """Why arguments are not strict JSON (the text after `invalid_arguments: `)."""


class _Pairs(list):
    """An object's members in document order, duplicates kept (checked by `_walk`)."""


class _Bad:
    """A value serde_json refuses on its second pass (it reports it in document order)."""

    def __init__(self, reason):
        self.reason = reason


class _NonJsonConstant(Exception):
    pass


def _parse_constant(name):
    raise _NonJsonConstant(name)


def _parse_float(text):
    value = float(text)
    if value in (float("inf"), float("-inf")):
        return _Bad("number out of range")
    return value


def _parse_int(text):
    digits = text.lstrip("-")
    negative = text.startswith("-")
    if len(digits) > 20:
        # Past u64: serde_json reads it as an f64 (out of range when infinite).
        return _parse_float(text)
    n = int(text)
    if negative:
        # serde_json: `-0` and anything below i64::MIN are f64s, not integers.
        if n == 0 or n < -(2**63):
            return float(n) if n else -0.0
        return n
    if n > 2**64 - 1:
        return float(n)
    return n


def _has_surrogate(s):
    return any(0xD800 <= ord(c) <= 0xDFFF for c in s)


def _walk(value, path, depth):
    """The value as plain dicts and lists; raises the first fault in document order."""
    if isinstance(value, _Bad):
        raise JsonFault(f"malformed JSON: {value.reason}")
    if value is None:
        raise JsonFault(f"null value at {path}")
    if isinstance(value, str):
        if _has_surrogate(value):
            raise JsonFault("malformed JSON: lone surrogate in hex escape")
        return value
    if isinstance(value, (_Pairs, list)):
        if depth + 1 >= JSON_MAX_DEPTH:
            raise JsonFault("malformed JSON: recursion limit exceeded")
    if isinstance(value, _Pairs):
        out = {}
        for key, item in value:
            if _has_surrogate(key):
                raise JsonFault("malformed JSON: lone surrogate in hex escape")
            if key in out:
                raise JsonFault(f"duplicate key `{key}` at {path}")
            out[key] = _walk(item, f"{path}.{key}", depth + 1)
        return out
    if isinstance(value, list):
        return [_walk(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    return value


def parse_strict(text):
    """Parses one JSON document strictly; raises `JsonFault`."""
    try:
        raw = json.loads(
            text,
            object_pairs_hook=_Pairs,
            parse_constant=_parse_constant,
            parse_float=_parse_float,
            parse_int=_parse_int,
        )
    except json.JSONDecodeError as e:
        raise JsonFault(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except _NonJsonConstant as e:
        raise JsonFault(f"malformed JSON: {e.args[0]} is not a JSON value") from None
    except RecursionError:
        raise JsonFault("malformed JSON: recursion limit exceeded") from None
    except ValueError as e:
        raise JsonFault(f"malformed JSON: {e}") from None
    return _walk(raw, "$", 0)


def to_json(value):
    """Compact JSON text, as serde_json writes it (insertion order, UTF-8, no NaN)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# ---------------------------------------------------------------------------------------
# Schema check (impl/src/plugin/sdk/schema.rs `check_arguments`).


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_matches(kind, v):
    if kind == "string":
        return isinstance(v, str)
    if kind == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "number":
        return _is_number(v)
    if kind == "boolean":
        return isinstance(v, bool)
    if kind == "object":
        return isinstance(v, dict)
    if kind == "array":
        return isinstance(v, list)
    if kind == "null":
        return v is None
    return True


def _as_f64(v):
    return float(v) if _is_number(v) else None


def check_arguments(schema, args):
    """`None`, or the first rule `args` breaks (naming the property)."""
    if not isinstance(args, dict):
        return "the arguments must be a JSON object"
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        properties = None
    required = schema.get("required")
    if isinstance(required, list):
        for name in required:
            if isinstance(name, str) and name not in args:
                return f"missing required property `{name}`"
    if schema.get("additionalProperties") is False:
        for key in args:
            if properties is None or key not in properties:
                return f"unknown property `{key}`"
    for name, value in args.items():
        rule = properties.get(name) if properties is not None else None
        if not isinstance(rule, dict):
            continue
        kind = rule.get("type")
        if isinstance(kind, str) and not _type_matches(kind, value):
            return f"property `{name}` must be of type {kind}"
        n = _as_f64(value)
        minimum = _as_f64(rule.get("minimum"))
        if n is not None and minimum is not None and n < minimum:
            return f"property `{name}` is below its minimum {rust_f64(minimum)}"
        maximum = _as_f64(rule.get("maximum"))
        if n is not None and maximum is not None and n > maximum:
            return f"property `{name}` is above its maximum {rust_f64(maximum)}"
        max_length = rule.get("maxLength")
        if (
            isinstance(value, str)
            and isinstance(max_length, int)
            and not isinstance(max_length, bool)
            and max_length >= 0
            and len(value) > max_length
        ):
            return f"property `{name}` is longer than {max_length} characters"
    return None


# ---------------------------------------------------------------------------------------
# The conformance tools (impl/src/plugin/fixture.rs).


def _object(required, properties):
    # The key order of the Rust fixture's `json!` (serde_json with `preserve_order`).
    return {
        "type": "object",
        "required": list(required),
        "additionalProperties": False,
        "properties": properties,
    }


class Tool:
    def __init__(self, name, description, schema, mutating, capabilities, run):
        self.name = name
        self.description = description
        self.schema = schema
        self.schema_json = to_json(schema)
        self.mutating = mutating
        self.capabilities = list(capabilities)
        self.run = run


class ToolError(Exception):
    """A typed failure of one call."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class _BoundReached(Exception):
    pass


class Call:
    """One validated call, as the tool sees it."""

    def __init__(self, tool, call_id, arguments, max_progress, cancel):
        self.tool = tool
        self.call_id = call_id
        self.arguments = arguments
        self.sent = 0
        self.max_progress = max_progress
        self.cancel = cancel

    def progress(self, message):
        """The next progress report (sequence, text) for the tool to yield."""
        if self.sent >= self.max_progress:
            raise _BoundReached()
        self.sent += 1
        return self.sent, clip(message, MAX_PROGRESS_TEXT_BYTES)


# A tool returns its output (a JSON value) or raises ToolError; a tool that reports
# progress is a generator that yields `call.progress(…)` and returns its output. Tools run
# in the thread of the call's stream, so progress is paced by the host's reading.


def _echo(call):
    return {"text": call.arguments["text"]}


def _progress(call):
    count = call.arguments["count"]
    count = count if isinstance(count, int) and count >= 0 else 0
    for i in range(1, count + 1):
        try:
            report = call.progress(f"step {i} of {count}")
        except _BoundReached:
            raise ToolError(CODES.TOOL_FAILED, "the call's progress bound is reached") from None
        yield report
    return {"count": count}


def _slow(call):
    # One report once it runs: the event a host waits for before it cancels.
    yield call.progress("running")
    call.cancel.wait()
    raise ToolError(CODES.CANCELLED, "the call was cancelled")


def _mutate(call):
    outcome = call.arguments["outcome"]
    if outcome == "applied":
        return {"applied": call.arguments["key"]}
    if outcome == "uncertain":
        raise ToolError(CODES.UNCERTAIN, "the change was sent but its acknowledgement was lost")
    raise ToolError(CODES.INVALID_ARGUMENTS, "outcome is `applied` or `uncertain`")


def _output(call):
    n = call.arguments["bytes"]
    n = n if isinstance(n, int) and n >= 0 else 0
    return {"data": "x" * n}


def _crash(call):
    os._exit(CRASH_STATUS)


def _spawn_detached(call):
    # Never the launch secret: it is gone from os.environ, and left out here as well.
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    try:
        child = subprocess.Popen(
            ["setsid", "sleep", "3600"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError as e:
        raise ToolError(CODES.TOOL_FAILED, f"setsid sleep: {e}") from None
    return {"pid": child.pid}


TOOLS = [
    Tool("echo", "Answers its text.", _object(["text"], {"text": {"type": "string"}}), False, [], _echo),
    Tool(
        "progress",
        "Streams `count` progress messages, then answers the count.",
        _object(["count"], {"count": {"type": "integer", "minimum": 0, "maximum": 1000}}),
        False,
        [],
        _progress,
    ),
    Tool("slow", "Reports progress once it runs, then runs until cancelled.", _object([], {}), False, [], _slow),
    Tool(
        "mutate",
        "Applies a change named `key`; with outcome `uncertain` it loses track of whether it did.",
        _object(
            ["key", "outcome"],
            {
                "key": {"type": "string", "maxLength": 64},
                "outcome": {"type": "string", "enum": ["applied", "uncertain"]},
            },
        ),
        True,
        ["filesystem.write"],
        _mutate,
    ),
    Tool(
        "output",
        "Answers `bytes` characters of output.",
        _object(["bytes"], {"bytes": {"type": "integer", "minimum": 0, "maximum": 1048576}}),
        False,
        [],
        _output,
    ),
    Tool("crash", "Exits the process at once without answering.", _object([], {}), False, [], _crash),
    Tool(
        "spawn_detached",
        "Starts a process in a session of its own and answers its PID.",
        _object([], {}),
        False,
        ["process.spawn"],
        _spawn_detached,
    ),
]
TOOLS_BY_NAME = {t.name: t for t in TOOLS}


def capabilities():
    """Every tool's capabilities, once each, in tool order."""
    seen = []
    for tool in TOOLS:
        for c in tool.capabilities:
            if c not in seen:
                seen.append(c)
    return seen


# ---------------------------------------------------------------------------------------
# The generated protocol modules.


def load_protocol():
    """Generates and imports `common.v1.common_pb2` and `plugin.v1.plugin_pb2(_grpc)`."""
    from grpc_tools import protoc

    root = os.environ.get(PROTO_ROOT_ENV) or str(REPO / "proto")
    out = tempfile.mkdtemp(prefix="conformance-plugin-")
    try:
        files = ["common/v1/common.proto", "plugin/v1/plugin.proto"]
        args = ["protoc", f"-I{root}", f"--python_out={out}", f"--grpc_python_out={out}", *files]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed ({rc}) on {root}")
        # Regular packages, so that no installed `common` or `plugin` package shadows them.
        for package in ("common", "common/v1", "plugin", "plugin/v1"):
            (Path(out) / package / "__init__.py").touch()
        sys.path.insert(0, out)
        try:
            common = importlib.import_module("common.v1.common_pb2")
            messages = importlib.import_module("plugin.v1.plugin_pb2")
            importlib.import_module("plugin.v1.plugin_pb2_grpc")
        finally:
            sys.path.remove(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return common, messages


common_pb2 = None
pb = None


class CODES:
    """`plugin.v1.FailureCode`, filled in once the protocol is loaded."""

    INVALID_ARGUMENTS = UNKNOWN_TOOL = TOOL_FAILED = CANCELLED = PAYLOAD_TOO_LARGE = None
    DRAINING = DUPLICATE_CALL = INVALID_CALL = BUSY = UNCERTAIN = None


def _fill_codes():
    for name in (
        "INVALID_ARGUMENTS",
        "UNKNOWN_TOOL",
        "TOOL_FAILED",
        "CANCELLED",
        "PAYLOAD_TOO_LARGE",
        "DRAINING",
        "DUPLICATE_CALL",
        "INVALID_CALL",
        "BUSY",
        "UNCERTAIN",
    ):
        setattr(CODES, name, pb.FailureCode.Value("FAILURE_CODE_" + name))


# ---------------------------------------------------------------------------------------
# The service (impl/src/plugin/sdk/service.rs).


def _tool_definition(tool):
    return pb.ToolDefinition(
        name=tool.name,
        description=tool.description,
        input_schema_json=tool.schema_json,
        mutating=tool.mutating,
        capabilities=tool.capabilities,
    )


def _failure(call_id, code, message):
    return pb.ExecuteResponse(
        call_id=call_id,
        failure=pb.ToolFailure(code=code, message=clip(message, MAX_FAILURE_TEXT_BYTES)),
    )


class Service:
    def __init__(self, secret):
        self.secret = secret
        self.lock = threading.Lock()
        self.limits = None  # (max_payload_bytes, max_progress_messages, max_concurrent_calls)
        self.calls = {}  # call_id -> threading.Event (its cancellation)
        self.used = set()
        self.used_order = collections.deque()
        self.draining = False
        self.stop = threading.Event()

    # -- state ------------------------------------------------------------------------

    def _limits(self, context):
        with self.lock:
            limits = self.limits
        if limits is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not_initialized: call Initialize first")
        return limits

    def _used(self, call_id):
        with self.lock:
            return call_id in self.used

    def _claim_locked(self, call_id):
        """Records an accepted call's ID (the caller holds the lock); False if taken."""
        if call_id in self.used:
            return False
        if len(self.used_order) == REMEMBERED_CALL_IDS:
            self.used.discard(self.used_order.popleft())
        self.used.add(call_id)
        self.used_order.append(call_id)
        return True

    def in_flight(self):
        with self.lock:
            return len(self.calls)

    # -- RPCs -------------------------------------------------------------------------

    def Initialize(self, request, context):
        major = request.protocol.major
        if major != PROTOCOL_MAJOR:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"incompatible_protocol: this plugin speaks major {PROTOCOL_MAJOR}, not {major}",
            )
        if not is_secret_shaped(request.challenge):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "invalid_challenge: the challenge is 64 lowercase hexadecimal characters",
            )
        host = request.host_limits

        def bound(theirs, ours):
            return ours if theirs == 0 else min(theirs, ours)

        limits = (
            bound(host.max_payload_bytes, MAX_PAYLOAD_BYTES),
            bound(host.max_progress_messages, MAX_PROGRESS_MESSAGES),
            bound(host.max_concurrent_calls, MAX_CONCURRENT_CALLS),
        )
        with self.lock:
            already = self.limits is not None
            if not already:
                self.limits = limits
        if already:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "already_initialized: Initialize is accepted once per process",
            )
        return pb.InitializeResponse(
            protocol=common_pb2.ProtocolVersion(
                major=PROTOCOL_MAJOR, minor=min(request.protocol.minor, PROTOCOL_MINOR)
            ),
            plugin_build=common_pb2.BuildIdentity(name="conformance_plugin.py", version=VERSION, revision=""),
            manifest=pb.Manifest(
                name=NAME, version=VERSION, description=DESCRIPTION
            ),
            tools=[_tool_definition(t) for t in TOOLS],
            capabilities=capabilities(),
            limits=pb.PluginLimits(
                max_payload_bytes=limits[0],
                max_progress_messages=limits[1],
                max_concurrent_calls=limits[2],
            ),
            secret_proof=secret_proof(self.secret, request.challenge),
        )

    def ListTools(self, request, context):
        self._limits(context)
        return pb.ListToolsResponse(tools=[_tool_definition(t) for t in TOOLS])

    def Execute(self, request, context):
        max_payload, max_progress, max_concurrent = self._limits(context)
        # An invalid call ID is echoed cut to its bound, so the refusal always fits.
        call_id = clip(request.call_id, MAX_CALL_ID_BYTES)
        for field, value in (("call_id", request.call_id), ("progress_token", request.progress_token)):
            problem = check_call_id(field, value)
            if problem is not None:
                yield _failure(call_id, CODES.INVALID_CALL, problem)
                return
        with self.lock:
            draining = self.draining
        if draining:
            yield _failure(call_id, CODES.DRAINING, "draining: this process accepts no new call")
            return
        if self._used(call_id):
            yield _failure(
                call_id,
                CODES.DUPLICATE_CALL,
                "duplicate_call: this call_id was already used in this process",
            )
            return
        tool = TOOLS_BY_NAME.get(request.tool)
        if tool is None:
            yield _failure(
                call_id,
                CODES.UNKNOWN_TOOL,
                f"unknown_tool: no tool {rust_str_debug(clip(request.tool, 80))}",
            )
            return
        size = len(request.arguments_json.encode("utf-8"))
        if size > max_payload:
            yield _failure(
                call_id,
                CODES.PAYLOAD_TOO_LARGE,
                f"payload_too_large: the arguments are {size} bytes; the bound is {max_payload}",
            )
            return
        try:
            arguments = parse_strict(request.arguments_json)
        except JsonFault as e:
            yield _failure(call_id, CODES.INVALID_ARGUMENTS, f"invalid_arguments: {e}")
            return
        problem = check_arguments(tool.schema, arguments)
        if problem is not None:
            yield _failure(call_id, CODES.INVALID_ARGUMENTS, f"invalid_arguments: {problem}")
            return
        cancel = threading.Event()
        # Only an accepted call uses up its ID: a host may retry a refused one (BUSY).
        with self.lock:
            busy = len(self.calls)
            duplicate = False
            # A drain that began while this call was validated counts the calls under
            # this lock: the call is refused rather than outliving the drain's bound.
            draining = self.draining
            if draining:
                pass
            elif busy < max_concurrent:
                duplicate = not self._claim_locked(call_id)
                if not duplicate:
                    self.calls[call_id] = cancel
        if draining:
            yield _failure(call_id, CODES.DRAINING, "draining: this process accepts no new call")
            return
        if duplicate:
            yield _failure(
                call_id,
                CODES.DUPLICATE_CALL,
                "duplicate_call: this call_id was already used in this process",
            )
            return
        if busy >= max_concurrent:
            yield _failure(
                call_id,
                CODES.BUSY,
                f"busy: {busy} calls are in flight (max_concurrent_calls)",
            )
            return
        try:
            # The host dropping the stream (RST_STREAM) cancels the call.
            if not context.add_callback(cancel.set):
                cancel.set()
            call = Call(tool.name, call_id, arguments, max_progress, cancel)
            token = request.progress_token
            try:
                output = tool.run(call)
                if inspect.isgenerator(output):
                    reports = output
                    while True:
                        try:
                            sequence, message = next(reports)
                        except StopIteration as done:
                            output = done.value
                            break
                        yield pb.ExecuteResponse(
                            call_id=call_id,
                            progress=pb.Progress(progress_token=token, sequence=sequence, message=message),
                        )
            except ToolError as e:
                terminal = _failure(call_id, e.code, e.message)
            except Exception as e:  # noqa: BLE001 - a tool's bug still ends its call typed
                terminal = _failure(call_id, CODES.TOOL_FAILED, f"the tool failed: {type(e).__name__}")
            else:
                text = to_json(output)
                size = len(text.encode("utf-8"))
                if size > max_payload:
                    terminal = _failure(
                        call_id,
                        CODES.PAYLOAD_TOO_LARGE,
                        f"payload_too_large: the output is {size} bytes; the bound is {max_payload}",
                    )
                else:
                    terminal = pb.ExecuteResponse(call_id=call_id, result=pb.ToolResult(output_json=text))
            # The terminal message is the call's last act: from here it is no longer in
            # flight (the SDK removes it once the message is queued).
            with self.lock:
                self.calls.pop(call_id, None)
            yield terminal
        finally:
            with self.lock:
                if self.calls.get(call_id) is cancel:
                    del self.calls[call_id]

    def Cancel(self, request, context):
        self._limits(context)
        with self.lock:
            cancel = self.calls.get(request.call_id)
        if cancel is not None:
            cancel.set()
        return pb.CancelResponse(in_flight=cancel is not None)

    def Drain(self, request, context):
        self._limits(context)
        timeout_ms = request.timeout_ms
        if not 1 <= timeout_ms <= MAX_DRAIN_TIMEOUT_MS:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"invalid_timeout: timeout_ms is 1 to {MAX_DRAIN_TIMEOUT_MS}, not {timeout_ms}",
            )
        with self.lock:
            in_flight = len(self.calls)
            first = not self.draining
            self.draining = True
        if first:
            threading.Thread(target=self._drain, args=(timeout_ms,), daemon=True).start()
        return pb.DrainResponse(in_flight=min(in_flight, 2**32 - 1))

    def _drain(self, timeout_ms):
        deadline = time.monotonic() + timeout_ms / 1000.0
        while self.in_flight() > 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        # Past the timeout the calls still in flight are cancelled; their streams end
        # with their one terminal message before the process exits.
        with self.lock:
            for cancel in self.calls.values():
                cancel.set()
        self.stop.set()


# ---------------------------------------------------------------------------------------
# gRPC plumbing: the host's proof before decoding, and decoding failures as the caller's.


class _Undecodable:
    def __init__(self, reason):
        self.reason = reason


def _decoder(message_class):
    def decode(data):
        try:
            return message_class.FromString(data)
        except Exception as e:  # noqa: BLE001 - any decoding failure is the caller's error
            return _Undecodable(str(e))

    return decode


def _refuse_undecodable(request, context):
    if isinstance(request, _Undecodable):
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"failed to decode Protobuf message: {request.reason}",
        )


def _unary(behavior):
    def handle(request, context):
        _refuse_undecodable(request, context)
        return behavior(request, context)

    return handle


def _streaming(behavior):
    def handle(request, context):
        _refuse_undecodable(request, context)
        yield from behavior(request, context)

    return handle


def service_handler(service):
    def unary(name, request_class):
        return grpc.unary_unary_rpc_method_handler(
            _unary(getattr(service, name)),
            request_deserializer=_decoder(request_class),
            response_serializer=lambda m: m.SerializeToString(),
        )

    handlers = {
        "Initialize": unary("Initialize", pb.InitializeRequest),
        "ListTools": unary("ListTools", pb.ListToolsRequest),
        "Execute": grpc.unary_stream_rpc_method_handler(
            _streaming(service.Execute),
            request_deserializer=_decoder(pb.ExecuteRequest),
            response_serializer=lambda m: m.SerializeToString(),
        ),
        "Cancel": unary("Cancel", pb.CancelRequest),
        "Drain": unary("Drain", pb.DrainRequest),
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


class HostProof(grpc.ServerInterceptor):
    """Refuses a call without this launch's host proof, before its payload is decoded."""

    def __init__(self, proof):
        self.proof = proof.encode("ascii")

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None and not details.method.startswith(f"/{SERVICE}/"):
            return None
        presented = None
        for key, value in details.invocation_metadata or ():
            if key == AUTH_METADATA:
                if isinstance(value, str) and value.startswith("Bearer "):
                    presented = value[len("Bearer "):]
                break
        if presented is not None:
            try:
                given = presented.encode("ascii")
            except UnicodeEncodeError:
                given = b""
            if hmac.compare_digest(given, self.proof):
                return handler
            code, message = (
                grpc.StatusCode.UNAUTHENTICATED,
                "proof_mismatch: the call's host proof is not this launch's",
            )
        else:
            code, message = (
                grpc.StatusCode.UNAUTHENTICATED,
                "proof_missing: the call carries no host proof (`authorization: Bearer <proof>`)",
            )

        def refuse(request, context):
            context.abort(code, message)

        # A handler of the call's own shape, with no deserializer: nothing is decoded.
        if handler is not None and handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)


# ---------------------------------------------------------------------------------------
# The launch contract (impl/src/plugin/sdk/mod.rs).


def _env_text(name):
    value = os.environ.get(name, "")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return ""
    return value


def read_launch():
    """(socket, secret) from the environment, or exits 2 naming what is wrong."""
    protocol = _env_text(PROTOCOL_ENV)
    if protocol != PROTOCOL:
        _launch_failure(f"{PROTOCOL_ENV} is {rust_str_debug(protocol)}; this plugin speaks {PROTOCOL}")
    socket = os.environ.get(SOCKET_ENV, "")
    if not socket or not os.path.isabs(socket):
        _launch_failure(f"{SOCKET_ENV} must name an absolute socket path")
    secret = _env_text(SECRET_ENV)
    # The secret is read once; no process this plugin starts inherits it.
    os.environ.pop(SECRET_ENV, None)
    if not is_secret_shaped(secret):
        _launch_failure(f"{SECRET_ENV} must hold 64 lowercase hexadecimal characters")
    return socket, secret


def _launch_failure(message):
    print(f"plugin: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_LAUNCH)


def _exit(status):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(status)


def _remove_socket(socket):
    try:
        if stat.S_ISSOCK(os.lstat(socket).st_mode):
            os.unlink(socket)
    except OSError:
        pass


def _watch_stdin(socket):
    """The host's end of stdin closes when the host dies or drops us: exit, never spin."""
    while True:
        try:
            if not os.read(0, 256):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    _remove_socket(socket)
    _exit(EXIT_OK)


def main():
    global common_pb2, pb
    socket, secret = read_launch()
    try:
        common_pb2, pb = load_protocol()
    except Exception as e:  # noqa: BLE001
        _launch_failure(f"loading the protocol: {e}")
    _fill_codes()
    service = Service(secret)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="plugin"),
        handlers=[service_handler(service)],
        interceptors=[HostProof(host_proof(secret))],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    del secret
    old_umask = os.umask(0o177)
    try:
        port = server.add_insecure_port(f"unix:{socket}")
    except Exception as e:  # noqa: BLE001
        _launch_failure(f"binding {socket}: {e}")
    finally:
        os.umask(old_umask)
    if not port:
        _launch_failure(f"binding {socket}: the socket cannot be served")
    server.start()
    try:
        os.chmod(socket, 0o600)
    except OSError as e:
        server.stop(None)
        _launch_failure(f"{socket}: {e}")
    # Stopped by its host (or its supervisor), from before readiness on: the socket goes
    # with it.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: (_remove_socket(socket), _exit(EXIT_OK)))
    # The handshake line, then stdout points at stderr: nothing else ever reaches it.
    try:
        sys.stdout.write(HANDSHAKE_LINE + "\n")
        sys.stdout.flush()
        os.dup2(2, 1)
    except OSError as e:
        server.stop(None)
        _launch_failure(f"writing the handshake line: {e}")
    threading.Thread(target=_watch_stdin, args=(socket,), daemon=True, name="stdin").start()
    service.stop.wait()
    # A drain's streams had their terminal messages queued; give them a moment to flush.
    deadline = time.monotonic() + FLUSH_GRACE_S
    while service.in_flight() > 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    server.stop(FLUSH_GRACE_S).wait(FLUSH_GRACE_S + 1.0)
    _remove_socket(socket)
    _exit(EXIT_OK)


if __name__ == "__main__":
    main()
