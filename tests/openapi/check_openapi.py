#!/usr/bin/python3
"""Holds a running idemd to docs/openapi.yaml, so the description cannot drift from the server.

Starts provider-sim and idemd (port 0, a temporary directory), drives every documented operation
through its documented outcomes, and checks each response against the description: the status
is documented for that path and method, required headers are present and match their schemas,
the media type is documented, and the body validates against the JSON Schema. Finally every
documented status must have been produced at least once (except the few that need a broken
machine to appear). Exit 0 when everything conforms.

usage: check_openapi.py --spec docs/openapi.yaml --idemd PATH --provider-sim PATH
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import yaml
from jsonschema import Draft202012Validator, RefResolver

# Statuses that only a failing machine produces; documented, not provoked here.
NOT_PROVOKED = {("/v1/payments", "post", "500"), ("/readyz", "get", "503")}

ALICE, BOB, CAROL = "dev-acme-alice-7f3c9a1e", "dev-acme-bob-2b8d4e6f", "dev-globex-carol-9e1a5c3d"
PRINCIPALS = """
[[principals]]
api_key_sha256 = "86f71c9cb79152ae8c4aff86cd48dbfc35eee594762141f8f00ece58705547e5"
tenant = "acme"
user = "alice"
[[principals]]
api_key_sha256 = "a89d26c5dbc510aabe658da978bf458885cc3b2bc814256dd016fb3341ed9810"
tenant = "acme"
user = "bob"
[[principals]]
api_key_sha256 = "5b2419a10bd09a42bc7aef709d8c7071a0ccbeae04e6e386f76468c91ff5f484"
tenant = "globex"
user = "carol"
"""
SECRETS = ('hmac_current = 1\nseal_current = 1\n[[hmac]]\nid = 1\nkey = "' + "c" * 64 +
           '"\n[[seal]]\nid = 1\nkey = "' + "d" * 64 + '"\n')


class Checker:
    def __init__(self, spec):
        self.spec = spec
        self.resolver = RefResolver.from_schema(spec)
        self.failures = []
        self.seen = set()
        self.templates = []
        for path in spec["paths"]:
            pattern = "^" + re.sub(r"\{[^/]+\}", "[^/]+", path) + "$"
            self.templates.append((re.compile(pattern), path))

    def resolve(self, node):
        while isinstance(node, dict) and "$ref" in node:
            node = self.resolver.resolve(node["$ref"])[1]
        return node

    def template_of(self, target):
        path = target.split("?")[0]
        for pattern, template in self.templates:
            if pattern.match(path):
                return template
        return None

    def fail(self, what):
        self.failures.append(what)
        print("FAIL:", what)

    def check(self, method, target, status, headers, body):
        template = self.template_of(target)
        where = f"{method} {target} -> {status}"
        if template is None:
            self.fail(f"{where}: path not in the description")
            return
        operation = self.spec["paths"][template].get(method.lower())
        if operation is None:
            # Undocumented methods of a documented path: the shared 405 response.
            if status != 405:
                self.fail(f"{where}: method not in the description and not 405")
                return
            self.seen.add((template, method.lower(), "405"))
            operation = {"responses": {"405": {"$ref": "#/components/responses/MethodNotAllowed"}}}
        responses = operation["responses"]
        if str(status) not in responses:
            self.fail(f"{where}: status {status} not documented (documented: {sorted(responses)})")
            return
        self.seen.add((template, method.lower(), str(status)))
        response = self.resolve(responses[str(status)])
        for name, header in (response.get("headers") or {}).items():
            header = self.resolve(header)
            value = headers.get(name.lower())
            if value is None:
                if header.get("required"):
                    self.fail(f"{where}: required header {name} missing")
                continue
            errors = list(Draft202012Validator(header.get("schema", {}),
                                               resolver=self.resolver).iter_errors(value))
            if errors:
                self.fail(f"{where}: header {name}={value!r}: {errors[0].message}")
        content = response.get("content")
        if not content:
            return
        media = (headers.get("content-type") or "").split(";")[0].strip()
        if media not in content:
            self.fail(f"{where}: content type {media!r} not documented ({sorted(content)})")
            return
        schema = content[media].get("schema", {})
        if media.endswith("json"):
            try:
                document = json.loads(body)
            except ValueError as e:
                self.fail(f"{where}: body is not JSON: {e}")
                return
            errors = list(Draft202012Validator(schema, resolver=self.resolver).iter_errors(document))
            if errors:
                self.fail(f"{where}: body {body[:200]!r}: {errors[0].message}")


def call(port, method, target, headers=None, body=None, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body.encode() if isinstance(body, str) else body
    conn.request(method, target, body=data, headers=headers or {})
    response = conn.getresponse()
    payload = response.read().decode("utf-8", "replace")
    result = (response.status, {k.lower(): v for k, v in response.getheaders()}, payload)
    conn.close()
    return result


def start(argv, env, cwd, prefix):
    log = open(os.path.join(cwd, os.path.basename(argv[0]) + ".log"), "ab")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env, cwd=cwd)
    deadline = time.time() + 20
    while time.time() < deadline:
        line = proc.stdout.readline().decode()
        if line.startswith(prefix):
            return proc, int(line.strip().rsplit(":", 1)[1])
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"{argv[0]} did not start")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--idemd", required=True)
    parser.add_argument("--provider-sim", required=True)
    args = parser.parse_args()
    args.idemd = os.path.abspath(args.idemd)
    args.provider_sim = os.path.abspath(args.provider_sim)
    with open(args.spec) as f:
        spec = yaml.safe_load(f)
    Draft202012Validator.check_schema({"$defs": spec["components"]["schemas"]})
    checker = Checker(spec)

    workdir = tempfile.mkdtemp(prefix="idem-openapi-")
    processes = []
    try:
        provider, provider_port = start([args.provider_sim, "--listen", "127.0.0.1:0"],
                                        dict(os.environ), workdir, "provider-sim listening on ")
        processes.append(provider)
        config = os.path.join(workdir, "idemd.toml")
        with open(config, "w") as f:
            f.write(f'[server]\nlisten = "127.0.0.1:0"\nmax_body_bytes = 65536\n'
                    f'[store]\nurl = "sqlite://{workdir}/idem.db"\n'
                    f'[provider]\nurl = "http://127.0.0.1:{provider_port}"\ntimeout_ms = 1000\n'
                    f'[idempotency]\nlease_ms = 4000\nmax_retained = 5\n' + PRINCIPALS)
        env = dict(os.environ, IDEM_SECRETS=SECRETS)
        idemd, port = start([args.idemd, "--config", config], env, workdir, "idemd listening on ")
        processes.append(idemd)

        def admin(path, payload):
            status, _, body = call(provider_port, "POST", path,
                                   {"Content-Type": "application/json"}, json.dumps(payload))
            assert status == 200, body

        def request(method, target, key=None, body=None, api_key=ALICE, extra=None):
            headers = {}
            if api_key:
                headers["Authorization"] = "Bearer " + api_key
            if body is not None:
                headers["Content-Type"] = "application/json"
            if key:
                headers["Idempotency-Key"] = key
            headers.update(extra or {})
            status, response_headers, payload = call(port, method, target, headers, body)
            checker.check(method, target, status, response_headers, payload)
            return status, response_headers, payload

        def pay_body(order, amount='"100.00"', currency="CNY"):
            return f'{{"merchant_order_no":"{order}","amount":{amount},"currency":"{currency}"}}'

        def expect(got, want, what):
            if got[0] != want:
                checker.fail(f"{what}: expected {want}, got {got[0]}: {got[2][:200]}")
            return got

        # POST /v1/payments, every documented outcome.
        first = expect(request("POST", "/v1/payments", "oa-key-0001", pay_body("OA-1")), 201, "first")
        expect(request("POST", "/v1/payments", "oa-key-0001", pay_body("OA-1")), 201, "replay")
        expect(request("POST", "/v1/payments", "oa-key-0001", pay_body("OA-1", '"2"')), 422, "mismatch")
        expect(request("POST", "/v1/payments", "oa-key-0002", pay_body("OA-1", "100")), 200, "existing order")
        expect(request("POST", "/v1/payments", "oa-key-0003", pay_body("OA-1", '"5.00"')), 409, "order conflict")
        expect(request("POST", "/v1/payments", None, pay_body("OA-2")), 400, "missing key")
        expect(request("POST", "/v1/payments", "oa-key-0004", '{"merchant_order_no":'), 400, "bad json")
        expect(request("POST", "/v1/payments", "oa-key-0004", pay_body("bad order!")), 400, "validation")
        expect(request("POST", "/v1/payments", "oa-key-0004", pay_body("OA-2"),
                       extra={"Content-Type": "text/plain"}), 415, "media type")
        expect(request("POST", "/v1/payments", "oa-key-0004", " " * (64 * 1024 + 1)), 413, "too large")
        expect(request("POST", "/v1/payments", "oa-key-0004", pay_body("OA-2"), api_key="nope"), 401, "auth")
        expect(request("POST", "/v1/payments", "oa-key-0004", pay_body("OA-2"),
                       extra={"X-Filler": "x" * 20000}), 431, "headers too large")
        expect(request("GET", "/v1/payments", api_key=ALICE), 405, "method")
        admin("/admin/faults", {"fault": "decline", "times": 1})
        expect(request("POST", "/v1/payments", "oa-key-0005", pay_body("OA-5"), api_key=CAROL), 402, "decline")
        admin("/admin/faults", {"fault": "error", "times": 1})
        expect(request("POST", "/v1/payments", "oa-key-0006", pay_body("OA-6"), api_key=CAROL), 503, "5xx")
        admin("/admin/faults", {"fault": "long_id", "times": 1})
        expect(request("POST", "/v1/payments", "oa-key-0009", pay_body("OA-9"), api_key=CAROL), 502,
               "answer too large to keep")
        admin("/admin/faults", {"fault": "succeed_then_timeout", "delay_ms": 2000, "times": 1})
        expect(request("POST", "/v1/payments", "oa-key-0007", pay_body("OA-7"), api_key=CAROL), 504, "timeout")
        admin("/admin/faults", {"fault": "slow", "delay_ms": 700, "times": 1})
        runner = threading.Thread(target=lambda: request("POST", "/v1/payments", "oa-key-0008",
                                                         pay_body("OA-8"), api_key=CAROL))
        runner.start()
        time.sleep(0.25)
        expect(request("POST", "/v1/payments", "oa-key-0008", pay_body("OA-8"), api_key=CAROL), 409, "running")
        expect(request("POST", "/v1/payments", "oa-key-0008", pay_body("OA-8"), api_key=CAROL,
                       extra={"Prefer": "respond-async"}), 202, "respond-async")
        runner.join()
        for i in range(10):  # bob's retained keys run out (max_retained = 5)
            got = request("POST", "/v1/payments", f"oa-quota-{i:04d}", pay_body(f"OA-Q{i}"), api_key=BOB)
            if got[0] == 429:
                break
        expect(got, 429, "quota")

        # Reads.
        payment_id = json.loads(first[2])["id"]
        expect(request("GET", f"/v1/payments/{payment_id}"), 200, "payment")
        expect(request("GET", f"/v1/payments/{payment_id}", api_key=CAROL), 404, "other tenant")
        expect(request("GET", f"/v1/payments/{payment_id}", api_key=None), 401, "payment auth")
        expect(request("POST", f"/v1/payments/{payment_id}", body="{}"), 405, "payment method")
        events = f"/v1/payments/{payment_id}/events"
        expect(request("GET", events), 200, "events")
        expect(request("GET", events, api_key=CAROL), 404, "other tenant's events")
        expect(request("GET", events, api_key=None), 401, "events auth")
        expect(request("POST", events + "/replay"), 202, "replay")
        expect(request("POST", events + "/replay", api_key=CAROL), 404, "other tenant's replay")
        expect(request("POST", events + "/replay", api_key=None), 401, "replay auth")
        expect(request("GET", "/v1/operations/oa-key-0001"), 200, "operation")
        expect(request("GET", "/v1/operations/oa-key-0008", api_key=CAROL), 200, "running operation")
        expect(request("GET", "/v1/operations/oa-key-0001", api_key=BOB), 404, "other principal")
        expect(request("GET", "/v1/operations/bad%20key"), 400, "malformed key")
        expect(request("GET", "/v1/operations/oa-key-0001", api_key=None), 401, "operation auth")
        expect(request("DELETE", "/v1/operations/oa-key-0001"), 405, "operation method")
        expect(request("GET", "/healthz", api_key=None), 200, "health")
        expect(request("GET", "/readyz", api_key=None), 200, "ready")
        expect(request("GET", "/metrics", api_key=None), 200, "metrics")

        documented = {(path, method, status)
                      for path, item in spec["paths"].items()
                      for method, operation in item.items()
                      for status in operation["responses"]}
        for missing in sorted(documented - checker.seen - NOT_PROVOKED):
            checker.fail(f"documented but never produced: {missing}")
    finally:
        for proc in processes:
            proc.send_signal(signal.SIGTERM)
        for proc in processes:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)

    checks = len(checker.seen)
    print(f"{checks} documented responses produced, {len(checker.failures)} failures")
    return 1 if checker.failures else 0


if __name__ == "__main__":
    sys.exit(main())
