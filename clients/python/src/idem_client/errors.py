"""The client's errors: one class per problem ``type`` idemd publishes, and the transport errors.

Every error the client raises is an ``IdemError``. Answers from the server that are errors are
``ProblemError`` (or a subclass chosen by the problem's ``type``); failures to get an answer are
``TransportError``; answers the client cannot use are ``ResponseError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

__all__ = [
    "IdemError",
    "TransportError",
    "AttemptTimeout",
    "ResponseError",
    "ResponseTooLarge",
    "FieldError",
    "ProblemError",
    "PROBLEM_TYPES",
    "problem_class",
    "parse_problem",
    # problem kinds
    "InvalidRequest",
    "MalformedJson",
    "ValidationFailed",
    "UnsupportedMediaType",
    "PayloadTooLarge",
    "HeadersTooLarge",
    "UriTooLong",
    "MalformedRequest",
    "Unauthorized",
    "NotFound",
    "MethodNotAllowed",
    "KeyReused",
    "InProgress",
    "OrderConflict",
    "OrderInProgress",
    "QuotaExceeded",
    "PaymentDeclined",
    "ProviderUnavailable",
    "ProviderTimeout",
    "Unavailable",
    "Timeout",
    "Overloaded",
    "ShuttingDown",
    "NotReady",
    "Internal",
    "AnswerTooLarge",
    "UpstreamUnavailable",
    "UpstreamTimeout",
    "UpstreamFailed",
    "UpstreamOutcomeUnknown",
]

# The most problem+json this client parses; larger bodies are kept as bytes but not parsed.
MAX_PROBLEM_BYTES = 64 * 1024


class IdemError(Exception):
    """Base of every error the client raises.

    key:        the Idempotency-Key of the operation ("" for calls without one).
    attempts:   requests sent for the operation.
    stopped_by: why retrying stopped when the error was retryable: "attempts", "deadline", "budget";
                None when the error is final (not retried by nature).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.key: str = ""
        self.attempts: int = 0
        self.stopped_by: str | None = None


class TransportError(IdemError):
    """No usable answer arrived: connection refused or reset, DNS, TLS, a malformed HTTP response.
    ``cause`` holds the underlying exception. Retryable."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class AttemptTimeout(TransportError):
    """An attempt's timeout passed before its answer was complete. Retryable with the same key."""


class ResponseError(IdemError):
    """An answer arrived but the client cannot use it (a success body that is not what the API
    documents). ``status`` and ``body`` (bytes, capped) say what came."""

    def __init__(self, message: str, status: int = 0, body: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class ResponseTooLarge(ResponseError):
    """The answer's body exceeded the client's ``max_response_bytes``; it was not read further."""


@dataclass(frozen=True)
class FieldError:
    """One entry of a validation problem's ``errors``."""

    field: str
    message: str


class ProblemError(IdemError):
    """An error answer from the server, built from its problem+json (RFC 9457) when it has one.

    status, type, title, detail: from the body when valid, else from the HTTP status
    ("about:blank", the reason phrase, ""). ``errors``: validation-failed's field errors. ``body``:
    the raw bytes (capped). ``retry_after``: seconds, when the server sent ``Retry-After``.
    ``replayed``/``key_expires``: the replay metadata (``Idempotent-Replayed``,
    ``Idempotency-Key-Expires``). ``headers``: names in lower case.
    """

    TYPE: str | None = None  # the problem type a subclass stands for

    def __init__(
        self,
        status: int,
        type: str,
        title: str,
        detail: str,
        *,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        errors: tuple[FieldError, ...] = (),
        retry_after: float | None = None,
        replayed: bool = False,
        key_expires: datetime | None = None,
    ) -> None:
        super().__init__("%d %s: %s%s" % (status, type, title, (" - " + detail) if detail else ""))
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.body = body
        self.headers: dict[str, str] = dict(headers or {})
        self.errors = errors
        self.retry_after = retry_after
        self.replayed = replayed
        self.key_expires = key_expires



class InvalidRequest(ProblemError):
    """400 invalid-request: e.g. a missing or malformed Idempotency-Key. Final."""

    TYPE = "urn:idem:problem:invalid-request"


class MalformedJson(ProblemError):
    """400 malformed-json. Final."""

    TYPE = "urn:idem:problem:malformed-json"


class ValidationFailed(ProblemError):
    """400 validation-failed, with ``errors`` (field, message). Final for that exact request."""

    TYPE = "urn:idem:problem:validation-failed"


class UnsupportedMediaType(ProblemError):
    """415 unsupported-media-type. Final."""

    TYPE = "urn:idem:problem:unsupported-media-type"


class PayloadTooLarge(ProblemError):
    """413 payload-too-large (body over 64 KiB). Final."""

    TYPE = "urn:idem:problem:payload-too-large"


class HeadersTooLarge(ProblemError):
    """431 headers-too-large. Final."""

    TYPE = "urn:idem:problem:headers-too-large"


class UriTooLong(ProblemError):
    """414 uri-too-long. Final."""

    TYPE = "urn:idem:problem:uri-too-long"


class MalformedRequest(ProblemError):
    """400 malformed-request (HTTP level). Final."""

    TYPE = "urn:idem:problem:malformed-request"


class Unauthorized(ProblemError):
    """401 unauthorized: missing or unknown API key. Final."""

    TYPE = "urn:idem:problem:unauthorized"


class NotFound(ProblemError):
    """404 not-found (also another tenant's payment or another principal's key). Final."""

    TYPE = "urn:idem:problem:not-found"


class MethodNotAllowed(ProblemError):
    """405 method-not-allowed. Final."""

    TYPE = "urn:idem:problem:method-not-allowed"


class KeyReused(ProblemError):
    """422 idempotency-key-reused: the key was used with a different request. Final: never retried."""

    TYPE = "urn:idem:problem:idempotency-key-reused"


class InProgress(ProblemError):
    """409 request-in-progress: the first request with this key still runs. Retried (Retry-After);
    raised only when retrying stopped."""

    TYPE = "urn:idem:problem:request-in-progress"


class OrderConflict(ProblemError):
    """409 order-conflict: the merchant order was paid with another amount or currency. Final."""

    TYPE = "urn:idem:problem:order-conflict"


class OrderInProgress(ProblemError):
    """409 order-in-progress: another key pays this order right now. Retried (Retry-After)."""

    TYPE = "urn:idem:problem:order-in-progress"


class QuotaExceeded(ProblemError):
    """429 quota-exceeded: too many running or retained keys, or new keys per second. Retried."""

    TYPE = "urn:idem:problem:quota-exceeded"


class PaymentDeclined(ProblemError):
    """402 payment-declined: the provider declined; final, the same key replays it."""

    TYPE = "urn:idem:problem:payment-declined"


class ProviderUnavailable(ProblemError):
    """503 provider-unavailable. Retried with the same key."""

    TYPE = "urn:idem:problem:provider-unavailable"


class ProviderTimeout(ProblemError):
    """504 provider-timeout: the outcome is unknown; retried with the same key (idemd looks the
    charge up before charging again)."""

    TYPE = "urn:idem:problem:provider-timeout"


class Unavailable(ProblemError):
    """503 unavailable (e.g. the store). Retried."""

    TYPE = "urn:idem:problem:unavailable"


class Timeout(ProblemError):
    """504 timeout. Retried with the same key."""

    TYPE = "urn:idem:problem:timeout"


class Overloaded(ProblemError):
    """503 overloaded. Retried."""

    TYPE = "urn:idem:problem:overloaded"


class ShuttingDown(ProblemError):
    """503 shutting-down (draining). Retried."""

    TYPE = "urn:idem:problem:shutting-down"


class NotReady(ProblemError):
    """503 not-ready. Retried."""

    TYPE = "urn:idem:problem:not-ready"


class Internal(ProblemError):
    """500 internal. Final (not retried)."""

    TYPE = "urn:idem:problem:internal"


class AnswerTooLarge(ProblemError):
    """502 answer-too-large: the result could not be stored; final for the key."""

    TYPE = "urn:idem:problem:answer-too-large"


class UpstreamUnavailable(ProblemError):
    """502 upstream-unavailable (gateway): nothing was sent, or the status URL could not tell.
    Retried (it carries Retry-After)."""

    TYPE = "urn:idem:problem:upstream-unavailable"


class UpstreamTimeout(ProblemError):
    """504 upstream-timeout (gateway): the outcome is unknown. Retried with the same key."""

    TYPE = "urn:idem:problem:upstream-timeout"


class UpstreamFailed(ProblemError):
    """502 upstream-failed (gateway): an undeclared upstream 5xx, outcome unknown. Final here: a
    caller may retry later with the same key."""

    TYPE = "urn:idem:problem:upstream-failed"


class UpstreamOutcomeUnknown(ProblemError):
    """502 upstream-outcome-unknown (gateway): final, nothing is forwarded again."""

    TYPE = "urn:idem:problem:upstream-outcome-unknown"


_ALL_KINDS: tuple[type[ProblemError], ...] = (
    InvalidRequest, MalformedJson, ValidationFailed, UnsupportedMediaType, PayloadTooLarge,
    HeadersTooLarge, UriTooLong, MalformedRequest, Unauthorized, NotFound, MethodNotAllowed,
    KeyReused, InProgress, OrderConflict, OrderInProgress, QuotaExceeded, PaymentDeclined,
    ProviderUnavailable, ProviderTimeout, Unavailable, Timeout, Overloaded, ShuttingDown, NotReady,
    Internal, AnswerTooLarge, UpstreamUnavailable, UpstreamTimeout, UpstreamFailed,
    UpstreamOutcomeUnknown,
)

PROBLEM_TYPES: Mapping[str, type[ProblemError]] = {c.TYPE: c for c in _ALL_KINDS if c.TYPE}
"""Every problem ``type`` idemd publishes, to its class."""


def problem_class(type_: str) -> type[ProblemError]:
    """The class for a problem ``type``; ``ProblemError`` for a type this client does not know."""
    return PROBLEM_TYPES.get(type_, ProblemError)


def _text(obj: Mapping[str, Any], name: str, limit: int = 4096) -> str | None:
    v = obj.get(name)
    if isinstance(v, str):
        return v[:limit]
    return None


def parse_problem(
    status: int,
    reason: str,
    content_type: str,
    body: bytes,
    *,
    headers: Mapping[str, str] | None = None,
    retry_after: float | None = None,
    replayed: bool = False,
    key_expires: datetime | None = None,
) -> ProblemError:
    """Builds the error for an error answer. Never raises: a body that is not a problem+json object
    (absent, too large, not JSON, not an object, wrong field types) gives a generic problem from the
    HTTP status. The class follows the body's ``type``, not the status."""
    type_ = "about:blank"
    title = reason or "HTTP %d" % status
    detail = ""
    errors: tuple[FieldError, ...] = ()
    ct = content_type.split(";", 1)[0].strip().lower()
    doc: Any = None
    if ct in ("application/problem+json", "application/json") and 0 < len(body) <= MAX_PROBLEM_BYTES:
        try:
            doc = json.loads(body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            doc = None
    if isinstance(doc, dict):
        type_ = _text(doc, "type", 1024) or type_
        title = _text(doc, "title") or title
        detail = _text(doc, "detail") or ""
        raw = doc.get("errors")
        if isinstance(raw, list):
            errors = tuple(
                FieldError(e["field"][:1024], e["message"][:4096])
                for e in raw[:1000]
                if isinstance(e, dict)
                and isinstance(e.get("field"), str)
                and isinstance(e.get("message"), str)
            )
    cls = problem_class(type_)
    return cls(
        status,
        type_,
        title,
        detail,
        body=body,
        headers=headers,
        errors=errors,
        retry_after=retry_after,
        replayed=replayed,
        key_expires=key_expires,
    )
