"""Retry-logic edge cases against a tiny scripted http.server on loopback (never in place of idemd for
the scenarios: those are in test_integration.py)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import unittest
from typing import Any, Callable

from idem_client import (
    Client,
    InProgress,
    Internal,
    KeyReused,
    NotFound,
    OrderConflict,
    PayloadTooLarge,
    ProblemError,
    QuotaExceeded,
    ResponseError,
    ResponseTooLarge,
    RetryBudget,
    RetryPolicy,
    TransportError,
    Unauthorized,
    UnsupportedMediaType,
    UpstreamFailed,
    UpstreamUnavailable,
    ValidationFailed,
)

Reply = tuple[int, dict[str, str], bytes] | str  # or "close": drop the connection without answering


def problem(kind: str, status: int, **extra: Any) -> bytes:
    doc = {"type": "urn:idem:problem:" + kind, "title": "t", "status": status, "detail": "d"}
    doc.update(extra)
    return json.dumps(doc).encode()


class Scripted:
    """A loopback HTTP server answering each request with the next scripted reply (the last one
    repeats) and recording what it received."""

    def __init__(self, replies: list[Reply] | Callable[[str, str], Reply]) -> None:
        self.replies = replies
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(n) if n else b""
                owner.requests.append((self.command, self.path,
                                       {k.lower(): v for k, v in self.headers.items()}, data))
                reply = owner.next(self.command, self.path)
                if reply == "close":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                assert not isinstance(reply, str)
                status, headers, body = reply
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = handle_one

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def next(self, method: str, path: str) -> Reply:
        if callable(self.replies):
            return self.replies(method, path)
        i = min(len(self.requests) - 1, len(self.replies) - 1)
        return self.replies[i]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


OK_PAYMENT = (201, {"Content-Type": "application/json", "Location": "/v1/payments/pay_1"},
              b'{"id":"pay_1","merchant_order_no":"ORD-1","amount":"1.00","currency":"CNY",'
              b'"status":"succeeded","provider_charge_id":"ch_1","created_at":"2026-01-01T00:00:00.000Z"}')
PJ = {"Content-Type": "application/problem+json"}


class LocalRetryTest(unittest.TestCase):
    def serve(self, replies: list[Reply] | Callable[[str, str], Reply]) -> Scripted:
        s = Scripted(replies)
        self.addCleanup(s.stop)
        return s

    def client(self, s: Scripted, *, max_attempts: int = 10, budget: RetryBudget | None = None,
               deadline: float = 60.0, timeout: float = 5.0, max_response_bytes: int = 1 << 20,
               clock: Callable[[], float] | None = None) -> Client:
        self.sleeps: list[float] = []
        self.now = 0.0

        def sleep(d: float) -> None:
            self.sleeps.append(d)
            self.now += d  # fake time: no real waiting

        return Client(s.url, "secret-key", retry=RetryPolicy(max_attempts=max_attempts, deadline=deadline),
                      budget=budget or RetryBudget(capacity=1000), timeout=timeout,
                      max_response_bytes=max_response_bytes, sleep=sleep,
                      clock=clock or (lambda: self.now), random=lambda: 0.5)

    def posts(self, s: Scripted) -> list[tuple[str, str, dict[str, str], bytes]]:
        return [r for r in s.requests if r[0] == "POST"]

    def test_the_same_bytes_and_key_on_every_attempt(self) -> None:
        s = self.serve([(503, {"Retry-After": "2", **PJ}, problem("provider-unavailable", 503)),
                        "close",
                        (409, {"Retry-After": "1", **PJ}, problem("request-in-progress", 409)),
                        (429, {"Retry-After": "3", **PJ}, problem("quota-exceeded", 429)),
                        (504, PJ, problem("provider-timeout", 504)),
                        OK_PAYMENT])
        c = self.client(s)
        from idem_client import PaymentRequest
        r = c.create_payment(PaymentRequest("ORD-1", "1.00", "CNY", metadata={"b": "2", "a": "1"}))
        self.assertEqual((r.status, r.attempts, r.payment.id), (201, 6, "pay_1"))
        bodies = {req[3] for req in s.requests}
        keys = {req[2]["idempotency-key"] for req in s.requests}
        self.assertEqual(len(bodies), 1, "byte-identical bodies")
        self.assertEqual(keys, {r.key})
        self.assertTrue(all(req[2]["authorization"] == "Bearer secret-key" for req in s.requests))
        self.assertTrue(all(req[2]["content-type"] == "application/json" for req in s.requests))
        # Retry-After honoured (2, -, 1, 3); the others are full jitter: 0.5 * min(5, 0.1 * 2^n).
        self.assertEqual(self.sleeps, [2.0, 0.1, 1.0, 3.0, 0.8])

    def test_final_answers_are_not_retried(self) -> None:
        cases: list[tuple[int, str, type[ProblemError]]] = [
            (400, "validation-failed", ValidationFailed), (401, "unauthorized", Unauthorized),
            (404, "not-found", NotFound), (413, "payload-too-large", PayloadTooLarge),
            (415, "unsupported-media-type", UnsupportedMediaType),
            (422, "idempotency-key-reused", KeyReused), (409, "order-conflict", OrderConflict),
            (500, "internal", Internal), (502, "upstream-failed", UpstreamFailed),
        ]
        for status, kind, cls in cases:
            with self.subTest(status=status):
                s = self.serve([(status, PJ, problem(kind, status)), OK_PAYMENT])
                c = self.client(s)
                with self.assertRaises(cls) as cm:
                    c.call("POST", "/v1/payments", {"a": 1})
                self.assertEqual((cm.exception.status, cm.exception.attempts, cm.exception.stopped_by),
                                 (status, 1, None))
                self.assertEqual(len(s.requests), 1)
                self.assertEqual(self.sleeps, [])

    def test_a_409_with_retry_after_is_retried_even_without_a_problem_body(self) -> None:
        s = self.serve([(409, {"Retry-After": "1"}, b"busy"), OK_PAYMENT])
        r = self.client(s).call("POST", "/v1/payments", b"{}")
        self.assertEqual((r.status, r.attempts), (201, 2))

    def test_502_is_retried_only_with_retry_after(self) -> None:
        s = self.serve([(502, {"Retry-After": "1", **PJ}, problem("upstream-unavailable", 502)), OK_PAYMENT])
        self.assertEqual(self.client(s).call("POST", "/orders", b"{}").attempts, 2)
        s2 = self.serve([(502, {}, b"<html>bad gateway</html>"), OK_PAYMENT])
        with self.assertRaises(ProblemError) as cm:
            self.client(s2).call("POST", "/orders", b"{}")
        self.assertEqual((cm.exception.status, cm.exception.type), (502, "about:blank"))
        self.assertNotIsInstance(cm.exception, UpstreamUnavailable)

    def test_max_attempts_stops_with_the_last_error(self) -> None:
        s = self.serve([(503, {"Retry-After": "1", **PJ}, problem("provider-unavailable", 503)),
                        (429, {"Retry-After": "1", **PJ}, problem("quota-exceeded", 429))])
        with self.assertRaises(QuotaExceeded) as cm:
            self.client(s, max_attempts=4).call("POST", "/v1/payments", b"{}")
        self.assertEqual((cm.exception.attempts, cm.exception.stopped_by), (4, "attempts"))
        self.assertEqual(len(self.sleeps), 3)

    def test_the_deadline_stops_before_sleeping_past_it(self) -> None:
        s = self.serve([(409, {"Retry-After": "4", **PJ}, problem("request-in-progress", 409))])
        with self.assertRaises(InProgress) as cm:
            self.client(s, deadline=10).call("POST", "/v1/payments", b"{}")
        self.assertEqual(cm.exception.stopped_by, "deadline")
        self.assertEqual(self.sleeps, [4.0, 4.0], "a third wait would end past 10 s")
        self.assertEqual(cm.exception.attempts, 3)

    def test_a_retry_after_beyond_the_deadline_is_not_waited_for(self) -> None:
        s = self.serve([(503, {"Retry-After": "120", **PJ}, problem("unavailable", 503))])
        with self.assertRaises(ProblemError) as cm:
            self.client(s, deadline=30).call("POST", "/v1/payments", b"{}")
        self.assertEqual((cm.exception.attempts, cm.exception.stopped_by), (1, "deadline"))
        self.assertEqual(self.sleeps, [])

    def test_the_shared_budget_stops_retries_across_operations(self) -> None:
        s = self.serve([(503, {"Retry-After": "1", **PJ}, problem("unavailable", 503))])
        budget = RetryBudget(capacity=5, refill_per_success=1)
        c = self.client(s, budget=budget)
        with self.assertRaises(ProblemError) as first:
            c.call("POST", "/v1/payments", b"{}")
        self.assertEqual((first.exception.attempts, first.exception.stopped_by), (6, "budget"))
        with self.assertRaises(ProblemError) as second:
            c.call("POST", "/v1/payments", b"{}")
        self.assertEqual(second.exception.attempts, 1)
        # A success refills: one more retry is allowed afterwards.
        s.replies = [OK_PAYMENT]
        c.call("POST", "/v1/payments", b"{}")
        self.assertEqual(budget.tokens, 1.0)

    def test_following_a_202(self) -> None:
        state = {"polls": 0}

        def reply(method: str, path: str) -> Reply:
            if method == "POST":
                posts = sum(1 for r in s.requests if r[0] == "POST")
                if posts == 1:
                    return (202, {"Location": "/v1/operations/k-202-000001", "Retry-After": "1"}, b"")
                return OK_PAYMENT
            state["polls"] += 1
            st = "PROCESSING" if state["polls"] < 3 else "SUCCEEDED"
            return (200, {"Content-Type": "application/json"},
                    json.dumps({"key": "k-202-000001", "state": st}).encode())

        s = self.serve(reply)
        r = self.client(s).call("POST", "/v1/payments", b"{}", key="k-202-000001", respond_async=True,
                                wait=3)
        self.assertEqual((r.status, r.attempts, r.polls), (201, 2, 3))
        posts = self.posts(s)
        self.assertEqual(posts[0][2]["prefer"], "respond-async, wait=3")
        self.assertEqual(posts[1][2]["prefer"], "wait=3", "the collecting POST drops respond-async")
        gets = [req for req in s.requests if req[0] == "GET"]
        self.assertEqual({g[1] for g in gets}, {"/v1/operations/k-202-000001"})
        self.assertTrue(all("idempotency-key" not in g[2] for g in gets))
        self.assertGreaterEqual(self.sleeps[0], 1.0, "the first poll honours the 202's Retry-After")

    def test_a_foreign_location_is_never_followed(self) -> None:
        def reply(method: str, path: str) -> Reply:
            if method == "POST" and len(self.posts(s)) == 1:
                return (202, {"Location": "http://evil.example/steal"}, b"")
            if method == "GET":
                return (200, {"Content-Type": "application/json"}, b'{"key":"x","state":"SUCCEEDED"}')
            return OK_PAYMENT

        s = self.serve(reply)
        r = self.client(s).call("POST", "/v1/payments", b"{}", key="key/with/slash", respond_async=True)
        self.assertEqual(r.status, 201)
        self.assertEqual([req[1] for req in s.requests if req[0] == "GET"],
                         ["/v1/operations/key%2Fwith%2Fslash"])

    def test_redirects_are_not_followed(self) -> None:
        s = self.serve([(307, {"Location": "http://127.0.0.1:1/elsewhere"}, b"")])
        r = self.client(s).call("POST", "/v1/payments", b"{}")
        self.assertEqual((r.status, r.location, len(s.requests)), (307, "http://127.0.0.1:1/elsewhere", 1))

    def test_a_huge_body_is_capped(self) -> None:
        s = self.serve([(201, {"Content-Type": "application/json"}, b"x" * 100_000)])
        with self.assertRaises(ResponseTooLarge) as cm:
            self.client(s, max_response_bytes=10_000).call("POST", "/v1/payments", b"{}")
        self.assertEqual((cm.exception.status, cm.exception.attempts), (201, 1))
        self.assertLessEqual(len(cm.exception.body), 10_000)
        # A huge retryable error body is not parsed, but its status is retried.
        s2 = self.serve([(503, {"Retry-After": "1", **PJ}, b"{" * 100_000), OK_PAYMENT])
        self.assertEqual(self.client(s2, max_response_bytes=1000).call("POST", "/p", b"{}").attempts, 2)

    def test_malformed_answers_give_documented_errors(self) -> None:
        from idem_client import PaymentRequest
        for body in [b"", b"not json", b"[]", b'{"id": 5}', b"\xff"]:
            with self.subTest(body=body):
                s = self.serve([(201, {"Content-Type": "application/json"}, body)])
                with self.assertRaises(ResponseError):
                    self.client(s).create_payment(PaymentRequest("ORD-1", "1", "CNY"))
        s = self.serve([(400, PJ, b'{"type": ["x"], "errors": 7}')])
        with self.assertRaises(ProblemError) as cm:
            self.client(s).call("POST", "/p", b"{}")
        self.assertEqual((cm.exception.status, cm.exception.type), (400, "about:blank"))

    def test_a_short_body_is_a_transport_error_and_retried(self) -> None:
        s = self.serve([(201, {"Content-Length": "500"}, b"truncated"), OK_PAYMENT])
        r = self.client(s).call("POST", "/v1/payments", b"{}")
        self.assertEqual(r.attempts, 2)

    def test_nothing_listening_is_a_transport_error(self) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()  # nothing listens there now
        c = Client("http://127.0.0.1:%d" % port, "k", retry=RetryPolicy(max_attempts=3),
                   budget=RetryBudget(), sleep=lambda d: None)
        with self.assertRaises(TransportError) as cm:
            c.call("POST", "/v1/payments", b"{}")
        self.assertEqual((cm.exception.attempts, cm.exception.stopped_by), (3, "attempts"))
        self.assertIsNotNone(cm.exception.cause)

    def test_safe_methods_carry_no_key(self) -> None:
        s = self.serve([(503, {"Retry-After": "1"}, b""), (200, {"Content-Type": "application/json"}, b"{}")])
        r = self.client(s).call("GET", "/v1/payments/pay_1")
        self.assertEqual((r.status, r.key, r.attempts), (200, "", 2))
        self.assertTrue(all("idempotency-key" not in req[2] for req in s.requests))

    def test_on_key_runs_before_the_first_send_and_can_stop_it(self) -> None:
        s = self.serve([OK_PAYMENT])
        c = self.client(s)
        seen: list[tuple[str, int]] = []
        r = c.call("POST", "/v1/payments", b"{}", on_key=lambda k: seen.append((k, len(s.requests))))
        self.assertEqual(seen, [(r.key, 0)])

        def refuse(k: str) -> None:
            raise OSError("disk full")

        with self.assertRaises(OSError):
            c.call("POST", "/v1/payments", b"{}", on_key=refuse)
        self.assertEqual(len(s.requests), 1, "nothing sent when the key could not be persisted")


if __name__ == "__main__":
    unittest.main()
