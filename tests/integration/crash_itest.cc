// tests/integration/crash_itest.cc — crashes and lost leases at named failpoints, with real
// processes: whatever dies where, each merchant order is charged once and every client that
// retries gets the one answer.
#include <signal.h>
#include <sys/wait.h>

#include <thread>

#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

namespace json = boost::json;

// The one payment id the provider has charged, or "" (asserting there is exactly one charge).
std::string OnlyChargedReference(IdemdTest& t) {
  auto r = http::Call(t.provider_url_, http::Request{"GET", "/admin/stats", {}, {}});
  if (!r) return "";
  json::object stats = IdemdTest::ParseObject(r->body);
  const json::object& by_ref = stats["charges_by_reference"].as_object();
  EXPECT_EQ(by_ref.size(), 1u);
  return by_ref.empty() ? "" : std::string(by_ref.begin()->key());
}

// Retries `key` until it is no longer running (the crashed executor's lease must expire first).
http::Response RetryUntilSettled(IdemdTest& t, const std::string& key, const std::string& body) {
  http::Response r;
  for (int i = 0; i < 100; ++i) {
    r = t.Pay(key, body);
    if (r.status != 409) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return r;
}

// idemd stalls after the provider charged, is killed with SIGKILL, restarts, and the client's
// retry with the same key finds the charge instead of making another.
void CrashAfterChargeThenRetry(IdemdTest& t, const std::string& point) {
  t.StartIdemd({.env = {{"IDEM_FAILPOINTS", point + "=stall:60000"}}});
  const std::string key = "crash-order-key";
  const std::string body = IdemdTest::Body("ORD-CRASH");
  std::thread doomed([&] {
    http::Request req{"POST", "/v1/payments", {}, body};
    req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Idempotency-Key", key);
    (void)http::Call(t.idemd_url_, std::move(req));  // never answered: the process dies
  });
  for (int i = 0; i < 100 && t.TotalCharges() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(t.TotalCharges(), 1) << "the provider was never reached";
  t.KillIdemd();
  doomed.join();

  t.StartIdemd();
  http::Response r = RetryUntilSettled(t, key, body);
  ASSERT_EQ(r.status, 201) << r.body;
  EXPECT_EQ(t.TotalCharges(), 1);
  EXPECT_EQ(IdemdTest::ParseObject(r.body)["id"].as_string(), OnlyChargedReference(t));
  // And from then on, a plain replay.
  http::Response again = t.Pay(key, body);
  EXPECT_EQ(again.body, r.body);
  EXPECT_EQ(again.headers.Get("idempotent-replayed").value_or(""), "true");
}

TEST_F(IdemdTest, KilledAfterTheChargeLeftRetryChargesOnce) {
  CrashAfterChargeThenRetry(*this, "after_provider_charge");
}

TEST_F(IdemdTest, KilledAfterTheChargeLeftWithAProviderIgnoringKeys) {
  ProviderMode(true);
  CrashAfterChargeThenRetry(*this, "after_provider_charge");
}

TEST_F(IdemdTest, KilledBeforeTheCompletionCommitted) {
  CrashAfterChargeThenRetry(*this, "before_complete_commit");
}

// idemd crashes at `point` (exit at that line, like kill -9), restarts, and the client's retry
// with the same key ends with one charge: `charges_at_crash` were made before the crash, and
// the retry's answer is a replay exactly when the completion had committed.
void CrashAtThenRetry(IdemdTest& t, const std::string& point, int64_t charges_at_crash,
                      bool replayed) {
  t.StartIdemd({.env = {{"IDEM_FAILPOINTS", point + "=crash"}}});
  const std::string key = "crash-key-" + point;
  const std::string body = IdemdTest::Body("ORD-CRASH-" + std::to_string(point.size()));
  http::Request req{"POST", "/v1/payments", {}, body};
  req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
  req.headers.Set("Content-Type", "application/json");
  req.headers.Set("Idempotency-Key", key);
  EXPECT_FALSE(http::Call(t.idemd_url_, std::move(req)).has_value()) << "the process exited";
  auto status = t.idemd_->Wait(std::chrono::seconds(5));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 86) << "not the failpoint's exit";
  t.idemd_.reset();
  EXPECT_EQ(t.TotalCharges(), charges_at_crash);
  t.StartIdemd();
  http::Response r = RetryUntilSettled(t, key, body);
  EXPECT_EQ(r.status, 201) << r.body;
  EXPECT_EQ(r.headers.Get("idempotent-replayed").has_value(), replayed) << r.body;
  EXPECT_EQ(t.TotalCharges(), 1);
}

TEST_F(IdemdTest, CrashAfterTheClaimExecutesOnceOnRetry) {
  CrashAtThenRetry(*this, "after_claim", 0, false);
}

TEST_F(IdemdTest, CrashAtAFailpointExitsAndLeavesARecoverableRecord) {
  CrashAtThenRetry(*this, "after_charge_sent", 0, false);
}

TEST_F(IdemdTest, CrashAfterTheCompletionCommittedReplaysOnRetry) {
  CrashAtThenRetry(*this, "after_complete_commit", 1, true);
}

TEST_F(IdemdTest, ReconcilerResolvesAnAbandonedChargeWithoutAnyRetry) {
  StartIdemd({.env = {{"IDEM_FAILPOINTS", "after_provider_charge=stall:60000"}}});
  std::thread doomed([&] {
    http::Request req{"POST", "/v1/payments", {}, Body("ORD-RECON")};
    req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Idempotency-Key", "recon-order-key");
    (void)http::Call(idemd_url_, std::move(req));
  });
  for (int i = 0; i < 100 && TotalCharges() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  KillIdemd();
  doomed.join();
  StartIdemd({.lease_ms = 1000, .provider_timeout_ms = 400, .reconcile_interval_ms = 200});
  json::object op;
  for (int i = 0; i < 100; ++i) {
    op = ParseObject(Get("/v1/operations/recon-order-key").body);
    if (op["state"] == "SUCCEEDED") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(op["state"], "SUCCEEDED");
  EXPECT_EQ(op["response"].as_object()["id"].as_string(), OnlyChargedReference(*this));
  EXPECT_EQ(TotalCharges(), 1);
  http::Response replay = Pay("recon-order-key", Body("ORD-RECON"));
  EXPECT_EQ(replay.status, 201);
  EXPECT_EQ(replay.headers.Get("idempotent-replayed").value_or(""), "true");
}

// A slow executor loses its lease to a takeover; its late completion is fenced out, and both
// clients see the same answer. A live executor's heartbeat keeps its lease, and the charge is
// sent under a lease that outlasts the provider's timeout, so the lease is lost here the one way
// left: the heartbeat fails (as when the store is out of reach) and the executor stalls after
// the charge.
TEST_F(IdemdTest, SlowExecutorIsFencedOutAndBothClientsSeeOneAnswer) {
  StartIdemd({.lease_ms = 1000,
              .provider_timeout_ms = 400,
              .env = {{"IDEM_FAILPOINTS", "heartbeat=error,after_provider_charge=stall:2500"}}});
  http::Response slow;
  std::thread first([&] { slow = Pay("lease-order-key", Body("ORD-LEASE")); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));  // past the lease
  http::Response taker = Pay("lease-order-key", Body("ORD-LEASE"));
  first.join();
  ASSERT_EQ(taker.status, 201) << taker.body;
  EXPECT_EQ(slow.status, 201) << slow.body;
  EXPECT_EQ(slow.body, taker.body);
  EXPECT_EQ(TotalCharges(), 1);
  http::Response m = Get("/metrics", "");
  EXPECT_NE(m.body.find("idem_fencing_rejections_total 1"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("idem_lease_takeovers_total 1"), std::string::npos);
}

}  // namespace
}  // namespace idem::itest
