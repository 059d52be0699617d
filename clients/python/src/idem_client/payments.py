"""Typed values of idemd's payments API (POST /v1/payments, GET /v1/payments/{id},
GET /v1/operations/{key})."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Mapping

from idem_client.errors import ResponseError

if TYPE_CHECKING:
    from idem_client.client import Response

__all__ = ["PaymentRequest", "Payment", "PaymentResult", "Operation"]


@dataclass(frozen=True)
class PaymentRequest:
    """The body of ``POST /v1/payments``.

    amount: a decimal string ("100.00"), an int, or a Decimal -- never a float, so money does not go
    through binary floating point. ``trace_id`` is not part of the fingerprint on the server.
    """

    merchant_order_no: str
    amount: str | int | Decimal
    currency: str
    description: str | None = None
    metadata: Mapping[str, str] | None = None
    trace_id: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.amount, float) or isinstance(self.amount, bool):
            raise TypeError("amount must be a str, int or Decimal, not %s" % type(self.amount).__name__)
        if isinstance(self.amount, Decimal) and not self.amount.is_finite():
            raise ValueError("amount must be finite")

    def to_json(self) -> dict[str, Any]:
        amount = self.amount if isinstance(self.amount, str) else str(self.amount)
        doc: dict[str, Any] = {
            "merchant_order_no": self.merchant_order_no,
            "amount": amount,
            "currency": self.currency,
        }
        if self.description is not None:
            doc["description"] = self.description
        if self.metadata is not None:
            doc["metadata"] = dict(self.metadata)
        if self.trace_id is not None:
            doc["trace_id"] = self.trace_id
        return doc


def _malformed(message: str, response: Response | None) -> ResponseError:
    """The error for an answer that is not what its route promises, with the call's key."""
    err = ResponseError(message, response.status if response else 0,
                        response.body[:4096] if response else b"")
    if response is not None:
        err.key, err.attempts = response.key, response.attempts
    return err


def _field(doc: Mapping[str, Any], name: str, response: Response | None, optional: bool = False) -> Any:
    v = doc.get(name)
    if v is None and optional:
        return None
    if not isinstance(v, str):
        raise _malformed("the payment has no string %r" % name, response)
    return v


@dataclass(frozen=True)
class Payment:
    """A payment as idemd answers it; ``amount`` is the canonical decimal string."""

    id: str
    merchant_order_no: str
    amount: str
    currency: str
    status: str
    provider_charge_id: str | None
    created_at: str

    @classmethod
    def from_json(cls, doc: Any, response: Response | None = None) -> Payment:
        """Raises ResponseError when ``doc`` is not a payment object."""
        if not isinstance(doc, dict):
            raise _malformed("the answer is not a payment object", response)
        return cls(
            id=_field(doc, "id", response),
            merchant_order_no=_field(doc, "merchant_order_no", response),
            amount=_field(doc, "amount", response),
            currency=_field(doc, "currency", response),
            status=_field(doc, "status", response),
            provider_charge_id=_field(doc, "provider_charge_id", response, optional=True),
            created_at=_field(doc, "created_at", response),
        )


@dataclass(frozen=True)
class PaymentResult:
    """A payment and how it came: ``status`` 201 (created or replayed) or 200 (the order was already
    paid under another key); ``response`` holds the replay metadata and the raw answer."""

    payment: Payment
    response: Response

    @property
    def status(self) -> int:
        return self.response.status

    @property
    def key(self) -> str:
        return self.response.key

    @property
    def replayed(self) -> bool:
        return self.response.replayed

    @property
    def key_expires(self) -> datetime | None:
        return self.response.key_expires

    @property
    def attempts(self) -> int:
        return self.response.attempts


@dataclass(frozen=True)
class Operation:
    """``GET /v1/operations/{key}``: the caller's record for a key. ``response`` (the stored body) only
    once finished."""

    key: str
    state: str
    recovery_point: str
    status_code: int | None
    response: Any
    created_at: str
    expires_at: str

    @classmethod
    def from_json(cls, doc: Any, response: Response | None = None) -> Operation:
        """Raises ResponseError when ``doc`` is not an operation object."""
        if (
            not isinstance(doc, dict)
            or not isinstance(doc.get("key"), str)
            or not isinstance(doc.get("state"), str)
            or not (doc.get("status_code") is None or type(doc.get("status_code")) is int)
        ):
            raise _malformed("the answer is not an operation object", response)
        return cls(
            key=doc["key"],
            state=doc["state"],
            recovery_point=str(doc.get("recovery_point", "")),
            status_code=doc.get("status_code"),
            response=doc.get("response"),
            created_at=str(doc.get("created_at", "")),
            expires_at=str(doc.get("expires_at", "")),
        )
