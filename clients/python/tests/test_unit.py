"""Unit tests without a network: keys, back-off, the budget, Retry-After, problem mapping, payment values."""

from __future__ import annotations

import threading
import unittest
from decimal import Decimal

from idem_client import (
    PROBLEM_TYPES,
    Client,
    FieldError,
    InProgress,
    KeyReused,
    Operation,
    OrderConflict,
    Payment,
    PaymentRequest,
    ProblemError,
    QuotaExceeded,
    ResponseError,
    RetryBudget,
    RetryPolicy,
    ValidationFailed,
    backoff_delay,
    is_uuid7,
    new_key,
    parse_problem,
    parse_retry_after,
    valid_key,
)
import idem_client.errors as errors_module


class KeyTest(unittest.TestCase):
    def test_uuid7_layout(self) -> None:
        now_ns = 1_764_000_000_123_456_789
        rand = bytes(range(1, 11))
        key = new_key(lambda: now_ns, lambda n: rand[:n])
        self.assertTrue(is_uuid7(key), key)
        self.assertTrue(valid_key(key))
        hexdigits = key.replace("-", "")
        self.assertEqual(int(hexdigits[:12], 16), now_ns // 1_000_000, "48 bits of Unix milliseconds")
        self.assertEqual(hexdigits[12], "7", "version 7")
        self.assertIn(hexdigits[16], "89ab", "variant 0b10")
        # 74 random bits: the 12 after the version and the 62 after the variant.
        value = int(hexdigits, 16)
        r = int.from_bytes(rand, "big")
        self.assertEqual((value >> 64) & 0xFFF, r & 0xFFF)
        self.assertEqual(value & ((1 << 62) - 1), (r >> 12) & ((1 << 62) - 1))

    def test_keys_differ_and_order_by_time(self) -> None:
        keys = [new_key() for _ in range(1000)]
        self.assertEqual(len(set(keys)), 1000)
        self.assertTrue(all(is_uuid7(k) for k in keys))
        early = new_key(lambda: 1_000 * 1_000_000)
        late = new_key(lambda: 2_000 * 1_000_000)
        self.assertLess(early, late)

    def test_a_short_random_source_is_refused(self) -> None:
        with self.assertRaises(ValueError):
            new_key(urandom=lambda n: b"\x00" * (n - 1))

    def test_is_uuid7_rejects_other_forms(self) -> None:
        for text in ["01890a5d-ac96-4ed1-8f00-000000000000",  # version 4
                     "01890a5d-ac96-7ed1-cf00-000000000000",  # variant 0b11
                     "01890A5D-AC96-7ED1-8F00-000000000000",  # upper case
                     "01890a5dac967ed18f00000000000000"]:
            self.assertFalse(is_uuid7(text), text)


class BackoffTest(unittest.TestCase):
    policy = RetryPolicy(initial_backoff=0.1, max_backoff=2.0)

    def test_full_jitter_bounds_double_and_cap(self) -> None:
        for retry, cap in [(0, 0.1), (1, 0.2), (2, 0.4), (4, 1.6), (5, 2.0), (40, 2.0)]:
            self.assertAlmostEqual(backoff_delay(self.policy, retry, lambda: 0.999999), cap, places=4)
            self.assertEqual(backoff_delay(self.policy, retry, lambda: 0.0), 0.0)
            self.assertAlmostEqual(backoff_delay(self.policy, retry, lambda: 0.5), cap / 2)

    def test_never_sooner_than_retry_after(self) -> None:
        self.assertEqual(backoff_delay(self.policy, 0, lambda: 0.5, retry_after=3.0), 3.0)
        self.assertAlmostEqual(backoff_delay(self.policy, 5, lambda: 0.9, retry_after=1.0), 1.8)

    def test_a_misbehaving_random_source_stays_in_bounds(self) -> None:
        for r in [-1.0, 7.0, float("nan")]:
            d = backoff_delay(self.policy, 3, lambda: r)
            self.assertTrue(0.0 <= d <= 0.8, (r, d))

    def test_policy_validation(self) -> None:
        with self.assertRaises(ValueError):
            RetryPolicy(max_attempts=0)
        with self.assertRaises(ValueError):
            RetryPolicy(deadline=0)
        with self.assertRaises(ValueError):
            RetryPolicy(initial_backoff=-1)


class RetryAfterTest(unittest.TestCase):
    def test_forms(self) -> None:
        now = 1_700_000_000.0
        self.assertEqual(parse_retry_after("1", now), 1.0)
        self.assertEqual(parse_retry_after(" 30 ", now), 30.0)
        self.assertEqual(parse_retry_after("99999999999999999999", now), 3600.0)
        self.assertEqual(parse_retry_after("Tue, 14 Nov 2023 22:13:30 GMT", now), 10.0)
        self.assertEqual(parse_retry_after("Tue, 14 Nov 2023 22:00:00 GMT", now), 0.0, "past: at once")
        for bad in [None, "", "-1", "1.5", "soon", "١٢", "Tue, 99 Nov 2023 99:99:99 GMT"]:
            self.assertIsNone(parse_retry_after(bad, now), bad)


class BudgetTest(unittest.TestCase):
    def test_tokens_are_taken_and_refilled(self) -> None:
        b = RetryBudget(capacity=2, retry_cost=1, refill_per_success=0.5)
        self.assertTrue(b.try_acquire())
        self.assertTrue(b.try_acquire())
        self.assertFalse(b.try_acquire(), "empty")
        self.assertEqual(b.tokens, 0.0)
        b.record_success()
        self.assertFalse(b.try_acquire(), "half a token is not a retry")
        b.record_success()
        self.assertTrue(b.try_acquire())
        for _ in range(10):
            b.record_success()
        self.assertEqual(b.tokens, 2.0, "never beyond capacity")

    def test_thread_safe(self) -> None:
        b = RetryBudget(capacity=1000, refill_per_success=0)
        taken: list[int] = []
        lock = threading.Lock()

        def worker() -> None:
            n = 0
            for _ in range(500):
                if b.try_acquire():
                    n += 1
            with lock:
                taken.append(n)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(sum(taken), 1000, "exactly the capacity, no token handed out twice")
        self.assertEqual(b.tokens, 0.0)

    def test_validation(self) -> None:
        with self.assertRaises(ValueError):
            RetryBudget(retry_cost=0)
        with self.assertRaises(ValueError):
            RetryBudget(capacity=-1)


class ProblemTest(unittest.TestCase):
    def test_every_published_type_has_its_class(self) -> None:
        # The kinds docs/idemd.md lists under "Problem types", plus answer-too-large (http/problem.cc).
        published = """invalid-request malformed-json validation-failed unsupported-media-type
            payload-too-large headers-too-large uri-too-long malformed-request unauthorized not-found
            method-not-allowed idempotency-key-reused request-in-progress order-conflict
            order-in-progress quota-exceeded payment-declined provider-unavailable provider-timeout
            unavailable timeout overloaded shutting-down not-ready internal answer-too-large
            upstream-unavailable upstream-timeout upstream-failed upstream-outcome-unknown""".split()
        self.assertEqual(set(PROBLEM_TYPES), {"urn:idem:problem:" + k for k in published})
        for type_, cls in PROBLEM_TYPES.items():
            self.assertTrue(issubclass(cls, ProblemError))
            self.assertEqual(cls.TYPE, type_)
            self.assertIn(cls.__name__, errors_module.__all__)
            e = parse_problem(400, "x", "application/problem+json",
                              b'{"type":"%s","title":"t","status":400,"detail":"d"}' % type_.encode())
            self.assertIs(type(e), cls)
        self.assertIs(PROBLEM_TYPES["urn:idem:problem:idempotency-key-reused"], KeyReused)
        self.assertIs(PROBLEM_TYPES["urn:idem:problem:request-in-progress"], InProgress)
        self.assertIs(PROBLEM_TYPES["urn:idem:problem:order-conflict"], OrderConflict)
        self.assertIs(PROBLEM_TYPES["urn:idem:problem:quota-exceeded"], QuotaExceeded)

    def test_fields_and_validation_errors(self) -> None:
        body = (b'{"type":"urn:idem:problem:validation-failed","title":"Bad Request","status":400,'
                b'"detail":"invalid body","errors":[{"field":"amount","message":"must be > 0"},'
                b'{"field":1},"junk"]}')
        e = parse_problem(400, "Bad Request", "application/problem+json; charset=utf-8", body)
        self.assertIsInstance(e, ValidationFailed)
        self.assertEqual((e.status, e.title, e.detail), (400, "Bad Request", "invalid body"))
        self.assertEqual(e.errors, (FieldError("amount", "must be > 0"),))
        self.assertEqual(e.body, body)

    def test_unknown_type_is_a_generic_problem(self) -> None:
        e = parse_problem(418, "I'm a teapot", "application/problem+json",
                          b'{"type":"https://example.com/teapot","title":"Teapot","detail":"short"}')
        self.assertIs(type(e), ProblemError)
        self.assertEqual((e.status, e.type, e.title, e.detail),
                         (418, "https://example.com/teapot", "Teapot", "short"))

    def test_malformed_bodies_never_raise(self) -> None:
        cases = [
            ("application/problem+json", b""),
            ("application/problem+json", b"not json"),
            ("application/problem+json", b"[1,2,3]"),
            ("application/problem+json", b'{"type":5,"title":null,"detail":["x"]}'),
            ("application/problem+json", b"\xff\xfe\x00"),
            ("application/problem+json", b"[" * 100000),
            ("application/problem+json", b'{"type":"' + b"a" * 200000 + b'"}'),
            ("text/html", b'{"type":"urn:idem:problem:idempotency-key-reused"}'),
            ("", b"<html>502</html>"),
        ]
        for ct, body in cases:
            e = parse_problem(502, "Bad Gateway", ct, body)
            self.assertIs(type(e), ProblemError, (ct, body[:40]))
            self.assertEqual((e.status, e.type, e.title, e.detail), (502, "about:blank", "Bad Gateway", ""))
        self.assertEqual(parse_problem(500, "", "", b"").title, "HTTP 500")

    def test_class_follows_type_not_status(self) -> None:
        e = parse_problem(409, "Conflict", "application/json",
                          b'{"type":"urn:idem:problem:order-conflict","title":"Conflict"}')
        self.assertIsInstance(e, OrderConflict)
        self.assertNotIsInstance(e, InProgress)


class PaymentValuesTest(unittest.TestCase):
    def test_request_json(self) -> None:
        self.assertEqual(PaymentRequest("ORD-1", Decimal("12.50"), "EUR", metadata={"k": "v"}).to_json(),
                         {"merchant_order_no": "ORD-1", "amount": "12.50", "currency": "EUR",
                          "metadata": {"k": "v"}})
        self.assertEqual(PaymentRequest("ORD-1", 100, "JPY").to_json()["amount"], "100")
        with self.assertRaises(TypeError):
            PaymentRequest("ORD-1", 1.1, "CNY")  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            PaymentRequest("ORD-1", Decimal("NaN"), "CNY")

    def test_payment_from_json(self) -> None:
        doc = {"id": "pay_1", "merchant_order_no": "ORD-1", "amount": "1.00", "currency": "CNY",
               "status": "succeeded", "provider_charge_id": "ch_1", "created_at": "2026-01-01T00:00:00.000Z"}
        self.assertEqual(Payment.from_json(doc).provider_charge_id, "ch_1")
        for bad in [[], {"id": 5}, dict(doc, amount=1)]:
            with self.assertRaises(ResponseError):
                Payment.from_json(bad)
        with self.assertRaises(ResponseError):
            Operation.from_json({"key": "k", "state": "SUCCEEDED", "status_code": "201"})


class ClientArgumentsTest(unittest.TestCase):
    def test_bad_arguments_are_refused_before_sending(self) -> None:
        for url in ["ftp://x", "127.0.0.1:8080", "http://", "http://h/?q=1"]:
            with self.assertRaises(ValueError):
                Client(url, "k")
        with self.assertRaises(ValueError):
            Client("http://127.0.0.1:1", "key\r\nX-Evil: 1")
        c = Client("http://127.0.0.1:1", "k")
        persisted: list[str] = []
        for key in ["", "has space", "line\nbreak", "é-not-ascii"]:
            with self.assertRaises(ValueError):
                c.call("POST", "/v1/payments", {}, key=key, on_key=persisted.append)
        self.assertEqual(persisted, [], "nothing persisted for a key that cannot be sent")
        with self.assertRaises(ValueError):
            c.call("POST", "v1/payments")
        with self.assertRaises(ValueError):
            c.call("POST", "/v1/payments", {"x": float("nan")})
        with self.assertRaises(ValueError):
            c.call("POST", "/v1/payments", {}, headers={"Idempotency-Key": "other-key-1"})


if __name__ == "__main__":
    unittest.main()
