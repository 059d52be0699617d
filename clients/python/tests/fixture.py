"""Real provider-sim and idemd processes for the integration tests: loopback, port 0, a temp dir and
a fresh SQLite file per test, stopped by PID (also when a test fails)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.request
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # clients/python

ALICE = "dev-acme-alice-7f3c9a1e"
BOB = "dev-acme-bob-2b8d4e6f"
_PRINCIPALS = (
    ("86f71c9cb79152ae8c4aff86cd48dbfc35eee594762141f8f00ece58705547e5", "acme", "alice"),
    ("a89d26c5dbc510aabe658da978bf458885cc3b2bc814256dd016fb3341ed9810", "acme", "bob"),
)
SECRETS = (
    'hmac_current = 1\nseal_current = 1\n[[hmac]]\nid = 1\nkey = "%s"\n[[seal]]\nid = 1\nkey = "%s"\n'
    % ("a" * 64, "b" * 64)
)


def bin_dir() -> str:
    return os.path.abspath(os.environ.get("IDEM_BIN") or os.path.join(ROOT, "..", "..", "build", "ci"))


def binary(rel: str) -> str:
    path = os.path.join(bin_dir(), rel)
    if not os.access(path, os.X_OK):
        raise RuntimeError("missing binary %s (set IDEM_BIN to the build directory)" % path)
    return path


@dataclass
class IdemdOptions:
    lease_ms: int = 3000
    provider_timeout_ms: int = 1000
    lease_margin_ms: int = 500
    settle_ms: int = 0
    extra_provider: str = ""
    extra_idempotency: str = ""
    extra_server: str = ""
    keep_config: bool = False
    env: dict[str, str] = field(default_factory=dict)


class Proc:
    """A child process whose output goes to a file; stopped by its PID."""

    def __init__(self, argv: list[str], cwd: str, log: str, env: dict[str, str] | None = None) -> None:
        self.log = log
        full_env = dict(os.environ)
        full_env.update(env or {})
        self._out = open(log, "ab")
        self.popen = subprocess.Popen(argv, cwd=cwd, stdout=self._out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=full_env)
        self.pid = self.popen.pid

    def wait_for_line(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while time.monotonic() < deadline:
            with open(self.log, "r", errors="replace") as f:
                m = rx.search(f.read())
            if m:
                return m
            if self.popen.poll() is not None:
                break
            time.sleep(0.02)
        with open(self.log, "r", errors="replace") as f:
            tail = f.read()[-2000:]
        raise RuntimeError("pid %d never printed %r; its output:\n%s" % (self.pid, pattern, tail))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 5.0) -> None:
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, sig)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout)
            except ProcessLookupError:
                pass
        self._out.close()


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
         timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """A plain loopback call for the tests' own checks (not the client under test)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


class IdemdTestCase(unittest.TestCase):
    """Starts provider-sim and idemd for each test; ``self.url`` is idemd's base URL."""

    idemd_options = IdemdOptions()

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="idem-py-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.provider = Proc([binary("tools/provider-sim"), "--listen", "127.0.0.1:0"], self.dir,
                             os.path.join(self.dir, "provider.log"))
        self.addCleanup(self.provider.stop)
        self.provider_url = self.provider.wait_for_line(r"provider-sim listening on (http://\S+)").group(1)
        self.idemd: Proc | None = None
        self.start_idemd(self.idemd_options)

    def start_idemd(self, options: IdemdOptions) -> None:
        if self.idemd is not None:
            self.idemd.stop()
        config = os.path.join(self.dir, "idemd.toml")
        if not options.keep_config:
            self.write_config(config, options)
        env = dict(options.env)
        env["IDEM_SECRETS"] = SECRETS
        log = os.path.join(self.dir, "idemd.log")
        # A restart appends to the log: look only at what this process prints.
        start = os.path.getsize(log) if os.path.exists(log) else 0
        proc = Proc([binary("server/idemd"), "--config", config], self.dir, log, env)
        self.idemd = proc
        self.addCleanup(proc.stop)
        deadline = time.monotonic() + 10
        while True:
            with open(log, "r", errors="replace") as f:
                f.seek(start)
                m = re.search(r"idemd listening on (http://\S+)", f.read())
            if m:
                self.url = m.group(1)
                return
            if proc.popen.poll() is not None or time.monotonic() > deadline:
                with open(log, "r", errors="replace") as f:
                    raise RuntimeError("idemd did not start:\n" + f.read()[-3000:])
            time.sleep(0.02)

    def kill_idemd(self) -> None:
        assert self.idemd is not None
        self.idemd.stop(signal.SIGKILL)
        self.idemd = None

    def write_config(self, path: str, o: IdemdOptions) -> None:
        settle = o.settle_ms if o.settle_ms > 0 else o.provider_timeout_ms + 1000
        lines = [
            "[server]", 'listen = "127.0.0.1:0"', "read_timeout_ms = 2000", "drain_timeout_ms = 5000",
            o.extra_server,
            "[store]", 'url = "sqlite://%s"' % os.path.join(self.dir, "idem.db"),
            "[provider]", 'url = "%s"' % self.provider_url, "timeout_ms = %d" % o.provider_timeout_ms,
            "settle_ms = %d" % settle, o.extra_provider,
            "[idempotency]", "lease_ms = %d" % o.lease_ms, "lease_margin_ms = %d" % o.lease_margin_ms,
            "reconcile_interval_ms = 600000", o.extra_idempotency,
        ]
        for sha, tenant, user in _PRINCIPALS:
            lines += ["[[principals]]", 'api_key_sha256 = "%s"' % sha, 'tenant = "%s"' % tenant,
                      'user = "%s"' % user]
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")

    # provider-sim admin calls
    def fault(self, spec: dict[str, Any]) -> None:
        status, _, body = http("POST", self.provider_url + "/admin/faults", spec)
        self.assertEqual(status, 200, body)

    def stats(self) -> dict[str, Any]:
        status, _, body = http("GET", self.provider_url + "/admin/stats")
        self.assertEqual(status, 200, body)
        doc = json.loads(body)
        assert isinstance(doc, dict)
        return doc

    def total_charges(self) -> int:
        return int(self.stats()["total"])

    def charges_for(self, reference: str) -> int:
        return int(self.stats().get("charges_by_reference", {}).get(reference, 0))

    def pay_raw(self, key: str, body: dict[str, Any], api_key: str = ALICE,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        h = {"Authorization": "Bearer " + api_key, "Idempotency-Key": key}
        h.update(headers or {})
        return http("POST", self.url + "/v1/payments", body, h)


def body(order: str, amount: str = "100.00", currency: str = "CNY") -> dict[str, Any]:
    return {"merchant_order_no": order, "amount": amount, "currency": currency}
