"""The client against a real idemd and provider-sim (the scenarios of tests/integration/client_itest.cc)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

from idem_client import (
    AttemptTimeout,
    Client,
    KeyReused,
    NotFound,
    PayloadTooLarge,
    PaymentDeclined,
    PaymentRequest,
    PaymentResult,
    ProviderUnavailable,
    RetryBudget,
    RetryEvent,
    ProviderTimeout,
    InProgress,
    QuotaExceeded,
    RetryPolicy,
    TransportError,
    Unauthorized,
    UnsupportedMediaType,
    ValidationFailed,
    is_uuid7,
)
from tests.fixture import ALICE, ROOT, IdemdOptions, IdemdTestCase, body


class Recorder:
    """An injected sleep: records each wait and sleeps at most 0.2 s of it for real."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
        time.sleep(min(seconds, 0.2))


def make_client(t: IdemdTestCase, rec: Recorder, *, api_key: str = ALICE, max_attempts: int = 10,
                budget: RetryBudget | None = None, timeout: float = 10.0,
                deadline: float = 30.0, events: list[RetryEvent] | None = None) -> Client:
    return Client(
        t.url, api_key,
        retry=RetryPolicy(max_attempts=max_attempts, initial_backoff=0.02, max_backoff=0.2,
                          deadline=deadline),
        budget=budget if budget is not None else RetryBudget(capacity=100),
        timeout=timeout, sleep=rec, on_retry=None if events is None else events.append,
    )


def stop_child(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()


def order(name: str) -> PaymentRequest:
    return PaymentRequest(name, "100.00", "CNY")


class PaymentsScenarios(IdemdTestCase):
    def test_timeout_then_retry_returns_the_one_payment(self) -> None:
        """scenario timeout: the provider is slow, the attempt times out, the retry with the same key gets the one payment"""
        rec = Recorder()
        events: list[RetryEvent] = []
        c = make_client(self, rec, timeout=0.3, max_attempts=30, events=events)
        self.fault({"fault": "slow", "delay_ms": 900, "times": 1})
        sent: list[str] = []
        r = c.create_payment(order("ORD-P1"), on_key=sent.append)
        self.assertEqual(r.status, 201)
        self.assertEqual(sent, [r.key], "the key was exposed before the first send")
        self.assertTrue(is_uuid7(r.key))
        self.assertGreaterEqual(r.attempts, 2)
        self.assertTrue(r.replayed, "the retry got the first execution's answer")
        self.assertIsInstance(events[0].error, AttemptTimeout)
        self.assertIsNotNone(r.key_expires)
        charges = self.total_charges()
        self.assertEqual(charges, 1)
        self.assertEqual(self.charges_for(r.payment.id), 1)
        self.assertEqual(c.get_payment(r.payment.id), r.payment)
        op = c.get_operation(r.key)
        self.assertEqual((op.state, op.status_code), ("SUCCEEDED", 201))
        self.assertEqual(op.response["id"], r.payment.id)
        # The first attempt alone times out: the error is the timeout, retryable, stopped by attempts.
        self.fault({"fault": "slow", "delay_ms": 900, "times": 1})
        one = make_client(self, rec, timeout=0.3, max_attempts=1)
        with self.assertRaises(AttemptTimeout) as cm:
            one.create_payment(order("ORD-P1b"))
        self.assertEqual((cm.exception.attempts, cm.exception.stopped_by), (1, "attempts"))
        print("\n  timeout: %d attempts, replayed=%s, charges=%d" % (r.attempts, r.replayed, charges),
              file=sys.stderr)

    def test_provider_timeout_504_is_retried_with_the_same_key(self) -> None:
        """scenario 504: idemd's provider call times out (504), the retry with the same key looks the charge up: one charge"""
        rec = Recorder()
        events: list[RetryEvent] = []
        c = make_client(self, rec, max_attempts=60, deadline=30, events=events)
        self.fault({"fault": "slow", "delay_ms": 1500, "times": 1})
        r = c.create_payment(order("ORD-P2"))
        self.assertEqual(r.status, 201)
        self.assertGreaterEqual(r.attempts, 2)
        self.assertIsInstance(events[0].error, ProviderTimeout, "the first attempt answered 504")
        self.assertEqual({e.key for e in events}, {r.key}, "one key throughout")
        # Until the settle window passes, the retries meet the unknown outcome as in progress.
        self.assertTrue(all(isinstance(e.error, InProgress) for e in events[1:]))
        self.assertEqual(self.total_charges(), 1)
        self.assertEqual(self.charges_for(r.payment.id), 1)

    def test_concurrent_duplicate_makes_one_payment(self) -> None:
        """scenario concurrent duplicate: two threads, one key -> one payment, one charge"""
        rec = Recorder()
        c = make_client(self, rec)
        self.fault({"fault": "slow", "delay_ms": 600, "times": 1})
        key = c.new_key()
        results: list[PaymentResult] = []
        errors: list[BaseException] = []
        gate = threading.Barrier(2)

        def pay() -> None:
            gate.wait()
            try:
                results.append(c.create_payment(order("ORD-P3"), key=key))
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        threads = [threading.Thread(target=pay) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(errors, [])
        self.assertEqual(len(results), 2)
        self.assertEqual(results[0].payment, results[1].payment)
        self.assertEqual(results[0].response.body, results[1].response.body, "byte-identical")
        self.assertEqual(sorted(r.replayed for r in results), [False, True])
        self.assertGreaterEqual(max(r.attempts for r in results), 2, "one met the running execution")
        self.assertEqual(self.total_charges(), 1)

    def test_prefer_wait_parks_the_duplicate(self) -> None:
        """scenario Prefer: wait: the duplicate waits on the server and gets the replay in one attempt"""
        rec = Recorder()
        c = make_client(self, rec)
        self.fault({"fault": "slow", "delay_ms": 600, "times": 1})
        key = c.new_key()
        first = threading.Thread(target=lambda: self.pay_raw(key, body("ORD-P4")))
        first.start()
        time.sleep(0.15)
        r = c.create_payment(order("ORD-P4"), key=key, wait=5)
        first.join()
        self.assertEqual((r.status, r.attempts, r.replayed), (201, 1, True))
        self.assertEqual(rec.sleeps, [])
        self.assertEqual(self.total_charges(), 1)

    def test_mismatch_raises_key_reused_and_is_not_retried(self) -> None:
        """scenario mismatch: same key, another body -> KeyReused, one attempt"""
        rec = Recorder()
        c = make_client(self, rec)
        first = c.create_payment(order("ORD-P5"))
        with self.assertRaises(KeyReused) as cm:
            c.create_payment(order("ORD-P5-OTHER"), key=first.key)
        e = cm.exception
        self.assertEqual((e.status, e.type), (422, "urn:idem:problem:idempotency-key-reused"))
        self.assertEqual((e.attempts, e.stopped_by, e.key), (1, None, first.key))
        self.assertIsNotNone(e.key_expires)
        self.assertEqual(rec.sleeps, [])
        self.assertEqual(self.total_charges(), 1)

    def test_final_4xx_are_never_retried(self) -> None:
        """scenario final 4xx: 402, 400, 401, 404, 413, 415 -> one attempt each, no sleep"""
        rec = Recorder()
        c = make_client(self, rec)
        self.fault({"fault": "decline", "times": 1})
        with self.assertRaises(PaymentDeclined) as declined:
            c.create_payment(order("ORD-P6"))
        self.assertEqual((declined.exception.status, declined.exception.attempts), (402, 1))
        # The decline is final: the same key replays it without calling the provider.
        with self.assertRaises(PaymentDeclined) as again:
            c.create_payment(order("ORD-P6"), key=declined.exception.key)
        self.assertTrue(again.exception.replayed)
        with self.assertRaises(ValidationFailed) as invalid:
            c.create_payment(order("bad order!"))
        self.assertEqual((invalid.exception.status, invalid.exception.attempts), (400, 1))
        self.assertIn("merchant_order_no", [f.field for f in invalid.exception.errors])
        with self.assertRaises(Unauthorized) as unauth:
            make_client(self, rec, api_key="not-a-key-at-all").create_payment(order("ORD-P6b"))
        self.assertEqual(unauth.exception.attempts, 1)
        with self.assertRaises(NotFound):
            c.get_payment("pay_000000000000000000000000")
        with self.assertRaises(PayloadTooLarge) as big:
            c.call("POST", "/v1/payments", {"merchant_order_no": "ORD-P6c", "amount": "1.00",
                                            "currency": "CNY", "description": "x" * 70000})
        self.assertEqual(big.exception.attempts, 1)
        with self.assertRaises(UnsupportedMediaType) as media:
            c.call("POST", "/v1/payments", b"merchant_order_no=ORD-P6d", content_type="text/plain")
        self.assertEqual(media.exception.attempts, 1)
        self.assertEqual(rec.sleeps, [])
        self.assertEqual(self.total_charges(), 0)

    def test_following_a_202_gets_the_final_answer(self) -> None:
        """scenario 202: respond-async, the client polls the operation and collects the payment"""
        rec = Recorder()
        c = make_client(self, rec)
        self.fault({"fault": "slow", "delay_ms": 400, "times": 1})
        r = c.create_payment(order("ORD-P7"), respond_async=True)
        self.assertEqual(r.status, 201)
        self.assertEqual(r.payment.merchant_order_no, "ORD-P7")
        self.assertGreaterEqual(r.response.polls, 1, "the operation was polled")
        self.assertEqual(r.attempts, 2, "the 202, then the collecting POST")
        self.assertTrue(r.replayed)
        self.assertEqual(self.total_charges(), 1)

    def test_outage_idemd_stopped_the_budget_stops_retrying(self) -> None:
        """scenario outage (idemd down): retries stop when the shared budget is empty"""
        rec = Recorder()
        budget = RetryBudget(capacity=3, refill_per_success=0.5)
        c = make_client(self, rec, budget=budget, max_attempts=10)
        self.kill_idemd()
        with self.assertRaises(TransportError) as cm:
            c.create_payment(order("ORD-P8"))
        self.assertEqual((cm.exception.attempts, cm.exception.stopped_by), (4, "budget"))
        self.assertEqual(len(rec.sleeps), 3)
        # The budget is shared: the next operation gets no retry at all.
        with self.assertRaises(TransportError) as next_op:
            c.create_payment(order("ORD-P8b"))
        self.assertEqual((next_op.exception.attempts, next_op.exception.stopped_by), (1, "budget"))
        # Without a budget limit, max_attempts is what stops.
        unlimited = make_client(self, rec, max_attempts=3)
        with self.assertRaises(TransportError) as by_attempts:
            unlimited.create_payment(order("ORD-P8c"))
        self.assertEqual((by_attempts.exception.attempts, by_attempts.exception.stopped_by),
                         (3, "attempts"))
        print("\n  outage(idemd down): %d attempts, then %d, stopped by budget"
              % (cm.exception.attempts, next_op.exception.attempts), file=sys.stderr)

    def test_restart_resumes_the_persisted_key(self) -> None:
        """scenario restart: a process persists its key and is killed mid-payment; a new one resumes the same payment"""
        self.start_idemd(IdemdOptions(provider_timeout_ms=4000, lease_ms=6000, settle_ms=6000))
        self.fault({"fault": "slow", "delay_ms": 2500, "times": 1})
        state = os.path.join(self.dir, "ORD-P9.key")
        argv = [sys.executable, os.path.join(ROOT, "examples", "resume.py"), "--url", self.url,
                "--api-key", ALICE, "--state", state, "--order", "ORD-P9", "--amount", "100.00"]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "src"), env.get("PYTHONPATH")) if p)
        with open(os.path.join(self.dir, "child.log"), "wb") as log:
            child = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(stop_child, child)
        deadline = time.monotonic() + 10
        while self.total_charges() < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertEqual(self.total_charges(), 1, "the charge reached the provider")
        self.assertIsNone(child.poll(), "still waiting for its answer")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(5)
        with open(state) as f:
            key = json.load(f)["key"]
        self.assertTrue(is_uuid7(key))
        resumed = subprocess.run(argv, env=env, capture_output=True, timeout=60)
        self.assertEqual(resumed.returncode, 0, resumed.stderr.decode() + resumed.stdout.decode())
        out = json.loads(resumed.stdout.decode().strip().splitlines()[-1])
        self.assertEqual((out["key"], out["resumed"], out["status"], out["replayed"]),
                         (key, True, 201, True))
        self.assertEqual(self.stats()["charges_by_reference"], {out["payment_id"]: 1})
        self.assertFalse(os.path.exists(state), "the finished operation's key is dropped")
        print("\n  restart: key %s resumed after %d attempts, payment %s, charges=1"
              % (key, out["attempts"], out["payment_id"]), file=sys.stderr)

    def test_generic_call_and_reads(self) -> None:
        """generic call(): a raw POST with the caller's key, the replay metadata, reads"""
        rec = Recorder()
        c = make_client(self, rec)
        key = "caller-key-0001"
        first = c.call("POST", "/v1/payments", body("ORD-P10"), key=key)
        again = c.call("POST", "/v1/payments", body("ORD-P10"), key=key)
        self.assertEqual((first.status, first.replayed, again.replayed), (201, False, True))
        self.assertEqual(first.body, again.body)
        self.assertEqual(first.location, again.location)
        self.assertIsNotNone(again.key_expires)
        op = c.get_operation(key)
        self.assertEqual(op.key, key)
        with self.assertRaises(NotFound):
            c.get_operation("never-used-key-1")


class ProviderFailingScenarios(IdemdTestCase):
    idemd_options = IdemdOptions(extra_provider="nothing_charged_statuses = [503]")

    def test_retryable_503_honours_retry_after_with_one_key(self) -> None:
        """scenario 503: the provider fails twice (nothing charged), the client retries after Retry-After with one key"""
        rec = Recorder()
        c = make_client(self, rec)
        self.fault({"fault": "error", "times": 2})
        r = c.create_payment(order("ORD-F1"))
        self.assertEqual((r.status, r.attempts), (201, 3))
        self.assertEqual(len(rec.sleeps), 2)
        for s in rec.sleeps:
            self.assertGreaterEqual(s, 1.0, "Retry-After: 1")
        self.assertEqual(self.total_charges(), 1)
        self.assertEqual(c.get_operation(r.key).state, "SUCCEEDED")

    def test_outage_provider_failing_the_budget_stops_retrying(self) -> None:
        """scenario outage (provider failing): ProviderUnavailable after the budget's retries, nothing charged"""
        rec = Recorder()
        budget = RetryBudget(capacity=2, refill_per_success=1)
        c = make_client(self, rec, budget=budget, max_attempts=10)
        self.fault({"fault": "error", "times": 1000})
        with self.assertRaises(ProviderUnavailable) as cm:
            c.create_payment(order("ORD-F2"))
        e = cm.exception
        self.assertEqual((e.status, e.attempts, e.stopped_by), (503, 3, "budget"))
        self.assertEqual(e.retry_after, 1.0)
        self.assertEqual(self.total_charges(), 0)
        # The provider recovers: the same key executes again, and the success refills the budget.
        self.fault({"fault": "none"})
        r = c.create_payment(order("ORD-F2"), key=e.key)
        self.assertEqual((r.status, r.attempts), (201, 1))
        self.assertEqual(budget.tokens, 1.0)
        self.assertEqual(self.total_charges(), 1)
        print("\n  outage(provider failing): %d attempts, stopped by budget; recovered" % e.attempts,
              file=sys.stderr)


class QuotaScenarios(IdemdTestCase):
    idemd_options = IdemdOptions(extra_idempotency="max_processing = 1")

    def test_429_quota_is_retried_until_the_running_operation_ends(self) -> None:
        """scenario 429: one running operation allowed; a second key gets 429 + Retry-After and is retried"""
        rec = Recorder()
        events: list[RetryEvent] = []
        c = make_client(self, rec, events=events)
        self.fault({"fault": "slow", "delay_ms": 600, "times": 1})
        first = threading.Thread(target=lambda: self.pay_raw("quota-first-key", body("ORD-Q1")))
        first.start()
        time.sleep(0.15)
        r = c.create_payment(order("ORD-Q2"))
        first.join()
        self.assertEqual(r.status, 201)
        self.assertIsInstance(events[0].error, QuotaExceeded)
        self.assertGreaterEqual(events[0].delay, 1.0, "Retry-After honoured")
        self.assertEqual(self.total_charges(), 2)


if __name__ == "__main__":
    unittest.main()
