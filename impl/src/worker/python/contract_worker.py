"""The Python worker of the worker protocol ("Runtime control protocol v1").

Standard library only. The host starts it with (docs/worker-launch-contract.md):

  CONTRACT_WORKER_SOCKET      the host's Unix socket (the host listens; we connect)
  CONTRACT_WORKER_TOKEN       the startup token, echoed in `hello`
  CONTRACT_WORKER_SESSION_ID  the envelope's session_id
  CONTRACT_WORKER_GENERATION  the envelope's generation
  CONTRACT_WORKER_ROLE        `workbench` (default) or `hooks`
  CONTRACT_WORKER_HOOKS_DIR   (hooks) the source snapshot holding behavior.json

and, for a workbench given skills, the argument `--skills PATH`: the validated set the host
materialized ("Skills"), read before the worker connects; each id is then importable as
`klbr.skills.<id>` and `hello` echoes the set's revision.

Frames are a 4-byte big-endian length (1..1,048,576) and UTF-8 JSON. Decoding is strict:
duplicate keys at any depth, NaN/Infinity, unknown fields, missing fields, identity
mismatches and bad identifiers are refused; a refused frame, a bad length or EOF inside a
frame invalidates the connection: the worker says why on stderr (`invalid frame: <code>`)
and exits with status 3, never resuming after a partial payload.

Exit statuses: 0 after `shutdown` (or the host closing the socket between frames), 2 for a
launch problem (environment, hook sources, skills set), 3 for an invalidated connection.
"""

import ast
import asyncio
import contextvars
import dataclasses
import hashlib
import importlib
import importlib.machinery
import inspect
import io
import json
import keyword
import math
import os
import re
import socket
import struct
import sys
import sysconfig
import traceback
import types

VERSION = 1
FRAME_MAX_BYTES = 1_048_576
IDENTIFIER_RE = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
CELL_SOURCE_MAX_BYTES = 262_144
RETURNED_TEXT_MAX_BYTES = 65_536
OUTPUT_RECORDS_MAX = 256
ERROR_TEXT_MAX_BYTES = 65_536
SLOTS = ["attention.plan", "delivery.review"]
SOURCE_FILES_MAX = 128
SOURCE_BYTES_MAX = 2 * 1024 * 1024
SOURCE_SUFFIXES = (".py", ".json", ".md")
MANIFEST = "behavior.json"
SKILL_ID_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
SKILLS_SET_VERSION = 1
WAIT_SECONDS_MAX = 600.0
DEFER_SECONDS_MAX = 600.0

# `CONTRACT_WORKER_PROFILE=different`: a worker that makes every choice the spec leaves
# free otherwise (exit statuses, stderr texts, one record per write, error text without
# the traceback, a second foreground operation ending the connection, a hook input that
# is not its slot's typed input ending it too, a repeated key of a free-form reply value
# keeping its last value), to prove the suite's required steps hold for any conformant
# worker (`--mode vendor`).
DIFFERENT = os.environ.get("CONTRACT_WORKER_PROFILE") == "different"

EXIT_SHUTDOWN = 0
EXIT_LAUNCH = 1 if DIFFERENT else 2
EXIT_INVALID = 1 if DIFFERENT else 3


class WireError(Exception):
    """A refused frame: `code` is the protocol's stable code (same as the Rust wire)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- strict decoding


def _refuse_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise WireError("duplicate_key", f"duplicate key `{key}`")
        seen[key] = value
    return seen


def _refuse_constant(name):
    raise WireError("malformed_json", f"{name} is not a JSON number")


def parse_json(payload):
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WireError("not_utf8", f"the payload is not UTF-8 (byte {e.start})") from None
    # The whole document's syntax first (a duplicate key before a syntax error is still
    # malformed JSON, as the Rust decoder says), then the duplicates.
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                           parse_int=_bounded_int)
    except WireError:
        raise
    except RecursionError:
        raise WireError("malformed_json", f"nesting deeper than {NESTING_MAX}") from None
    except ValueError as e:
        raise WireError("malformed_json", str(e)) from None
    if _too_deep(value):
        # serde_json's own limit: deeper documents are refused, not read.
        raise WireError("malformed_json", f"nesting deeper than {NESTING_MAX}")
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        # Python's json keeps an unpaired \ud800 escape; it is no Unicode text.
        raise WireError("malformed_json", "a string holds an unpaired surrogate")
    if DIFFERENT:
        # The spec's guarantee only: a typed field repeated is refused; a repeated key of
        # a free-form payload map (a host reply's value) keeps its last value ("Arbitrary
        # nested `serde_json::Value` payload maps are not yet a duplicate-key equivalence
        # guarantee between parsers").
        value = json.loads(text, object_pairs_hook=_MarkedObject.of, parse_float=_finite_float,
                           parse_int=_bounded_int)
        _refuse_typed_duplicates(value, free=_free_payload(value))
        return value
    return json.loads(text, object_pairs_hook=_refuse_duplicates, parse_float=_finite_float,
                      parse_int=_bounded_int)


class _MarkedObject(dict):
    """A decoded object that remembers the first key it held twice (the last value kept)."""

    repeated = None

    @classmethod
    def of(cls, pairs):
        obj = cls()
        for key, value in pairs:
            if key in obj and obj.repeated is None:
                obj.repeated = key
            obj[key] = value
        return obj


def _free_payload(envelope):
    """The free-form payload map of a frame the worker reads, if it has one: the `value`
    of a host reply's `ok` reply."""
    message = envelope.get("message") if isinstance(envelope, dict) else None
    reply = message.get("reply") if isinstance(message, dict) else None
    if isinstance(message, dict) and message.get("kind") == "host_reply" and isinstance(reply, dict):
        return reply.get("value")
    return None


def _refuse_typed_duplicates(value, free):
    if value is free and free is not None:
        return
    if isinstance(value, dict):
        if getattr(value, "repeated", None) is not None:
            raise WireError("duplicate_key", f"duplicate key `{value.repeated}`")
        for item in value.values():
            _refuse_typed_duplicates(item, free)
    elif isinstance(value, list):
        for item in value:
            _refuse_typed_duplicates(item, free)


# serde_json's recursion limit: 127 nested arrays/objects are read, the 128th is refused.
NESTING_MAX = 127


def _too_deep(value):
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, dict)):
            if depth > NESTING_MAX:
                return True
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise WireError("malformed_json", f"number {text[:32]} is out of range")
    return value


def _bounded_int(text):
    if text == "-0":
        # serde_json reads `-0` as the float -0.0, not as an integer.
        return -0.0
    value = int(text)
    if not -(2**63) <= value < 2**64:
        # Beyond the 64-bit integers a JSON number is read as a float: finite or refused.
        try:
            float(value)
        except OverflowError:
            raise WireError("malformed_json", f"number {text[:32]}… is out of range") from None
    return value


# Only a `\ud800`-style escape can put a surrogate into decoded text (the payload itself
# is valid UTF-8): the walk runs only when the text holds one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(value):
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if any(0xD800 <= ord(c) <= 0xDFFF for c in v):
                return True
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
    return False


def dump_json(value):
    """Compact JSON; NaN/Infinity refused (`allow_nan=False`)."""
    return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def _fields(obj, required, where):
    """Checks an object's keys (hook inputs): unknown first, then missing."""
    if not isinstance(obj, dict):
        raise WireError("invalid_value", f"{where} is not an object")
    for key in obj:
        if key not in required:
            raise WireError("unknown_field", f"unknown field `{key}` at {where}")
    for key in required:
        if key not in obj:
            raise WireError("missing_field", f"missing field `{key}` at {where}")


def _identifier(value, where):
    if not isinstance(value, str) or not IDENTIFIER_RE.fullmatch(value):
        raise WireError("invalid_value", f"{where} is not an identifier")
    return value


def _string(value, where):
    if not isinstance(value, str):
        raise WireError("invalid_value", f"{where} is not a string")
    return value


def _version(value, where):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 2**64:
        raise WireError("invalid_value", f"{where} is not an unsigned integer")
    return value


def _slot(value, where):
    if not isinstance(value, str) or value not in SLOTS:
        raise WireError("invalid_value", f"{where} is not a slot")
    return value


def _any(value, where):
    return value


def _typed(obj, fields, where):
    """Decodes an object the way the Rust wire's typed decoding does (serde with
    `deny_unknown_fields`): keys in document order, a key the type does not define or a
    bad value where it stands, then the first missing field in declaration order."""
    if not isinstance(obj, dict):
        raise WireError("invalid_value", f"{where} is not an object")
    for key, value in obj.items():
        check = fields.get(key)
        if check is None:
            raise WireError("unknown_field", f"unknown field `{key}` at {where}")
        check(value, f"{where}.{key}")
    for key in fields:
        if key not in obj:
            raise WireError("missing_field", f"missing field `{key}` at {where}")
    return obj


def _tagged(obj, variants, tag, where):
    """An internally tagged enum: the tag first (missing, not a string, unknown), then
    the variant's fields as `_typed`."""
    if not isinstance(obj, dict):
        raise WireError("invalid_value", f"{where} is not an object")
    if tag not in obj:
        raise WireError("missing_field", f"missing field `{tag}` at {where}")
    name = obj[tag]
    if not isinstance(name, str) or name not in variants:
        raise WireError("invalid_value", f"{where}.{tag} names no variant")
    rest = {k: v for k, v in obj.items() if k != tag}
    _typed(rest, variants[name], where)
    return obj


REPLY = {
    "ok": {"value": _any},
    "error": {"code": _string, "message": _string},
}

# What the host sends, per kind: the fields of `message` besides `kind`.
HOST_KINDS = {
    "execute": {"id": _identifier, "code": _string},
    "invoke": {"id": _identifier, "slot": _slot, "input": _any},
    "host_reply": {"id": _identifier, "execution_id": _identifier,
                   "reply": lambda v, w: _tagged(v, REPLY, "kind", w)},
    "interrupt": {"id": _identifier},
    "shutdown": {},
}
WORKER_KINDS = ("hello", "host_request", "completed")


def _require_objects(env):
    """The positions a typed struct or enum holds must be objects (not arrays), checked
    before typed decoding, at the same positions as the Rust wire."""
    def obj(value, where):
        if not isinstance(value, dict):
            raise WireError("invalid_value", f"{where} is not an object")
    obj(env, "$")
    if "message" not in env:
        return
    message = env["message"]
    obj(message, "$.message")
    for key in ("reply", "result", "request"):
        if key in message:
            obj(message[key], f"$.message.{key}")
    request = message.get("request")
    if isinstance(request, dict) and "scope" in request:
        obj(request["scope"], "$.message.request.scope")
    result = message.get("result")
    if isinstance(result, dict) and isinstance(result.get("output"), list):
        for i, record in enumerate(result["output"]):
            obj(record, f"$.message.result.output[{i}]")


def decode_host_frame(payload, session_id, generation):
    """Decodes one frame the host sent; raises WireError with the Rust wire's code, in
    the Rust wire's order: not_utf8, malformed_json, duplicate_key, unknown_kind,
    wrong_direction, object shapes, typed decoding in document order, version_mismatch,
    session_mismatch, generation_mismatch, bound_exceeded."""
    env = parse_json(payload)
    message = env.get("message") if isinstance(env, dict) else None
    if isinstance(message, dict) and isinstance(message.get("kind"), str):
        kind = message["kind"]
        if kind not in HOST_KINDS and kind not in WORKER_KINDS:
            raise WireError("unknown_kind", f"unknown message kind `{kind}`")
        if kind in WORKER_KINDS:
            raise WireError("wrong_direction", f"`{kind}` is not sent by the host")
    _require_objects(env)
    _typed(env, {
        "version": _version,
        "session_id": _identifier,
        "generation": _identifier,
        "message": lambda v, w: _tagged(v, HOST_KINDS, "kind", w),
    }, "$")
    if env["version"] != VERSION:
        raise WireError("version_mismatch", f"version {env['version']} is not {VERSION}")
    if env["session_id"] != session_id:
        raise WireError("session_mismatch", f"session_id `{env['session_id']}` is not `{session_id}`")
    if env["generation"] != generation:
        raise WireError("generation_mismatch", f"generation `{env['generation']}` is not `{generation}`")
    if message["kind"] == "execute" and len(message["code"].encode("utf-8")) > CELL_SOURCE_MAX_BYTES:
        raise WireError("bound_exceeded", "cell source over 262,144 bytes")
    if DIFFERENT and message["kind"] == "invoke":
        # An input that is not the slot's typed input fails the typed message here, as an
        # unknown typed field does: the connection is invalidated (ours completes the
        # invocation failed and goes on serving).
        try:
            check_input(message["slot"], message["input"])
        except (ValueError, KeyError, TypeError) as e:
            raise WireError("invalid_value", f"$.message.input: {e}") from None
    return message


# ---------------------------------------------------------------- output capture


class Output:
    """Bounded output records: <= 65,536 bytes of text across <= 256 records; the
    excess is counted in truncated_bytes and discarded."""

    def __init__(self):
        self.records = []
        self.size = 0
        self.truncated = 0

    def add(self, stream, text):
        if not text:
            return
        data = text.encode("utf-8", "surrogatepass")
        if self.truncated:
            # Once anything was discarded, the rest is too: the records stay a prefix
            # of what the cell wrote, in order.
            self.truncated += len(data)
            return
        if self.records and self.records[-1]["stream"] == stream and not DIFFERENT:
            room = RETURNED_TEXT_MAX_BYTES - self.size
            keep = _utf8_prefix(data, room)
            self.records[-1]["text"] += keep.decode("utf-8")
        elif len(self.records) < OUTPUT_RECORDS_MAX:
            room = RETURNED_TEXT_MAX_BYTES - self.size
            keep = _utf8_prefix(data, room)
            if keep:
                self.records.append({"stream": stream, "text": keep.decode("utf-8")})
        else:
            keep = b""
        self.size += len(keep)
        self.truncated += len(data) - len(keep)


def _utf8_prefix(data, room):
    if room <= 0:
        return b""
    if len(data) <= room:
        return data
    cut = room
    while cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return data[:cut]


def bounded_text(text, limit=ERROR_TEXT_MAX_BYTES):
    return _utf8_prefix(text.encode("utf-8", "replace"), limit).decode("utf-8")


class _Capture(io.TextIOBase):
    def __init__(self, worker, stream):
        self.worker = worker
        self.stream = stream

    def writable(self):
        return True

    def write(self, text):
        out = self.worker.output
        if out is not None:
            out.add(self.stream, text)
        return len(text)


# ---------------------------------------------------------------- cells and requests


class HostError(Exception):
    """A host request answered `error`."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


if DIFFERENT:
    # Another API a worker may give cells (our `HostError` is a choice, WK-MSG-023).
    class HostReplyError(HostError):
        """A host request answered `error` (the different profile's name)."""

    HostError = HostReplyError  # noqa: F811


class _Yield(BaseException):
    """Unwinds a cell whose wait the host accepted (the cell ends `yielded`)."""


class Runtime:
    """The `runtime` object of a cell: host requests for the current execution."""

    def __init__(self, worker):
        self._worker = worker

    async def request(self, method, **params):
        return await self._worker.host_request(dict(params, method=method))

    async def inspect(self):
        return await self.request("runtime.inspect")

    async def send(self, text):
        return await self.request("local.send", text=text)

    async def hooks_list(self):
        return await self.request("hooks.list")

    async def hooks_describe(self, slot):
        return await self.request("hooks.describe", slot=slot)

    async def workspace_info(self):
        return await self.request("workspace.info")

    async def workspace_run(self, argv, *, timeout_ms, max_output_bytes, cwd=".", env=None):
        return await self.request("workspace.run", argv=list(argv), cwd=cwd,
                                  env=dict(env or {}), timeout_ms=timeout_ms,
                                  max_output_bytes=max_output_bytes)

    async def evidence_resolve(self, refs):
        return await self.request("evidence.resolve", refs=list(refs))

    async def wait(self, seconds=None, reason=""):
        if seconds is not None and not (
            isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
            and math.isfinite(seconds) and 0 < seconds <= WAIT_SECONDS_MAX
        ):
            raise ValueError(f"wait seconds must be None or finite, > 0 and <= {WAIT_SECONDS_MAX:g}")
        await self.request("runtime.wait", seconds=seconds, reason=reason)
        raise _Yield()


# The execution a piece of code runs for: set by the cell, inherited by the tasks it
# starts. A background task keeps its cell's execution, whose scope ends with the cell
# ("Background tasks inherit an origin for diagnostics, but that scope expires when the
# foreground cell ends").
_EXECUTION = contextvars.ContextVar("execution", default=None)


class Worker:
    def __init__(self, sock, session_id, generation):
        self.sock = sock
        self.session_id = session_id
        self.generation = generation
        self.namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        self.namespace["runtime"] = Runtime(self)
        self.current = None  # (operation id, task)
        self.running = False  # whether the current task's body has started
        self.interrupted = False  # an interrupt came before the body started
        self.output = None
        self.pending = {}  # (request id, execution id) -> future
        self.yielded = set()
        # Request numbers per execution: the same execution run again (after a host
        # restart) numbers its requests the same, so a retry carries the identity the
        # host's receipt is keyed by ("A retry with the same execution/request identity
        # returns the existing receipt").
        self.request_seq = {}  # execution id -> requests sent by that execution
        self.hooks = None
        self.loop = asyncio.get_running_loop()
        self.write_lock = asyncio.Lock()

    # -- framing

    async def send(self, message):
        env = {"version": VERSION, "session_id": self.session_id,
               "generation": self.generation, "message": message}
        payload = dump_json(env).encode("utf-8")
        if not 1 <= len(payload) <= FRAME_MAX_BYTES:
            raise ValueError(f"a frame of {len(payload)} bytes is outside 1..{FRAME_MAX_BYTES}")
        async with self.write_lock:
            await self.loop.sock_sendall(self.sock, struct.pack(">I", len(payload)) + payload)

    async def read_exact(self, n, inside):
        buf = b""
        while len(buf) < n:
            chunk = await self.loop.sock_recv(self.sock, min(65536, n - len(buf)))
            if not chunk:
                if not buf and not inside:
                    return None
                raise WireError("truncated_body" if inside else "truncated_header", "the stream ended inside a frame")
            buf += chunk
        return buf

    async def next_frame(self):
        prefix = await self.read_exact(4, inside=False)
        if prefix is None:
            return None
        (length,) = struct.unpack(">I", prefix)
        if length == 0:
            raise WireError("zero_length", "a frame of length 0")
        if length > FRAME_MAX_BYTES:
            raise WireError("frame_too_long", f"a frame of {length} bytes exceeds {FRAME_MAX_BYTES}")
        return await self.read_exact(length, inside=True)

    # -- the reader

    async def serve(self):
        while True:
            payload = await self.next_frame()
            if payload is None:
                return EXIT_SHUTDOWN
            message = decode_host_frame(payload, self.session_id, self.generation)
            kind = message["kind"]
            if kind == "shutdown":
                if self.current is not None:
                    self.current[1].cancel()
                return EXIT_SHUTDOWN
            if kind in ("execute", "invoke") and self.current is not None and self.current[0] == message["id"]:
                # An operation ID reused while it runs would make every later message
                # about it ambiguous: the identity is broken, the connection invalidated.
                raise WireError("duplicate_operation", f"operation `{message['id']}` is already running")
            if kind == "execute":
                await self.start(message["id"], self.run_cell(message["id"], message["code"]))
            elif kind == "invoke":
                await self.start(message["id"], self.run_hook(message["id"], message["slot"], message["input"]))
            elif kind == "interrupt":
                if self.current is not None and self.current[0] == message["id"]:
                    # A task cancelled before its first step never runs its body (and
                    # would never complete): the body checks the flag instead.
                    if self.running:
                        self.current[1].cancel()
                    else:
                        self.interrupted = True
                else:
                    log(f"interrupt for `{message['id']}`, which is not running: ignored")
            elif kind == "host_reply":
                key = (message["id"], message["execution_id"])
                future = self.pending.pop(key, None)
                if future is None or future.done():
                    # A late reply (after cancellation) or one naming another execution:
                    # discarded, never satisfying another cell's request.
                    log(f"host_reply {key} matches no pending request: discarded")
                else:
                    future.set_result(message["reply"])

    async def start(self, op_id, coro):
        if self.current is not None and DIFFERENT:
            coro.close()
            raise WireError("bound_exceeded", "one foreground operation per worker: another is running")
        if self.current is not None:
            coro.close()
            await self.send({"kind": "completed", "id": op_id,
                             "result": {"kind": "failed", "error": "one foreground operation per worker: another is running"}})
            return
        self.running = False
        self.interrupted = False
        task = self.loop.create_task(coro)
        self.current = (op_id, task)

    def begin(self):
        """The body of the current operation starts (raises if interrupted already)."""
        self.running = True
        if self.interrupted:
            raise asyncio.CancelledError()

    async def host_request(self, request):
        execution_id = _EXECUTION.get()
        if self.current is None or execution_id is None or self.current[0] != execution_id:
            raise HostError("no_scope", "the cell this code runs for has ended")
        if execution_id in self.yielded:
            raise HostError("no_scope", "the execution yielded")
        seq = self.request_seq.get(execution_id, 0) + 1
        self.request_seq[execution_id] = seq
        request_id = f"r-{seq}"
        future = self.loop.create_future()
        self.pending[(request_id, execution_id)] = future
        try:
            await self.send({"kind": "host_request", "id": request_id,
                             "execution_id": execution_id, "request": request})
        except BaseException:
            self.pending.pop((request_id, execution_id), None)
            raise
        try:
            reply = await future
        finally:
            self.pending.pop((request_id, execution_id), None)
        if reply["kind"] == "ok":
            if request.get("method") == "runtime.wait":
                self.yielded.add(execution_id)
            return reply["value"]
        raise HostError(reply["code"], reply["message"])

    # -- cells

    async def run_cell(self, op_id, code):
        self.output = Output()
        _EXECUTION.set(op_id)
        status, error = "ok", None
        old = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Capture(self, "stdout"), _Capture(self, "stderr")
        try:
            self.begin()
            value = await self.evaluate(code)
            if value is not None:
                self.namespace["_"] = value
                self.output.add("result", repr(value))
        except _Yield:
            status = "yielded"
        except asyncio.CancelledError:
            status = "interrupted"
        except BaseException:  # the cell's own exception, KeyboardInterrupt and SystemExit too
            status = "error"
            error = bounded_text(_format_exception() if not DIFFERENT else "{}: {}".format(*_exception_only()))
        finally:
            sys.stdout, sys.stderr = old
        if op_id in self.yielded and status in ("ok", "error"):
            # The host accepted the wait: the cell yielded, whatever the code did with
            # the sentinel afterwards.
            status, error = "yielded", None
        out, self.output = self.output, None
        self.drop_pending(op_id)
        self.current = None
        await self.send({"kind": "completed", "id": op_id,
                         "result": {"kind": "cell", "status": status, "output": out.records,
                                    "truncated_bytes": out.truncated, "error": error}})

    async def evaluate(self, code):
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        body = compile(tree, "<cell>", "exec", flags=flags)
        result = eval(body, self.namespace)
        if inspect.iscoroutine(result):
            await result
        if last is None:
            return None
        value = eval(compile(last, "<cell>", "eval", flags=flags), self.namespace)
        if inspect.iscoroutine(value):
            value = await value
        return value

    def drop_pending(self, execution_id):
        self.request_seq.pop(execution_id, None)
        for key in [k for k in self.pending if k[1] == execution_id]:
            future = self.pending.pop(key)
            if not future.done():
                future.cancel()

    # -- hooks

    async def run_hook(self, op_id, slot, request):
        try:
            self.begin()
            if self.hooks is None:
                raise ValueError("invoke is for the hooks role; this worker is a workbench")
            value = await self.hooks.invoke(op_id, slot, request)
            result = {"kind": "hook", "value": value}
            # A NaN or an unpaired surrogate in the decision fails here, not on the wire.
            dump_json(result).encode("utf-8")
        except asyncio.CancelledError:
            result = {"kind": "failed", "error": "interrupted"}
        except BaseException as e:
            result = {"kind": "failed", "error": bounded_text(f"{type(e).__name__}: {e}")}
        self.current = None
        await self.send({"kind": "completed", "id": op_id, "result": result})


def _exception_only():
    etype, value, _ = sys.exc_info()
    return etype.__name__, value


def _format_exception():
    """The cell's traceback without the worker's own frames (its line numbers are
    nobody's business and change with every edit of the worker)."""
    etype, value, tb = sys.exc_info()
    own = _format_exception.__code__.co_filename
    stdlib = sysconfig.get_paths().get("stdlib", "\0")
    frames = list(traceback.extract_tb(tb))
    # From the cell's first frame on (a syntax error has none: the compiler's frames are
    # not the cell's), without the worker's own.
    start = next((i for i, f in enumerate(frames) if f.filename == "<cell>"), len(frames))
    frames = [f for f in frames[start:] if f.filename != own and not f.filename.startswith(stdlib)]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(etype, value)
    return "".join(lines)


# ---------------------------------------------------------------- hooks role


def _sdk_module():
    """`contract_hooks`: the decision dataclasses a handler returns."""
    sdk = types.ModuleType("contract_hooks")

    @dataclasses.dataclass(frozen=True)
    class Wake:
        priority: int

    @dataclasses.dataclass(frozen=True)
    class Defer:
        seconds: float

    @dataclasses.dataclass(frozen=True)
    class Ignore:
        reason: str

    @dataclasses.dataclass(frozen=True)
    class Allow:
        pass

    @dataclasses.dataclass(frozen=True)
    class Hold:
        reason: str

    @dataclasses.dataclass(frozen=True)
    class Context:
        slot: str
        operation_id: str
        revision: str

    for cls in (Wake, Defer, Ignore, Allow, Hold, Context):
        cls.__module__ = "contract_hooks"
        setattr(sdk, cls.__name__, cls)
    return sdk


SDK = _sdk_module()


def source_identity(root):
    """SHA-256 over sorted POSIX relative names: per file u64BE name length, name,
    u64BE content length, content. Only .py/.json/.md, <= 128 files, <= 2 MiB, no
    symlinks ("Source revisions and activation")."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for d in list(dirnames):
            if os.path.islink(os.path.join(dirpath, d)):
                raise ValueError(f"symlinked directory {d!r} in the source snapshot")
            if d == "__pycache__":
                raise ValueError("a __pycache__ directory in the source snapshot (run with -B)")
        for name in filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if os.path.islink(path):
                raise ValueError(f"symlink {rel!r} in the source snapshot")
            if not rel.endswith(SOURCE_SUFFIXES):
                raise ValueError(f"{rel!r} is not a .py, .json or .md file")
            files.append(rel)
    if len(files) > SOURCE_FILES_MAX:
        raise ValueError(f"{len(files)} files exceed {SOURCE_FILES_MAX}")
    # The bound is checked on the sizes before anything is read (a huge or sparse file
    # is refused unread); a file that grew since is read no further than the bound.
    if sum(os.lstat(os.path.join(root, rel)).st_size for rel in files) > SOURCE_BYTES_MAX:
        raise ValueError(f"the source snapshot exceeds {SOURCE_BYTES_MAX} bytes")
    digest = hashlib.sha256()
    total = 0
    for rel in sorted(files, key=lambda r: r.encode("utf-8")):
        with open(os.path.join(root, rel), "rb") as f:
            content = f.read(SOURCE_BYTES_MAX - total + 1)
        total += len(content)
        if total > SOURCE_BYTES_MAX:
            raise ValueError(f"the source snapshot exceeds {SOURCE_BYTES_MAX} bytes")
        name = rel.encode("utf-8")
        digest.update(struct.pack(">Q", len(name)) + name + struct.pack(">Q", len(content)) + content)
    return digest.hexdigest()


class Hooks:
    def __init__(self, root):
        self.revision = source_identity(root)
        with open(os.path.join(root, MANIFEST), "rb") as f:
            manifest = parse_json(f.read())
        if not isinstance(manifest, dict) or set(manifest) != {"version", "hooks"} or manifest["version"] != 1:
            raise ValueError(f"{MANIFEST} is not {{\"version\":1,\"hooks\":{{...}}}}")
        entries = manifest["hooks"]
        if not isinstance(entries, dict) or sorted(entries) != SLOTS:
            raise ValueError(f"{MANIFEST} hooks must be exactly {SLOTS}")
        sys.path.insert(0, root)
        sys.modules["contract_hooks"] = SDK
        self.handlers = {}
        for slot, entry in entries.items():
            module_name, _, attr = str(entry).partition(":")
            if not module_name or not attr:
                raise ValueError(f"{slot}: entrypoint {entry!r} is not module:function")
            handler = getattr(importlib.import_module(module_name), attr)
            params = list(inspect.signature(handler).parameters.values())
            positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            if len(positional) != 2 or len(params) != 2:
                raise ValueError(f"{slot}: {entry} must take (request, context)")
            self.handlers[slot] = handler

    async def invoke(self, op_id, slot, request):
        check_input(slot, request)
        context = SDK.Context(slot=slot, operation_id=op_id, revision=self.revision)
        value = self.handlers[slot](request, context)
        if inspect.isawaitable(value):
            value = await value
        return decision(slot, value)


def check_input(slot, request):
    if slot == "attention.plan":
        _fields(request, ("event_id", "source", "received_at_ms"), "input")
        if not _positive_int(request["event_id"], 1):
            raise ValueError("event_id must be a positive integer")
        if request["source"] not in ("operator", "discord.dm", "discord.mention", "discord.ambient"):
            raise ValueError("unknown source")
        if not _positive_int(request["received_at_ms"], 0):
            raise ValueError("received_at_ms must be a nonnegative integer")
    else:
        _fields(request, ("effect_id", "destination", "text"), "input")
        if request["destination"] != "operator" or not isinstance(request["text"], str):
            raise ValueError("delivery.review goes to the operator with a text")


def _positive_int(v, low):
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def decision(slot, value):
    if slot == "attention.plan":
        if isinstance(value, SDK.Wake) and _positive_int(value.priority, 0) and value.priority < 2**32:
            return {"action": "wake", "priority": value.priority}
        if isinstance(value, SDK.Defer) and isinstance(value.seconds, (int, float)) \
                and not isinstance(value.seconds, bool) and math.isfinite(value.seconds) \
                and 0 < value.seconds <= DEFER_SECONDS_MAX:
            return {"action": "defer", "seconds": value.seconds}
        if isinstance(value, SDK.Ignore) and isinstance(value.reason, str):
            return {"action": "ignore", "reason": value.reason}
    else:
        if isinstance(value, SDK.Allow):
            return {"action": "allow"}
        if isinstance(value, SDK.Hold) and isinstance(value.reason, str):
            return {"action": "hold", "reason": value.reason}
    raise ValueError(f"{slot} returned {value!r}, not one of its decisions")


# ---------------------------------------------------------------- skills


def skills_revision(skills):
    """SHA-256 fed, per skill in id order, u64BE id length, id, u64BE body length, body."""
    digest = hashlib.sha256()
    for skill_id, body in skills:
        for part in (skill_id.encode("utf-8"), body.encode("utf-8")):
            digest.update(struct.pack(">Q", len(part)) + part)
    return digest.hexdigest()


class Skills:
    """The set of `--skills PATH` (`{"version": 1, "revision", "skills": [{"id", "digest",
    "body"}]}`), checked whole: ids in order, once each, importable; every digest and the
    revision recomputed. `klbr.skills.<id>` is then a synthetic module whose `__doc__` is
    the body (`find_spec`: last on sys.meta_path, so a real package of that name wins)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            data = parse_json(f.read())
        if not isinstance(data, dict) or set(data) != {"version", "revision", "skills"} \
                or data["version"] != SKILLS_SET_VERSION or not isinstance(data["skills"], list):
            raise ValueError("not {\"version\":1,\"revision\",\"skills\":[...]}")
        self.bodies = {}
        for skill in data["skills"]:
            if not isinstance(skill, dict) or set(skill) != {"id", "digest", "body"} \
                    or not all(isinstance(v, str) for v in skill.values()):
                raise ValueError("a skill is not {\"id\",\"digest\",\"body\"}")
            skill_id, body = skill["id"], skill["body"]
            if not SKILL_ID_RE.fullmatch(skill_id) or keyword.iskeyword(skill_id):
                raise ValueError(f"{skill_id!r} is not a skill id")
            if self.bodies and skill_id <= list(self.bodies)[-1]:
                raise ValueError(f"{skill_id!r} is out of order or repeated")
            if hashlib.sha256(body.encode("utf-8")).hexdigest() != skill["digest"]:
                raise ValueError(f"the body of {skill_id!r} does not have its digest")
            self.bodies[skill_id] = body
        self.revision = skills_revision(self.bodies.items())
        if data["revision"] != self.revision:
            raise ValueError("the set does not have its revision")

    def find_spec(self, name, path=None, target=None):
        if name in ("klbr", "klbr.skills"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        if name.startswith("klbr.skills.") and name[len("klbr.skills."):] in self.bodies:
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = self.bodies.get(module.__name__[len("klbr.skills."):])


# ---------------------------------------------------------------- main


def log(text):
    sys.__stderr__.write(f"contract_worker: {text}\n")
    sys.__stderr__.flush()


async def _guarded(coro):
    """A task's body: KeyboardInterrupt or SystemExit raised in a background task would
    end the event loop (asyncio re-raises them), and so the worker; it ends that task
    instead, as an ordinary exception."""
    try:
        return await coro
    except (KeyboardInterrupt, SystemExit) as e:
        raise RuntimeError(f"{type(e).__name__} raised in a task") from e


def _task_factory(loop, coro, context=None):
    return asyncio.Task(_guarded(coro), loop=loop, context=context)


async def amain():
    asyncio.get_running_loop().set_task_factory(_task_factory)
    env = os.environ
    try:
        path = env["CONTRACT_WORKER_SOCKET"]
        token = env["CONTRACT_WORKER_TOKEN"]
        session_id = env["CONTRACT_WORKER_SESSION_ID"]
        generation = env["CONTRACT_WORKER_GENERATION"]
    except KeyError as e:
        log(f"missing environment variable {e.args[0]}")
        return EXIT_LAUNCH
    role = env.get("CONTRACT_WORKER_ROLE", "workbench")
    if role not in ("workbench", "hooks"):
        log(f"unknown role {role!r}")
        return EXIT_LAUNCH
    args = sys.argv[1:]
    skills = None
    if args:
        if len(args) != 2 or args[0] != "--skills" or role != "workbench":
            log(f"unknown arguments {args!r} (a workbench takes --skills PATH)")
            return EXIT_LAUNCH
        try:
            skills = Skills(args[1])
        except BaseException as e:
            log(f"skills set refused: {type(e).__name__}: {e}")
            return EXIT_LAUNCH
        sys.meta_path.append(skills)
    hooks = None
    if role == "hooks":
        try:
            hooks = Hooks(env["CONTRACT_WORKER_HOOKS_DIR"])
        except BaseException as e:
            log(f"hook sources refused: {type(e).__name__}: {e}")
            return EXIT_LAUNCH
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as e:
        log(f"cannot connect to {path}: {e}")
        return EXIT_LAUNCH
    sock.setblocking(False)
    worker = Worker(sock, session_id, generation)
    worker.hooks = hooks
    await worker.send({"kind": "hello", "token": token, "role": role,
                       "revision": hooks.revision if hooks else skills.revision if skills else None,
                       "slots": SLOTS if hooks else []})
    try:
        status = await worker.serve()
    except WireError as e:
        log(f"protocol violation ({e.code})" if DIFFERENT else f"invalid frame: {e.code}: {e}")
        status = EXIT_INVALID
    except OSError as e:
        log(f"connection failed: {e}")
        status = EXIT_INVALID
    if worker.current is not None:
        worker.current[1].cancel()
    # Tasks still running (a request pending at shutdown) end with the socket: quietly.
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
    sock.close()
    if DIFFERENT and status == EXIT_INVALID:
        # Invalidating the connection is what the spec asks; whether the process ends, and
        # when, is the worker's: this one lingers a while after closing it.
        await asyncio.sleep(1.0)
    return status


def classify_stdin():
    """`--classify`: one JSON line per frame in (`{"payload_b64", "session_id",
    "generation"}`), one line out (`{"code": null}` when the frame decodes, else its
    code): the differential test of the Rust and Python decoders."""
    import base64
    for line in sys.stdin:
        case = json.loads(line)
        try:
            decode_host_frame(base64.b64decode(case["payload_b64"]), case["session_id"], case["generation"])
            code = None
        except WireError as e:
            code = e.code
        sys.stdout.write(json.dumps({"code": code}) + "\n")
    sys.stdout.flush()


def main():
    if sys.argv[1:] == ["--classify"]:
        classify_stdin()
        return
    sys.exit(asyncio.run(amain()))


if __name__ == "__main__":
    main()
