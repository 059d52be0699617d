"""Pay once, even across a crash: the operation key is persisted before the first send, and a restarted
process resumes the same operation with it.

    python3 examples/resume.py --url http://127.0.0.1:8080 --api-key KEY \\
        --state /var/lib/shop/ORD-1001.key --order ORD-1001 --amount 100.00 --currency CNY

The first run writes a new key to --state (atomically, fsynced) before anything is sent. If the process
dies before it learns the outcome, running the same command again reads the key back and sends the same
request under it: idemd answers with the first execution's result (``Idempotent-Replayed: true``) or
waits for it, and the provider is charged once. The state file is removed once the outcome is final.
Prints one JSON line with the outcome; exit status 0 on a payment, 1 on an error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from idem_client import Client, IdemError, PaymentRequest, ProblemError, RetryPolicy


def load_key(path: str) -> str | None:
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None
    key = doc.get("key") if isinstance(doc, dict) else None
    if not isinstance(key, str):
        raise SystemExit("%s holds no key" % path)
    return key


def save_key(path: str, key: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"key": key}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--api-key", required=True)
    p.add_argument("--state", required=True, help="file that keeps the operation key")
    p.add_argument("--order", required=True)
    p.add_argument("--amount", required=True)
    p.add_argument("--currency", default="CNY")
    p.add_argument("--deadline", type=float, default=60.0)
    args = p.parse_args()

    client = Client(args.url, args.api_key, retry=RetryPolicy(max_attempts=50, deadline=args.deadline))
    key = load_key(args.state)  # None: a new operation; else resume the persisted one
    resumed = key is not None
    try:
        result = client.create_payment(
            PaymentRequest(args.order, args.amount, args.currency),
            key=key,
            on_key=None if resumed else (lambda k: save_key(args.state, k)),
        )
    except ProblemError as e:
        if e.stopped_by is None:  # final: this key will always answer so
            os.remove(args.state)
        print(json.dumps({"key": e.key, "resumed": resumed, "error": e.type, "status": e.status,
                          "stopped_by": e.stopped_by}))
        return 1
    except IdemError as e:  # no answer: keep the key and run again later
        print(json.dumps({"key": e.key, "resumed": resumed, "error": type(e).__name__,
                          "detail": str(e)}))
        return 1
    os.remove(args.state)
    print(json.dumps({"key": result.key, "resumed": resumed, "status": result.status,
                      "payment_id": result.payment.id, "replayed": result.replayed,
                      "attempts": result.attempts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
