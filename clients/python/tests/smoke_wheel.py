"""Run by the interpreter of a venv the wheel was installed into: the installed package (not the source
tree) pays once against a real idemd and provider-sim, retrying a provider failure with one key."""

from __future__ import annotations

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for tests.fixture

import idem_client  # noqa: E402
from idem_client import Client, PaymentRequest, RetryBudget, RetryPolicy  # noqa: E402
from tests.fixture import ALICE, IdemdOptions, IdemdTestCase  # noqa: E402


class WheelSmoke(IdemdTestCase):
    idemd_options = IdemdOptions(extra_provider="nothing_charged_statuses = [503]")

    def test_installed_wheel_pays_once(self) -> None:
        """wheel smoke: the installed package retries a 503 and pays once"""
        self.assertTrue(idem_client.__file__.startswith(sys.prefix), idem_client.__file__)
        self.assertNotEqual(sys.prefix, sys.base_prefix, "runs inside a venv")
        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(idem_client.__file__), "py.typed")))
        self.fault({"fault": "error", "times": 1})
        c = Client(self.url, ALICE, retry=RetryPolicy(deadline=20), budget=RetryBudget(),
                   sleep=lambda d: None)
        r = c.create_payment(PaymentRequest("ORD-WHEEL", "9.99", "USD"))
        self.assertEqual((r.status, r.attempts, r.payment.amount), (201, 2, "9.99"))
        self.assertEqual(self.total_charges(), 1)
        print("\n  wheel smoke: %s from %s, payment %s" % (idem_client.__version__,
              idem_client.__file__, r.payment.id), file=sys.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
