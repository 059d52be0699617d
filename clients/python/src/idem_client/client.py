"""The retrying client: one Idempotency-Key per operation, the same bytes on every attempt.

Thread-safety: a ``Client`` holds no per-operation state; one instance serves many threads at once.
Its retry budget is shared on purpose (see ``RetryBudget``).
"""

from __future__ import annotations

import email.utils
import http.client
import json
import random as _random
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping

from idem_client.errors import (
    AttemptTimeout,
    IdemError,
    ProblemError,
    ResponseError,
    ResponseTooLarge,
    TransportError,
    parse_problem,
)
from idem_client.keys import new_key
from idem_client.payments import Operation, Payment, PaymentRequest, PaymentResult
from idem_client.retry import DEFAULT_BUDGET, RetryBudget, RetryPolicy, backoff_delay, parse_retry_after

__all__ = ["Client", "Response", "JsonBody", "RetryEvent"]

JsonBody = bytes | str | Mapping[str, Any] | list[Any] | None
"""A request body: bytes are sent as they are; str as UTF-8; anything else serialised once as JSON."""

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_IN_PROGRESS_TYPES = frozenset(
    {"urn:idem:problem:request-in-progress", "urn:idem:problem:order-in-progress"}
)
_READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Response:
    """The final answer of one operation (a status below 400).

    status, headers (names in lower case; repeated fields joined with ", "), body (bytes, exactly as
    received). key: the Idempotency-Key sent on every attempt ("" for safe methods). attempts: requests
    sent for the operation (operation polls not included); polls: ``GET /v1/operations/{key}`` reads
    made after a 202. replayed: ``Idempotent-Replayed: true``. key_expires: ``Idempotency-Key-Expires``
    (None if absent or malformed). location: the ``Location`` header, if any.
    """

    status: int
    headers: Mapping[str, str]
    body: bytes
    key: str = ""
    attempts: int = 1
    polls: int = 0
    replayed: bool = False
    key_expires: datetime | None = None
    location: str | None = None

    def json(self) -> Any:
        """The body parsed as JSON. Raises ResponseError when it is not JSON."""
        try:
            return json.loads(self.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            err = ResponseError("the answer's body is not JSON: %s" % e, self.status, self.body[:4096])
            err.key, err.attempts = self.key, self.attempts
            raise err from None


@dataclass(frozen=True)
class RetryEvent:
    """Given to ``on_retry`` before each back-off: the operation's key, the attempt that failed
    (1-based), its error (a ProblemError with the answer's status, or a TransportError), and the
    seconds the client will sleep before the next attempt."""

    key: str
    attempt: int
    error: IdemError
    delay: float


@dataclass
class _Raw:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    too_large: bool = False


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # A redirect is returned to the caller as it is: following one would turn a POST into a GET
    # and could send the API key elsewhere.
    def redirect_request(self, req: Any, fp: Any, code: Any, msg: Any, headers: Any, newurl: Any) -> None:
        return None


@dataclass
class _Attempt:
    """What one attempt left behind for the retry decision."""

    error: IdemError
    retry_after: float | None = None


@dataclass
class _Operation:
    method: str
    path: str
    body: bytes | None
    key: str
    wait: float | None
    respond_async: bool
    headers: dict[str, str] = field(default_factory=dict)


class Client:
    """A client of an idem-protected API (idemd's payments API, or any gateway route).

    base_url:           "http://host:port" (optionally with a path prefix); http or https.
    api_key:            sent as ``Authorization: Bearer <api_key>``.
    retry:              a RetryPolicy (default: 10 attempts, back-off 0.1 s doubling to 5 s, deadline 60 s).
    budget:             the RetryBudget retries draw from (default: the process-wide DEFAULT_BUDGET).
    timeout:            seconds per attempt: connecting, and the whole answer (default 10). With
                        ``wait``, an attempt may take ``timeout + wait``.
    max_response_bytes: the largest body read (default 1 MiB); more fails with ResponseTooLarge.
    sleep, clock, random, key_factory: injected for tests (defaults: time.sleep, time.monotonic,
                        random.random, keys.new_key); ``wall_clock`` (time.time) reads Retry-After dates.
    user_agent:         the User-Agent header.
    on_retry:           called with a RetryEvent before each back-off (for logs and metrics); what it
                        raises propagates and ends the operation.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        retry: RetryPolicy | None = None,
        budget: RetryBudget | None = None,
        timeout: float = 10.0,
        max_response_bytes: int = 1 << 20,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        random: Callable[[], float] = _random.random,
        key_factory: Callable[[], str] = new_key,
        user_agent: str = "idem-client-python/0.1",
        on_retry: Callable[[RetryEvent], None] | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError("base_url must be an http or https URL with a host: %r" % base_url)
        if parsed.query or parsed.fragment:
            raise ValueError("base_url takes no query or fragment")
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        if max_response_bytes < 0:
            raise ValueError("max_response_bytes must be >= 0")
        _check_header_value("api_key", api_key)
        self._scheme = parsed.scheme
        self._netloc = parsed.netloc
        self._prefix = parsed.path.rstrip("/")
        self._api_key = api_key
        self.retry = retry or RetryPolicy()
        self.budget = budget if budget is not None else DEFAULT_BUDGET
        self._timeout = float(timeout)
        self._max_bytes = max_response_bytes
        self._sleep = sleep
        self._clock = clock
        self._wall_clock = wall_clock
        self._random = random
        self._key_factory = key_factory
        self._user_agent = user_agent
        self._on_retry = on_retry
        self._opener = urllib.request.build_opener(_NoRedirects(), urllib.request.ProxyHandler({}))

    # ----------------------------------------------------------------------------------------------
    # Public calls

    def new_key(self) -> str:
        """A fresh operation key (a UUIDv7 unless another key_factory was given)."""
        return self._key_factory()

    def call(
        self,
        method: str,
        path: str,
        body: JsonBody = None,
        *,
        key: str | None = None,
        on_key: Callable[[str], None] | None = None,
        headers: Mapping[str, str] | None = None,
        wait: float | None = None,
        respond_async: bool = False,
        content_type: str = "application/json",
    ) -> Response:
        """Sends one operation, retrying as the contract allows, and returns its final answer.

        Unsafe methods (all but GET, HEAD, OPTIONS) carry ``Idempotency-Key``: ``key`` or a new one.
        ``on_key(key)`` runs before the first byte is sent, so the caller can persist the key and
        resume the same operation after a restart; if it raises, nothing is sent and its exception
        propagates. The body is serialised once and the same bytes go out on every attempt.

        ``wait`` (seconds) sends ``Prefer: wait=N``; ``respond_async`` sends ``Prefer: respond-async``
        (a 202 is then followed: the operation is polled and its answer collected with the same key).

        Returns the answer when its status is below 400. Raises: a ProblemError subclass for an error
        answer that is final, or for the last retryable one when retrying stopped (``stopped_by`` says
        why); TransportError / AttemptTimeout when the last attempt got no answer; ResponseTooLarge;
        ValueError for a key or header that cannot be sent.
        """
        method = method.upper()
        if not method.isascii() or not method.isalpha():
            raise ValueError("bad method %r" % method)
        if not path.startswith("/"):
            raise ValueError("path must start with '/': %r" % path)
        if wait is not None and wait < 0:
            raise ValueError("wait must be >= 0")
        extra: dict[str, str] = {}
        for name, value in (headers or {}).items():
            _check_header_value(name, value)
            if name.lower() in ("idempotency-key", "authorization", "content-length", "host"):
                raise ValueError("header %s is set by the client" % name)
            extra[name] = value
        data = _serialise(body)
        op_key = ""
        if method not in _SAFE_METHODS:
            op_key = key if key is not None else self._key_factory()
            _check_key(op_key)
        if data is not None:
            extra.setdefault("Content-Type", content_type)
        op = _Operation(method, path, data, op_key, wait, respond_async, extra)
        if on_key is not None and op_key:
            on_key(op_key)
        return self._run(op)

    def create_payment(
        self,
        request: PaymentRequest,
        *,
        key: str | None = None,
        on_key: Callable[[str], None] | None = None,
        wait: float | None = None,
        respond_async: bool = False,
    ) -> PaymentResult:
        """``POST /v1/payments`` as one operation (see ``call`` for keys, retries and errors).

        Returns the payment (201, or 200 when the order was already paid under another key). Raises
        KeyReused (422), ValidationFailed (400), PaymentDeclined (402), OrderConflict (409), ... as
        ``call`` does; ResponseError when a success body is not a payment.
        """
        response = self.call(
            "POST", "/v1/payments", request.to_json(), key=key, on_key=on_key, wait=wait,
            respond_async=respond_async,
        )
        if response.status not in (200, 201):
            err = ResponseError("unexpected status %d for a payment" % response.status,
                                response.status, response.body[:4096])
            err.key, err.attempts = response.key, response.attempts
            raise err
        return PaymentResult(Payment.from_json(response.json(), response), response)

    def get_payment(self, payment_id: str) -> Payment:
        """``GET /v1/payments/{id}``. Raises NotFound (also for another tenant's payment)."""
        response = self.call("GET", "/v1/payments/" + urllib.parse.quote(payment_id, safe=""))
        return Payment.from_json(response.json(), response)

    def get_operation(self, key: str) -> Operation:
        """``GET /v1/operations/{key}``: the caller's own record for ``key``. Raises NotFound."""
        response = self.call("GET", "/v1/operations/" + urllib.parse.quote(key, safe=""))
        return Operation.from_json(response.json(), response)

    # ----------------------------------------------------------------------------------------------
    # The retry loop

    def _run(self, op: _Operation) -> Response:
        policy = self.retry
        started = self._clock()
        attempts = 0
        polls = 0
        retries = 0
        accepted = False  # a 202 came: later attempts collect the answer without respond-async
        while True:
            attempts += 1
            outcome = self._attempt(op, accepted, started)
            if isinstance(outcome, _Raw):
                if outcome.status == 202 and op.key:
                    accepted = True
                    polls += self._follow(op, outcome, started)
                    if attempts < policy.max_attempts:
                        continue  # the next POST collects the answer (a replay); not a retry
                    return self._final(op, outcome, attempts, polls)
                verdict = self._classify(op, outcome, attempts)
                if verdict is None:
                    return self._final(op, outcome, attempts, polls)
                step = verdict
            else:
                step = outcome
            # A retryable failure: retry unless attempts, the deadline or the budget say no.
            stop: str | None = None
            delay = backoff_delay(policy, retries, self._random, step.retry_after)
            if attempts >= policy.max_attempts:
                stop = "attempts"
            elif self._clock() - started + delay >= policy.deadline:
                stop = "deadline"
            elif not self.budget.try_acquire():
                stop = "budget"
            if stop is not None:
                step.error.key, step.error.attempts, step.error.stopped_by = op.key, attempts, stop
                raise step.error
            if self._on_retry is not None:
                self._on_retry(RetryEvent(op.key, attempts, step.error, delay))
            self._sleep(delay)
            retries += 1

    def _attempt(self, op: _Operation, accepted: bool, started: float) -> _Raw | _Attempt:
        headers = {
            "Authorization": "Bearer " + self._api_key,
            "User-Agent": self._user_agent,
            "Accept": "application/json, application/problem+json",
        }
        headers.update(op.headers)
        if op.key:
            headers["Idempotency-Key"] = op.key
        prefer = []
        if op.respond_async and not accepted:
            prefer.append("respond-async")
        if op.wait is not None:
            prefer.append("wait=%d" % max(int(op.wait + 0.999), 0))
        if prefer:
            headers["Prefer"] = ", ".join(prefer)
        timeout = self._timeout + (op.wait or 0.0)
        remaining = self.retry.deadline - (self._clock() - started)
        timeout = max(min(timeout, remaining), 0.05)
        try:
            return self._send(op.method, self._url(op.path), headers, op.body, timeout)
        except TransportError as e:
            return _Attempt(e)

    def _classify(self, op: _Operation, raw: _Raw, attempts: int) -> _Attempt | None:
        """None when ``raw`` is final; else the retryable failure it is."""
        status = raw.status
        if status < 400:
            return None  # final (a success too large to read is reported by _final)
        retry_after = parse_retry_after(raw.headers.get("retry-after"), self._wall_clock())
        problem = self._problem(raw, retry_after)
        retryable = status in (429, 503, 504)
        if status == 409:
            retryable = retry_after is not None or problem.type in _IN_PROGRESS_TYPES
        elif status == 502:
            retryable = retry_after is not None  # upstream-unavailable: nothing was sent
        if not retryable:
            return None
        return _Attempt(problem, retry_after)

    def _final(self, op: _Operation, raw: _Raw, attempts: int, polls: int) -> Response:
        if raw.status < 500:
            self.budget.record_success()  # the service answered: it is working
        if raw.too_large:
            err = ResponseTooLarge(
                "the answer (HTTP %d) exceeds max_response_bytes=%d" % (raw.status, self._max_bytes),
                raw.status,
                raw.body[:4096],
            )
            err.key, err.attempts = op.key, attempts
            raise err
        if raw.status >= 400:
            retry_after = parse_retry_after(raw.headers.get("retry-after"), self._wall_clock())
            problem = self._problem(raw, retry_after)
            problem.key, problem.attempts = op.key, attempts
            raise problem
        return Response(
            status=raw.status,
            headers=raw.headers,
            body=raw.body,
            key=op.key,
            attempts=attempts,
            polls=polls,
            replayed=_replayed(raw.headers),
            key_expires=_http_date(raw.headers.get("idempotency-key-expires")),
            location=raw.headers.get("location"),
        )

    def _problem(self, raw: _Raw, retry_after: float | None) -> ProblemError:
        return parse_problem(
            raw.status,
            raw.reason,
            raw.headers.get("content-type", ""),
            b"" if raw.too_large else raw.body,
            headers=raw.headers,
            retry_after=retry_after,
            replayed=_replayed(raw.headers),
            key_expires=_http_date(raw.headers.get("idempotency-key-expires")),
        )

    def _follow(self, op: _Operation, accepted: _Raw, started: float) -> int:
        """After a 202: polls the operation until it no longer runs, the deadline nears, or a poll
        cannot tell. Returns the polls made. The caller then asks again with the same key."""
        target = self._same_origin(accepted.headers.get("location"))
        if target is None:
            target = "/v1/operations/" + urllib.parse.quote(op.key, safe="")
        policy = self.retry
        polls = 0
        retry_after = parse_retry_after(accepted.headers.get("retry-after"), self._wall_clock())
        while True:
            delay = min(policy.max_backoff, policy.initial_backoff * (polls + 1))
            if retry_after is not None:
                delay = max(delay, retry_after)
            if self._clock() - started + delay >= policy.deadline:
                return polls
            self._sleep(delay)
            polls += 1
            headers = {
                "Authorization": "Bearer " + self._api_key,
                "User-Agent": self._user_agent,
                "Accept": "application/json",
            }
            remaining = policy.deadline - (self._clock() - started)
            try:
                raw = self._send("GET", self._url(target), headers, None,
                                 max(min(self._timeout, remaining), 0.05))
            except TransportError:
                if not self.budget.try_acquire():
                    return polls
                retry_after = None
                continue
            retry_after = parse_retry_after(raw.headers.get("retry-after"), self._wall_clock())
            if raw.status in (429, 503, 504):
                if not self.budget.try_acquire():
                    return polls
                continue
            if raw.status != 200 or raw.too_large:
                return polls  # gone or not ours to read: the next POST tells
            try:
                doc = json.loads(raw.body.decode("utf-8"))
            except (ValueError, UnicodeDecodeError, RecursionError):
                return polls
            if not isinstance(doc, dict) or doc.get("state") != "PROCESSING":
                return polls

    # ----------------------------------------------------------------------------------------------
    # HTTP

    def _url(self, path: str) -> str:
        return "%s://%s%s%s" % (self._scheme, self._netloc, self._prefix, path)

    def _same_origin(self, location: str | None) -> str | None:
        """The path (with query) of a Location on this client's origin, relative to the prefix; None
        for an absent or foreign one (never followed: it would receive the API key)."""
        if not location:
            return None
        try:
            u = urllib.parse.urlsplit(location)
        except ValueError:
            return None
        if (u.scheme or u.netloc) and (u.scheme != self._scheme or u.netloc != self._netloc):
            return None
        if not u.path.startswith("/") or any(ord(c) < 0x21 or ord(c) > 0x7E for c in location):
            return None
        path = u.path
        if self._prefix and path.startswith(self._prefix + "/"):
            path = path[len(self._prefix):]
        return path + ("?" + u.query if u.query else "")

    def _send(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: float
    ) -> _Raw:
        """One HTTP exchange. Raises TransportError (AttemptTimeout when ``timeout`` passed); every
        status, 4xx and 5xx included, is returned."""
        request = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
        deadline = self._clock() + timeout
        resp: Any
        try:
            resp = self._opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as e:
            resp = e  # an answer with an error status: read it like any other
        except urllib.error.URLError as e:
            if isinstance(e.reason, (TimeoutError, socket.timeout)):
                raise AttemptTimeout("no answer within %.3f s" % timeout, e) from None
            raise TransportError("cannot reach %s: %s" % (self._netloc, e.reason), e) from None
        except (TimeoutError, socket.timeout) as e:
            raise AttemptTimeout("no answer within %.3f s" % timeout, e) from None
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise TransportError("exchange with %s failed: %r" % (self._netloc, e), e) from None
        try:
            status = int(resp.status if resp.status is not None else resp.code)
            reason = str(getattr(resp, "reason", "") or "")[:256]
            msg = resp.headers
            names: dict[str, str] = {}
            if msg is not None:
                for name in msg.keys():
                    lower = name.lower()
                    if lower in names:
                        continue
                    values = msg.get_all(name) or []
                    names[lower] = ", ".join(str(v) for v in values)[:16384]
            body, too_large = self._read_body(resp, deadline, timeout)
            return _Raw(status, reason, names, body, too_large)
        except (TimeoutError, socket.timeout) as e:
            raise AttemptTimeout("the answer did not finish within %.3f s" % timeout, e) from None
        except (OSError, http.client.HTTPException, ValueError, AttributeError, TypeError) as e:
            raise TransportError("reading the answer from %s failed: %r" % (self._netloc, e), e) from None
        finally:
            try:
                resp.close()
            except Exception:  # noqa: BLE001 - closing a broken connection must not mask the result
                pass

    def _read_body(self, resp: Any, deadline: float, timeout: float) -> tuple[bytes, bool]:
        chunks: list[bytes] = []
        size = 0
        while True:
            if self._clock() > deadline:
                raise AttemptTimeout("the answer did not finish within %.3f s" % timeout)
            want = min(_READ_CHUNK, self._max_bytes + 1 - size)
            if want <= 0:
                return b"".join(chunks)[: self._max_bytes], True
            chunk = resp.read(want)
            if not chunk:
                inner = resp if isinstance(resp, http.client.HTTPResponse) else getattr(resp, "fp", None)
                left = getattr(inner, "length", None) if isinstance(inner, http.client.HTTPResponse) else None
                if isinstance(left, int) and left > 0:  # the connection ended before Content-Length
                    raise http.client.IncompleteRead(b"".join(chunks), left)
                return b"".join(chunks), False
            chunks.append(chunk)
            size += len(chunk)


def _serialise(body: JsonBody) -> bytes | None:
    if body is None:
        return None
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ValueError("the body cannot be serialised as JSON: %s" % e) from None


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > 1024:
        raise ValueError("an Idempotency-Key must be a non-empty string of at most 1024 characters")
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in key):
        raise ValueError("an Idempotency-Key holds printable ASCII only: %r" % key)


def _check_header_value(name: str, value: str) -> None:
    if not isinstance(name, str) or not isinstance(value, str):
        raise ValueError("header names and values are strings")
    if not name or any(ord(c) <= 0x20 or ord(c) > 0x7E or c == ":" for c in name):
        raise ValueError("bad header name %r" % name)
    if any(c in "\r\n\0" for c in value):
        raise ValueError("header %s holds a line break" % name)


def _replayed(headers: Mapping[str, str]) -> bool:
    return headers.get("idempotent-replayed", "").strip().lower() == "true"


def _http_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return when if when.tzinfo is not None else None
