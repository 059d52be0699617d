// src/core/engine_test.cc — the protocol end to end on a real SQLite file, with a fake clock.
#include "idem/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <map>
#include <stdexcept>
#include <thread>

#include "idem/failpoint.h"
#include "idem/heartbeat.h"
#include "idem/mutex.h"
#include "idem/store/sqlite.h"
#include "testing/assert_ok.h"
#include "testing/engine_fixture.h"
#include "testing/fakes.h"

namespace idem {
namespace {

constexpr Millis kLease{10000};
constexpr Millis kRetention{24LL * 3600 * 1000};

class EngineTest : public testing::EngineFixture {
 protected:
  EngineTest()
      : EngineFixture(
            {{"engine_test",
              {{1, "CREATE TABLE payments (id TEXT PRIMARY KEY, status TEXT NOT NULL)"}}}},
            3) {}

  void SetUp() override {
    policy_.route = "payments.create";
    policy_.rules.money_fields = {"amount"};
    policy_.rules.removed_fields = {"trace_id"};
    policy_.lease = kLease;
    policy_.retention = kRetention;
    policy_.retry_after = Millis(1000);
  }

  Request Req(std::string_view key, std::string_view body = R"({"amount":"100.00"})",
              std::string user = "alice") {
    bodies_.emplace_back(body);
    keys_.emplace_back(key);
    Request r;
    r.principal = {"acme", std::move(user)};
    r.key_header = keys_.back();
    r.method = "POST";
    r.content_type = "application/json";
    r.api_version = "v1";
    r.body = bodies_.back();
    return r;
  }

  Decision MustStart(const Request& r, const TxnHook& hook = {}) {
    auto d = engine_->Start(policy_, r, hook);
    EXPECT_TRUE(d.has_value()) << d.error().message;
    return d ? std::move(*d) : Decision{};
  }

  Errc StartError(const Request& r, const TxnHook& hook = {}) {
    auto d = engine_->Start(policy_, r, hook);
    EXPECT_FALSE(d.has_value());
    return d ? Errc::kInternal : d.error().code;
  }

  // The record of `key`, nullopt when there is none (or, failing the test, when it cannot be
  // read).
  std::optional<Record> RecordOf(const std::string& key, const std::string& user = "alice") {
    auto scope = IDEM_VALUE_OF((Scope{"acme", user, policy_.route, key}.Hash()));
    if (!scope) return std::nullopt;
    auto read = IDEM_VALUE_OF(store_->Read(*scope));
    return read ? *read : std::nullopt;
  }

  // The payments rows of `id`; -1, failing the test, when they cannot be counted.
  int64_t Payments(const std::string& id) {
    auto txn = IDEM_VALUE_OF(store_->Begin());
    if (!txn) return -1;
    auto rows = IDEM_VALUE_OF((*txn)->Exec("SELECT count(*) FROM payments WHERE id = ?", {id}));
    if (!rows || rows->size() != 1 || !std::holds_alternative<int64_t>(rows->at(0).at(0))) {
      ADD_FAILURE() << "no count of payments " << id;
      return -1;
    }
    return std::get<int64_t>(rows->at(0)[0]);
  }

  static StoredResponse Created(std::string id) {
    return {201,
            {{"Location", "/v1/payments/" + id}, {"Content-Type", "application/json"}},
            R"({"id":")" + id + R"(","status":"succeeded"})"};
  }

  // A claim hook that fixes the payment id and inserts the pending payment, once per operation.
  static TxnHook InsertPending(std::string id) {
    return [id](StoreTxn& txn, const Record& record) -> Status {
      if (!record.resource_id.empty()) return Ok();
      IDEM_RETURN_IF_ERROR(
          txn.Exec("INSERT INTO payments (id, status) VALUES (?, 'pending')", {id}));
      return txn.Advance(record.scope, record.lease, "claimed", id);
    };
  }

  static TxnHook MarkSucceeded(std::string id) {
    return [id](StoreTxn& txn, const Record&) -> Status {
      IDEM_RETURN_IF_ERROR(txn.Exec("UPDATE payments SET status = 'succeeded' WHERE id = ?", {id}));
      return Ok();
    };
  }

  RoutePolicy policy_;
  std::deque<std::string> bodies_, keys_;
};

TEST_F(EngineTest, FirstRequestExecutesAndRetriesReplayTheSameAnswer) {
  Decision first = MustStart(Req("key-00001"), InsertPending("pay_1"));
  ASSERT_EQ(first.kind, Decision::Kind::kExecute);
  EXPECT_FALSE(first.ticket.resumed);
  EXPECT_EQ(first.ticket.record.resource_id, "pay_1");
  EXPECT_EQ(first.ticket.record.recovery_point, "claimed");
  EXPECT_EQ(first.key_expires, clock_.Now() + kRetention);
  ASSERT_TRUE(
      engine_
          ->Finish(first.ticket, RecordState::kSucceeded, Created("pay_1"), MarkSucceeded("pay_1"))
          .has_value());

  clock_.Advance(Millis(5000));
  // The same request written differently (money as a number, another trace id) is a retry.
  for (std::string_view body : {R"({"amount":"100.00"})", R"({"amount":100,"trace_id":"x"})"}) {
    Decision again = MustStart(Req("\"key-00001\"", body), InsertPending("pay_2"));
    ASSERT_EQ(again.kind, Decision::Kind::kReplay);
    EXPECT_EQ(again.response, Created("pay_1"));
    EXPECT_EQ(again.key_expires, first.key_expires);
  }
  EXPECT_EQ(Payments("pay_1"), 1);
  EXPECT_EQ(Payments("pay_2"), 0) << "a replay must not run the claim hook";
  EXPECT_EQ(RecordOf("key-00001").value().recovery_point, "done");
}

TEST_F(EngineTest, SameKeyWithADifferentRequestIsAMismatch) {
  Decision first = MustStart(Req("key-00002"));
  // While running, and after finishing.
  EXPECT_EQ(StartError(Req("key-00002", R"({"amount":"100.01"})")), Errc::kFingerprintMismatch);
  ASSERT_TRUE(engine_->Finish(first.ticket, RecordState::kSucceeded, Created("p")).has_value());
  EXPECT_EQ(StartError(Req("key-00002", R"({"amount":"100.01"})")), Errc::kFingerprintMismatch);
  // The same key of another user is another record.
  EXPECT_EQ(MustStart(Req("key-00002", R"({"amount":"100.01"})", "bob")).kind,
            Decision::Kind::kExecute);
}

// A canonical request the caller made (Request::canonical: idemd's filter makes it once) is the
// one the engine fingerprints, on the claim and on every replay: it is not made again from the
// body. Given another body's canonical form, the record follows that body.
TEST_F(EngineTest, ACanonicalRequestTheCallerMadeIsTheOneFingerprinted) {
  const CanonicalRequest other =
      IDEM_VALUE_OF((Engine::Canonical(policy_, Req("key-00009", R"({"amount":"7.00"})")))).value();
  Request given = Req("key-00009");
  given.canonical = &other;
  Decision first = MustStart(given);
  ASSERT_EQ(first.kind, Decision::Kind::kExecute);
  ASSERT_TRUE(engine_->Finish(first.ticket, RecordState::kSucceeded, Created("p")).has_value());
  EXPECT_EQ(MustStart(Req("key-00009", R"({"amount":7})")).kind, Decision::Kind::kReplay);
  EXPECT_EQ(StartError(Req("key-00009")), Errc::kFingerprintMismatch);
  // The store's snapshot read alike.
  auto mismatch = engine_->ReplayFromStore(policy_, Req("key-00009"));
  ASSERT_FALSE(mismatch.has_value());
  EXPECT_EQ(mismatch.error().code, Errc::kFingerprintMismatch);
  auto replayed = engine_->ReplayFromStore(policy_, given);
  ASSERT_TRUE(replayed.has_value()) << replayed.error().message;
  ASSERT_TRUE(replayed->has_value());
  EXPECT_EQ((*replayed)->kind, Decision::Kind::kReplay);
}

// Start reports the expiry of the record that holds the key with every mismatch (decided on the
// snapshot read or in the claim transaction), and touches the out-parameter on nothing else.
TEST_F(EngineTest, AMismatchReportsTheExpiryOfTheRecordThatHoldsTheKey) {
  const Timestamp untouched = FromUnixMillis(42);
  Timestamp expires = untouched;
  auto start = [&](const Request& r) { return engine_->Start(policy_, r, {}, &expires); };

  // A new operation, and a duplicate while it runs: no mismatch, untouched.
  auto first = start(Req("expires-01"));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->key_expires, clock_.Now() + kRetention);
  ASSERT_EQ(start(Req("expires-01"))->kind, Decision::Kind::kInProgress);
  EXPECT_EQ(expires, untouched);

  // Mismatch while running (the claim transaction decides).
  clock_.Advance(Millis(3000));
  auto running = start(Req("expires-01", R"({"amount":"2"})"));
  ASSERT_FALSE(running.has_value());
  EXPECT_EQ(running.error().code, Errc::kFingerprintMismatch);
  EXPECT_EQ(expires, first->key_expires) << "the record's expiry, not now + retention";

  // Mismatch once finished (the snapshot read decides).
  ASSERT_TRUE(engine_->Finish(first->ticket, RecordState::kSucceeded, Created("p")).has_value());
  clock_.Advance(Millis(3000));
  expires = untouched;
  auto finished = start(Req("expires-01", R"({"amount":"3"})"));
  ASSERT_FALSE(finished.has_value());
  EXPECT_EQ(finished.error().code, Errc::kFingerprintMismatch);
  EXPECT_EQ(expires, first->key_expires);

  // Replays and other errors leave it alone.
  expires = untouched;
  ASSERT_EQ(start(Req("expires-01"))->kind, Decision::Kind::kReplay);
  EXPECT_EQ(start(Req("short")).error().code, Errc::kInvalidArgument);
  EXPECT_EQ(start(Req("expires-02", R"({"amount":)")).error().code, Errc::kInvalidArgument);
  EXPECT_EQ(expires, untouched);
  // And a caller that passes nothing still gets the error.
  EXPECT_EQ(StartError(Req("expires-01", R"({"amount":"4"})")), Errc::kFingerprintMismatch);
}

// Only the media type of Content-Type is part of the fingerprint: parameters, case and the white
// space around them do not change what the request means.
TEST_F(EngineTest, ContentTypeParametersAndCaseDoNotChangeTheFingerprint) {
  const std::vector<std::string_view> same_media_type = {
      "application/json; charset=utf-8", "Application/JSON", " APPLICATION/json ;charset=UTF-8",
      "application/json\t;\tq=1"};
  auto with_type = [&](std::string_view key, std::string_view content_type) {
    Request r = Req(key);
    r.content_type = content_type;
    return r;
  };
  // While the first runs (decided in the claim transaction): the same request, in progress.
  Decision running = MustStart(Req("ctype-0001"));
  for (std::string_view type : same_media_type) {
    SCOPED_TRACE(type);
    EXPECT_EQ(MustStart(with_type("ctype-0001", type)).kind, Decision::Kind::kInProgress);
  }
  // Once it finished (decided on the snapshot read): a replay.
  ASSERT_TRUE(engine_->Finish(running.ticket, RecordState::kSucceeded, Created("p")).has_value());
  for (std::string_view type : same_media_type) {
    SCOPED_TRACE(type);
    EXPECT_EQ(MustStart(with_type("ctype-0001", type)).kind, Decision::Kind::kReplay);
  }
  // Another media type is another request.
  EXPECT_EQ(StartError(with_type("ctype-0001", "text/plain; charset=utf-8")),
            Errc::kFingerprintMismatch);
  EXPECT_EQ(StartError(with_type("ctype-0001", "application/json-seq")),
            Errc::kFingerprintMismatch);
}

// A held outcome is replayed as stored until an operator settles it, once: executed, every copy
// then gets the operator's answer; not executed, the next copy executes as a resume, under the
// ids the operation fixed.
TEST_F(EngineTest, AnOperatorSettlesAHeldOutcomeOnce) {
  const StoredResponse unknown{502, {{"Content-Type", "application/problem+json"}}, "unknown"};
  Decision first = MustStart(Req("held-0001"));
  ASSERT_EQ(first.kind, Decision::Kind::kExecute);
  ASSERT_TRUE(
      engine_->Finish(first.ticket, RecordState::kFailedFinal, unknown, {}, kOutcomeUnknownPoint)
          .has_value());
  Decision replay = MustStart(Req("held-0001"));
  ASSERT_EQ(replay.kind, Decision::Kind::kReplay);
  EXPECT_EQ(replay.response.status, 502);
  EXPECT_EQ(replay.record.recovery_point, kOutcomeUnknownPoint);

  const StoredResponse answer{201, {{"Content-Type", "application/json"}}, R"({"id":"o_1"})"};
  auto settled = engine_->Settle(first.ticket.scope, answer);
  ASSERT_TRUE(settled.has_value()) << settled.error().message;
  EXPECT_EQ(settled->state, RecordState::kSucceeded);
  EXPECT_EQ(settled->recovery_point, kOperatorSettledPoint);
  replay = MustStart(Req("held-0001"));
  ASSERT_EQ(replay.kind, Decision::Kind::kReplay);
  EXPECT_EQ(replay.response.status, 201);
  EXPECT_EQ(replay.response.body, answer.body);
  auto again = engine_->Settle(first.ticket.scope, std::nullopt);
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code, Errc::kConflict) << again.error().message;

  Decision other = MustStart(Req("held-0002"), [](StoreTxn& txn, const Record& r) {
    return txn.Advance(r.scope, r.lease, "claimed", "ext-7");
  });
  ASSERT_TRUE(engine_->AdvanceBeforeCall(other.ticket, "forwarded", Millis(0)));
  ASSERT_TRUE(
      engine_->Finish(other.ticket, RecordState::kFailedFinal, unknown, {}, kOutcomeUnknownPoint)
          .has_value());
  auto bad_status = engine_->Settle(other.ticket.scope, StoredResponse{99, {}, ""});
  ASSERT_FALSE(bad_status.has_value());
  EXPECT_EQ(bad_status.error().code, Errc::kInvalidArgument);
  auto not_executed = engine_->Settle(other.ticket.scope, std::nullopt);
  ASSERT_TRUE(not_executed.has_value()) << not_executed.error().message;
  EXPECT_EQ(not_executed->state, RecordState::kFailedRetryable);
  Decision resumed = MustStart(Req("held-0002"));
  ASSERT_EQ(resumed.kind, Decision::Kind::kExecute);
  EXPECT_TRUE(resumed.ticket.resumed);
  EXPECT_EQ(resumed.ticket.record.recovery_point, "");
  EXPECT_EQ(resumed.ticket.record.resource_id, "ext-7");

  // Finish names a point only for a retryable failure, or a held outcome.
  EXPECT_EQ(
      engine_
          ->Finish(resumed.ticket, RecordState::kSucceeded, Created("p"), {}, kOutcomeUnknownPoint)
          .error()
          .code,
      Errc::kInvalidArgument);
  auto missing = engine_->Settle(*Scope{"acme", "alice", "payments.create", "nope"}.Hash(), {});
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, Errc::kNotFound);
}

// A route's stored-answer cap holds at its value and one past it: Finish refuses the larger
// answer with kTooLarge and writes nothing, so the caller can finish with one that fits.
TEST_F(EngineTest, FinishKeepsAnAnswerAtTheRoutesCapAndRefusesOnePast) {
  policy_.max_response_bytes = 1000;
  const std::size_t overhead = EncodeResponse(StoredResponse{201, {}, ""}).size();
  const StoredResponse at_cap{201, {}, std::string(1000 - overhead, 'a')};
  const StoredResponse past_cap{201, {}, std::string(1001 - overhead, 'a')};
  ASSERT_EQ(EncodeResponse(past_cap).size(), 1001u);

  Decision past = MustStart(Req("cap-00001"));
  ASSERT_EQ(past.ticket.max_response_bytes, 1000u) << "the ticket carries the route's cap";
  const Status refused = engine_->Finish(past.ticket, RecordState::kSucceeded, past_cap);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, Errc::kTooLarge);
  EXPECT_EQ(RecordOf("cap-00001").value().state, RecordState::kProcessing) << "nothing was written";

  Decision at = MustStart(Req("cap-00002"));
  ASSERT_TRUE(engine_->Finish(at.ticket, RecordState::kSucceeded, at_cap).has_value());
  Decision replay = MustStart(Req("cap-00002"));
  ASSERT_EQ(replay.kind, Decision::Kind::kReplay);
  EXPECT_EQ(replay.response, at_cap);
}

TEST_F(EngineTest, BadInputLeavesNoRecord) {
  Request missing = Req("unused-key");
  missing.key_header.reset();
  EXPECT_EQ(StartError(missing), Errc::kInvalidArgument);
  EXPECT_EQ(StartError(Req("short")), Errc::kInvalidArgument);
  EXPECT_EQ(StartError(Req("key-00003", R"({"amount":)")), Errc::kInvalidArgument);
  EXPECT_EQ(StartError(Req("key-00003", R"({"amount":"ten"})")), Errc::kInvalidArgument);
  EXPECT_EQ(StartError(Req("key-00003", std::string(limits::kJsonMaxBytes + 1, ' '))),
            Errc::kTooLarge);
  EXPECT_FALSE(RecordOf("key-00003").has_value());
}

TEST_F(EngineTest, DuplicateWhileRunningIsInProgress) {
  Decision first = MustStart(Req("key-00004"));
  ASSERT_EQ(first.kind, Decision::Kind::kExecute);
  clock_.Advance(Millis(9500));
  Decision dup = MustStart(Req("key-00004"));
  ASSERT_EQ(dup.kind, Decision::Kind::kInProgress);
  EXPECT_EQ(dup.retry_after, Millis(500)) << "never later than the lease's end";
  EXPECT_EQ(dup.key_expires, first.key_expires);
  clock_.Advance(Millis(-9000));
  EXPECT_EQ(MustStart(Req("key-00004")).retry_after, Millis(1000)) << "capped by the policy";
}

TEST_F(EngineTest, ExpiredLeaseIsTakenOverAndTheStaleExecutorIsFencedOut) {
  Decision slow = MustStart(Req("key-00005"), InsertPending("pay_5"));
  ASSERT_TRUE(engine_->Advance(slow.ticket, "charge_sent").has_value());
  clock_.Advance(kLease + Millis(1));

  Decision taker = MustStart(Req("key-00005"), InsertPending("pay_other"));
  ASSERT_EQ(taker.kind, Decision::Kind::kExecute);
  EXPECT_TRUE(taker.ticket.resumed);
  // The new executor learns a charge may have left, and for which payment.
  EXPECT_EQ(taker.ticket.record.recovery_point, "charge_sent");
  EXPECT_EQ(taker.ticket.record.resource_id, "pay_5");
  EXPECT_EQ(Payments("pay_other"), 0);

  auto late = engine_->Finish(
      slow.ticket, RecordState::kSucceeded, Created("pay_5"),
      [](StoreTxn& txn, const Record&) -> Status {
        IDEM_RETURN_IF_ERROR(txn.Exec("INSERT INTO payments (id, status) VALUES ('ghost', 'x')"));
        return Ok();
      });
  ASSERT_FALSE(late.has_value());
  EXPECT_EQ(late.error().code, Errc::kFenced);
  EXPECT_EQ(Payments("ghost"), 0);
  EXPECT_EQ(engine_->Advance(slow.ticket, "done").error().code, Errc::kFenced);

  ASSERT_TRUE(
      engine_
          ->Finish(taker.ticket, RecordState::kSucceeded, Created("pay_5"), MarkSucceeded("pay_5"))
          .has_value());
  Decision replay = MustStart(Req("key-00005"));
  ASSERT_EQ(replay.kind, Decision::Kind::kReplay);
  EXPECT_EQ(replay.response, Created("pay_5"));
}

// ExecuteInTxn decides as Start does: a claim under a live lease is running (in progress, not
// run), an expired one is taken over (resumed) and finished in the transaction that runs it.
TEST_F(EngineTest, ExecuteInTxnTakesOverAnExpiredClaimAndLeavesALiveOneRunning) {
  Decision stalled = MustStart(Req("key-txn-01"), InsertPending("pay_t1"));
  ASSERT_EQ(stalled.kind, Decision::Kind::kExecute);
  int runs = 0;
  bool resumed = false;
  const TxnOperation operation = [&](std::size_t, StoreTxn& txn,
                                     const Ticket& ticket) -> Result<StoredResponse> {
    ++runs;
    resumed = ticket.resumed;
    EXPECT_EQ(ticket.record.resource_id, "pay_t1") << "the claim's ids are the operation's";
    IDEM_RETURN_IF_ERROR(txn.Exec("UPDATE payments SET status = 'succeeded' WHERE id = ?",
                                  {ticket.record.resource_id}));
    return Created(ticket.record.resource_id);
  };
  const std::vector<Request> one = {Req("key-txn-01")};
  auto live = engine_->ExecuteInTxn(policy_, one, operation);
  ASSERT_TRUE(live.has_value()) << live.error().message;
  ASSERT_TRUE((*live)[0].has_value());
  EXPECT_EQ((*live)[0]->kind, Decision::Kind::kInProgress);
  EXPECT_EQ(runs, 0);

  clock_.Advance(kLease + Millis(1));
  auto taken = engine_->ExecuteInTxn(policy_, one, operation);
  ASSERT_TRUE(taken.has_value()) << taken.error().message;
  ASSERT_TRUE((*taken)[0].has_value()) << (*taken)[0].error().message;
  EXPECT_EQ((*taken)[0]->kind, Decision::Kind::kExecute);
  EXPECT_EQ((*taken)[0]->response, Created("pay_t1"));
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(resumed);
  EXPECT_EQ(RecordOf("key-txn-01").value().state, RecordState::kSucceeded);
  EXPECT_EQ(RecordOf("key-txn-01").value().recovery_point, "done");
  // The stalled executor lost its lease to the takeover.
  EXPECT_EQ(engine_->Finish(stalled.ticket, RecordState::kSucceeded, Created("x")).error().code,
            Errc::kFenced);
  Decision replay = MustStart(Req("key-txn-01"));
  ASSERT_EQ(replay.kind, Decision::Kind::kReplay);
  EXPECT_EQ(replay.response, Created("pay_t1"));
}

TEST_F(EngineTest, ExecuteInTxnKeepsAFinalFailureAndRefusesAnAnswerThatIsNoStatus) {
  const std::vector<Request> declined = {Req("key-txn-02")};
  const StoredResponse refusal{409, {}, "out of stock"};
  auto done = engine_->ExecuteInTxn(
      policy_, declined,
      [&](std::size_t, StoreTxn&, const Ticket&) -> Result<StoredResponse> { return refusal; });
  ASSERT_TRUE(done.has_value() && (*done)[0].has_value());
  EXPECT_EQ(RecordOf("key-txn-02").value().state, RecordState::kFailedFinal);
  Decision replay = MustStart(Req("key-txn-02"));
  ASSERT_EQ(replay.kind, Decision::Kind::kReplay);
  EXPECT_EQ(replay.response, refusal);

  const std::vector<Request> odd = {Req("key-txn-03")};
  auto refused = engine_->ExecuteInTxn(
      policy_, odd, [](std::size_t, StoreTxn& txn, const Ticket&) -> Result<StoredResponse> {
        IDEM_RETURN_IF_ERROR(txn.Exec("INSERT INTO payments (id, status) VALUES ('t3', 'x')"));
        return StoredResponse{99, {}, ""};
      });
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, Errc::kInvalidArgument);
  EXPECT_FALSE(RecordOf("key-txn-03").has_value());
  EXPECT_EQ(Payments("t3"), 0);
}

// A transaction that forwards to a real one and notes the principal of each quota count.
class CountOrderTxn final : public StoreTxnWrapper {
 public:
  CountOrderTxn(std::unique_ptr<StoreTxn> target, std::vector<std::string>& counted)
      : StoreTxnWrapper(std::move(target)), counted_(counted) {}

  Result<QuotaCounts> CountQuota(std::string_view tenant, std::string_view user,
                                 int64_t processing_limit, int64_t retained_limit) override {
    counted_.push_back(std::string(tenant) + "/" + std::string(user));
    return StoreTxnWrapper::CountQuota(tenant, user, processing_limit, retained_limit);
  }

 private:
  std::vector<std::string>& counted_;
};

class CountOrderStore final : public StoreWrapper {
 public:
  explicit CountOrderStore(Store& target) : StoreWrapper(target) {}
  std::vector<std::string> counted;

 private:
  std::unique_ptr<StoreTxn> WrapTxn(std::unique_ptr<StoreTxn> txn) override {
    return std::make_unique<CountOrderTxn>(std::move(txn), counted);
  }
};

// A batch counts each principal's quota once, in the order of the principals, whatever the order
// of its requests (claimed in the order of their scope hashes): two batches of the same principals
// lock them (PostgreSQL's counter rows) in one order, never each waiting for the other. Before the
// sort they were counted in the order the scope hashes put them.
TEST_F(EngineTest, ABatchCountsItsPrincipalsInOneOrder) {
  CountOrderStore counting(*store_);
  Engine engine(counting, *fingerprinter_, *sealer_, clock_);
  const std::vector<std::string> users = {"frank", "erin", "dave", "carol", "bob", "alice"};
  std::vector<Request> batch;
  for (const std::string& user : users)
    batch.push_back(Req("key-order-" + user, R"({"amount":"1.00"})", user));
  batch.push_back(Req("key-order-alice-2", R"({"amount":"1.00"})", "alice"));
  auto done = engine.ExecuteInTxn(
      policy_, batch, [](std::size_t, StoreTxn&, const Ticket&) -> Result<StoredResponse> {
        return StoredResponse{201, {}, "ok"};
      });
  ASSERT_TRUE(done.has_value()) << done.error().message;
  for (const auto& answer : *done) ASSERT_TRUE(answer.has_value()) << answer.error().message;
  EXPECT_EQ(counting.counted, (std::vector<std::string>{"acme/alice", "acme/bob", "acme/carol",
                                                        "acme/dave", "acme/erin", "acme/frank"}));
}

TEST_F(EngineTest, RenewalKeepsATakeoverAway) {
  Decision d = MustStart(Req("key-00006"));
  clock_.Advance(kLease - Millis(1000));
  ASSERT_TRUE(engine_->Renew(policy_, d.ticket).has_value());
  clock_.Advance(Millis(5000));
  EXPECT_EQ(MustStart(Req("key-00006")).kind, Decision::Kind::kInProgress);
  ASSERT_TRUE(engine_->Finish(d.ticket, RecordState::kSucceeded, Created("p6")).has_value());
}

TEST_F(EngineTest, RetryableFailureRunsAgainFinalFailureReplays) {
  Decision d = MustStart(Req("key-00007"), InsertPending("pay_7"));
  ASSERT_TRUE(
      engine_->Finish(d.ticket, RecordState::kFailedRetryable, {503, {}, "busy"}).has_value());
  Decision retry = MustStart(Req("key-00007"), InsertPending("pay_7b"));
  ASSERT_EQ(retry.kind, Decision::Kind::kExecute);
  EXPECT_TRUE(retry.ticket.resumed);
  EXPECT_EQ(retry.ticket.record.resource_id, "pay_7") << "the payment id is fixed once";

  const StoredResponse declined{402, {{"Content-Type", "application/problem+json"}}, "{}"};
  ASSERT_TRUE(engine_->Finish(retry.ticket, RecordState::kFailedFinal, declined).has_value());
  Decision replay = MustStart(Req("key-00007"));
  ASSERT_EQ(replay.kind, Decision::Kind::kReplay);
  EXPECT_EQ(replay.response, declined);
  EXPECT_EQ(replay.record.state, RecordState::kFailedFinal);
}

TEST_F(EngineTest, AfterRetentionTheKeyStartsANewOperation) {
  Decision d = MustStart(Req("key-00008"));
  ASSERT_TRUE(engine_->Finish(d.ticket, RecordState::kSucceeded, Created("p8")).has_value());
  clock_.Advance(kRetention);
  Decision fresh = MustStart(Req("key-00008", R"({"amount":"5"})"));
  ASSERT_EQ(fresh.kind, Decision::Kind::kExecute);
  EXPECT_FALSE(fresh.ticket.resumed);
  EXPECT_EQ(fresh.key_expires, clock_.Now() + kRetention);
}

TEST_F(EngineTest, AnUnresolvedExecutionIsNeverForgottenByExpiry) {
  Decision d = MustStart(Req("key-00011"), InsertPending("pay_11"));
  ASSERT_TRUE(engine_->Advance(d.ticket, "charge_sent").has_value());
  clock_.Advance(kRetention);
  // Another body cannot start a new operation on an unresolved one: it is a mismatch...
  EXPECT_EQ(StartError(Req("key-00011", R"({"amount":"3"})")), Errc::kFingerprintMismatch);
  // ...and the same body resumes it, with the payment id and recovery point intact.
  Decision resumed = MustStart(Req("key-00011"));
  ASSERT_EQ(resumed.kind, Decision::Kind::kExecute);
  EXPECT_TRUE(resumed.ticket.resumed);
  EXPECT_EQ(resumed.ticket.record.recovery_point, "charge_sent");
  EXPECT_EQ(resumed.ticket.record.resource_id, "pay_11");
}

TEST_F(EngineTest, AThrowingHookIsAnErrorAndRollsBack) {
  auto r = engine_->Start(policy_, Req("key-00012"), [](StoreTxn& txn, const Record&) -> Status {
    (void)txn.Exec("INSERT INTO payments (id, status) VALUES ('thrown', 'p')");
    throw std::runtime_error("boom");
  });
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::kInternal);
  EXPECT_FALSE(RecordOf("key-00012").has_value());
  EXPECT_EQ(Payments("thrown"), 0);
}

TEST_F(EngineTest, QuotasAtAndPastTheLimit) {
  policy_.max_processing = 2;
  policy_.max_retained = 3;
  Decision a = MustStart(Req("quota-0001"));
  MustStart(Req("quota-0002"));
  EXPECT_EQ(StartError(Req("quota-0003")), Errc::kResourceExhausted);
  EXPECT_FALSE(RecordOf("quota-0003").has_value()) << "a refused claim leaves nothing";
  // Another principal has its own quota.
  EXPECT_EQ(MustStart(Req("quota-0003", R"({"amount":1})", "bob")).kind, Decision::Kind::kExecute);

  ASSERT_TRUE(engine_->Finish(a.ticket, RecordState::kSucceeded, Created("a")).has_value());
  MustStart(Req("quota-0003"));  // 2 running + 1 retained = 3
  EXPECT_EQ(StartError(Req("quota-0004")), Errc::kResourceExhausted);
  // Replays are never refused by quota.
  EXPECT_EQ(MustStart(Req("quota-0001")).kind, Decision::Kind::kReplay);
}

TEST_F(EngineTest, AFailingClaimHookRollsTheClaimBack) {
  auto refused =
      engine_->Start(policy_, Req("key-00009"), [](StoreTxn& txn, const Record&) -> Status {
        IDEM_RETURN_IF_ERROR(txn.Exec("INSERT INTO payments (id, status) VALUES ('h', 'p')"));
        return MakeError(Errc::kAlreadyExists, "order exists");
      });
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, Errc::kAlreadyExists);
  EXPECT_FALSE(RecordOf("key-00009").has_value());
  EXPECT_EQ(Payments("h"), 0);
}

TEST_F(EngineTest, RecordsUnderOlderRulesStillVerify) {
  Decision d = MustStart(Req("key-00010", R"({"amount":"1.00","trace_id":"a"})"));
  ASSERT_TRUE(engine_->Finish(d.ticket, RecordState::kSucceeded, Created("p10")).has_value());

  CanonicalRules v2 = policy_.rules;
  v2.version = 2;
  v2.defaults = {{"currency", "\"CNY\""}};
  policy_.previous_rules = {policy_.rules};
  policy_.rules = v2;
  EXPECT_EQ(MustStart(Req("key-00010", R"({"amount":1,"trace_id":"b"})")).kind,
            Decision::Kind::kReplay);
  EXPECT_EQ(StartError(Req("key-00010", R"({"amount":2})")), Errc::kFingerprintMismatch);

  policy_.previous_rules.clear();
  EXPECT_EQ(StartError(Req("key-00010", R"({"amount":1})")), Errc::kDataLoss);
}

TEST_F(EngineTest, ConcurrentDuplicatesYieldOneExecution) {
  constexpr int kThreads = 16;
  std::atomic<int> executed{0}, in_progress{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      Request r;
      r.principal = {"acme", "alice"};
      r.key_header = "key-concurrent";
      r.method = "POST";
      r.content_type = "application/json";
      r.body = R"({"amount":"7.00"})";
      auto d = engine_->Start(policy_, r);
      if (!d) {
        ++failed;
      } else if (d->kind == Decision::Kind::kExecute) {
        ++executed;
      } else if (d->kind == Decision::Kind::kInProgress) {
        ++in_progress;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(executed.load(), 1);
  EXPECT_EQ(in_progress.load(), kThreads - 1);
}

}  // namespace
}  // namespace idem

namespace idem {
namespace {

TEST_F(EngineTest, ReleaseLetsTheNextAttemptTakeOverAtOnce) {
  Decision d = MustStart(Req("key-00013"), InsertPending("pay_13"));
  ASSERT_TRUE(engine_->Advance(d.ticket, "charge_sent").has_value());
  ASSERT_TRUE(engine_->Release(d.ticket).has_value());
  clock_.Advance(Millis(1));
  Decision next = MustStart(Req("key-00013"));
  ASSERT_EQ(next.kind, Decision::Kind::kExecute);
  EXPECT_TRUE(next.ticket.resumed);
  EXPECT_EQ(next.ticket.record.recovery_point, "charge_sent");
  EXPECT_EQ(engine_->Release(d.ticket).error().code, Errc::kFenced);
}

TEST_F(EngineTest, TakeOverClaimsAStaleRecordOnce) {
  Decision d = MustStart(Req("key-00014"), InsertPending("pay_14"));
  clock_.Advance(kLease + Millis(1));
  auto stale = engine_->ListStale(policy_, 10);
  ASSERT_TRUE(stale.has_value());
  ASSERT_EQ(stale->size(), 1u);
  auto ticket = engine_->TakeOver(policy_, stale->at(0));
  ASSERT_TRUE(ticket.has_value()) << ticket.error().message;
  EXPECT_EQ(ticket->record.resource_id, "pay_14");
  EXPECT_EQ(ticket->lease.fence, d.ticket.lease.fence + 1);
  EXPECT_EQ(engine_->TakeOver(policy_, stale->at(0)).error().code, Errc::kConflict);
  EXPECT_EQ(engine_->Finish(d.ticket, RecordState::kSucceeded, Created("x")).error().code,
            Errc::kFenced);
  EXPECT_TRUE(engine_->Finish(*ticket, RecordState::kFailedRetryable, {503, {}, ""}).has_value());
}

TEST_F(EngineTest, LookupFindsTheCallersRecordAndOpensItsAnswer) {
  const Principal alice{"acme", "alice"};
  Decision d = MustStart(Req("lookup-0001"), InsertPending("pay_l1"));
  auto running = engine_->Lookup(alice, policy_, "lookup-0001");
  ASSERT_TRUE(running.has_value()) << running.error().message;
  ASSERT_TRUE(running->has_value());
  EXPECT_EQ((*running)->key, "lookup-0001");
  EXPECT_EQ((*running)->record.state, RecordState::kProcessing);
  EXPECT_EQ((*running)->record.resource_id, "pay_l1");
  EXPECT_FALSE((*running)->response.has_value()) << "nothing to open while running";

  ASSERT_TRUE(engine_->Finish(d.ticket, RecordState::kSucceeded, Created("pay_l1")).has_value());
  // The key is parsed as Start parses the header: an sf-string names the same record.
  auto finished = engine_->Lookup(alice, policy_, "\"lookup-0001\"");
  ASSERT_TRUE(finished.has_value() && finished->has_value());
  EXPECT_EQ((*finished)->key, "lookup-0001");
  EXPECT_FALSE((*finished)->expired);
  ASSERT_TRUE((*finished)->response.has_value());
  EXPECT_EQ(*(*finished)->response, Created("pay_l1"));
  auto by_scope = engine_->Lookup(d.ticket.scope);
  ASSERT_TRUE(by_scope.has_value() && by_scope->has_value());
  EXPECT_EQ((*by_scope)->key, "");
  EXPECT_EQ((*by_scope)->response, (*finished)->response);

  // Another principal's key is another record; a malformed key is refused.
  auto other = engine_->Lookup({"acme", "bob"}, policy_, "lookup-0001");
  ASSERT_TRUE(other.has_value());
  EXPECT_FALSE(other->has_value());
  auto malformed = engine_->Lookup(alice, policy_, "bad key!");
  ASSERT_FALSE(malformed.has_value());
  EXPECT_EQ(malformed.error().code, Errc::kInvalidArgument);

  // Past its expiry the record is still there until swept, but its answer is never opened again.
  clock_.Advance(kRetention);
  auto expired = engine_->Lookup(alice, policy_, "lookup-0001");
  ASSERT_TRUE(expired.has_value() && expired->has_value());
  EXPECT_TRUE((*expired)->expired);
  EXPECT_FALSE((*expired)->response.has_value());
}

// In-flight markers in memory: what the engine asks of any implementation, without Redis.
class MapMarkers final : public InFlightMarkers {
 public:
  Placement Place(const ScopeHash& scope, const InFlight& mine, Millis) override {
    MutexLock lock(mu_);
    auto [it, placed] = markers_.try_emplace(scope, mine, "token-" + std::to_string(++placed_));
    if (!placed) return Placement{std::nullopt, it->second.first};
    return Placement{it->second.second, std::nullopt};
  }
  void Release(const ScopeHash& scope, const MarkerToken& token) override {
    MutexLock lock(mu_);
    if (auto it = markers_.find(scope); it != markers_.end() && it->second.second == token) {
      markers_.erase(it);
    }
  }
  bool Has(const ScopeHash& scope) {
    MutexLock lock(mu_);
    return markers_.count(scope) > 0;
  }

 private:
  Mutex mu_;
  int placed_ IDEM_GUARDED_BY(mu_) = 0;
  std::map<ScopeHash, std::pair<InFlight, MarkerToken>> markers_ IDEM_GUARDED_BY(mu_);
};

TEST_F(EngineTest, OnlyTheRequestThatPlacedAMarkerRemovesIt) {
  MapMarkers markers;
  Engine engine(*store_, *fingerprinter_, *sealer_, clock_, &markers);
  const ScopeHash scope = *Scope{"acme", "alice", policy_.route, "marker-0001"}.Hash();
  auto executor = engine.Start(policy_, Req("marker-0001"));
  ASSERT_TRUE(executor.has_value() && executor->kind == Decision::Kind::kExecute);
  EXPECT_EQ(executor->ticket.marker, "token-1");
  // A duplicate is turned away on the marker; a different request reaches the database (422).
  auto duplicate = engine.Start(policy_, Req("marker-0001"));
  ASSERT_TRUE(duplicate.has_value());
  EXPECT_EQ(duplicate->kind, Decision::Kind::kInProgress);
  Timestamp expires{};
  auto mismatch = engine.Start(policy_, Req("marker-0001", R"({"amount":"2"})"), {}, &expires);
  ASSERT_FALSE(mismatch.has_value());
  EXPECT_EQ(mismatch.error().code, Errc::kFingerprintMismatch);
  EXPECT_EQ(expires, executor->key_expires);
  EXPECT_TRUE(markers.Has(scope)) << "someone else removed the executor's marker";
  ASSERT_TRUE(engine.Finish(executor->ticket, RecordState::kSucceeded, Created("p")).has_value());
  EXPECT_FALSE(markers.Has(scope)) << "the executor's finish removes its marker";

  // A request that places a marker but does not execute removes its own.
  clock_.Advance(kRetention);
  Decision next = MustStart(Req("marker-0001"));  // a new operation, by an engine without markers
  EXPECT_FALSE(markers.Has(scope));
  auto in_progress = engine.Start(policy_, Req("marker-0001"));
  ASSERT_TRUE(in_progress.has_value());
  EXPECT_EQ(in_progress->kind, Decision::Kind::kInProgress) << "the database said so";
  EXPECT_FALSE(markers.Has(scope)) << "it left the marker it placed";
  ASSERT_TRUE(engine_->Finish(next.ticket, RecordState::kSucceeded, Created("q")).has_value());
}

// The step between placing a marker and claiming (failpoint cache_after_marker): a request that
// fails there takes its marker with it and leaves no record, so its retry is not turned away by a
// marker nobody holds.
TEST_F(EngineTest, AFailureBetweenMarkerAndClaimRemovesTheMarker) {
  MapMarkers markers;
  Engine engine(*store_, *fingerprinter_, *sealer_, clock_, &markers);
  const ScopeHash scope = *Scope{"acme", "alice", policy_.route, "marker-0002"}.Hash();
  ASSERT_TRUE(ArmFailpoints("cache_after_marker=error").has_value());
  auto failed = engine.Start(policy_, Req("marker-0002"));
  // An engine without markers has no such step.
  Decision unmarked = MustStart(Req("marker-0003"));
  ClearFailpoints();
#if !defined(IDEM_NO_FAILPOINTS)
  ASSERT_FALSE(failed.has_value());
  EXPECT_EQ(failed.error().code, Errc::kUnavailable);
  EXPECT_FALSE(markers.Has(scope)) << "the failed request left its marker";
  EXPECT_FALSE(RecordOf("marker-0002").has_value()) << "it claimed after the failure";
#endif
  auto retry = engine.Start(policy_, Req("marker-0002"));
  ASSERT_TRUE(retry.has_value() && retry->kind == Decision::Kind::kExecute);
  ASSERT_TRUE(engine.Finish(retry->ticket, RecordState::kSucceeded, Created("p")).has_value());
  ASSERT_TRUE(engine_->Finish(unmarked.ticket, RecordState::kSucceeded, Created("q")).has_value());
}

// Forwards to a real store, except that reads of `from` return the record of `to`: a cache that
// answers for the wrong scope.
class MisroutingStore final : public StoreWrapper {
 public:
  MisroutingStore(Store& inner, ScopeHash from, ScopeHash to)
      : StoreWrapper(inner), from_(from), to_(to) {}
  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    return StoreWrapper::Read(scope == from_ ? to_ : scope);
  }

 private:
  ScopeHash from_, to_;
};

// A stored answer opens only under the scope it was sealed for, and the engine opens it with the
// scope of the request, never with the scope of the record a store returned.
TEST_F(EngineTest, AStoredAnswerOpensOnlyUnderTheRequestedScope) {
  const Principal alice{"acme", "alice"};
  Decision x = MustStart(Req("scope-x-0001"));
  ASSERT_TRUE(engine_->Finish(x.ticket, RecordState::kSucceeded, Created("pay_x")).has_value());
  const ScopeHash y = *Scope{"acme", "alice", policy_.route, "scope-y-0001"}.Hash();

  // A store that serves X's record for Y: the same user and body fingerprint alike, so only the
  // seal tells them apart.
  MisroutingStore misrouting(*store_, y, x.ticket.scope);
  Engine engine(misrouting, *fingerprinter_, *sealer_, clock_);
  auto replay = engine.Start(policy_, Req("scope-y-0001"));
  ASSERT_FALSE(replay.has_value()) << "X's answer was replayed for Y";
  EXPECT_EQ(replay.error().code, Errc::kDataLoss);
  auto looked_up = engine.Lookup(alice, policy_, "scope-y-0001");
  ASSERT_FALSE(looked_up.has_value());
  EXPECT_EQ(looked_up.error().code, Errc::kDataLoss);
  EXPECT_EQ(engine.Lookup(y).error().code, Errc::kDataLoss);

  // A sealed answer moved into another record's row does not open either.
  Decision y_run = MustStart(Req("scope-y-0001"));
  ASSERT_TRUE(engine_->Finish(y_run.ticket, RecordState::kSucceeded, Created("pay_y")).has_value());
  {
    auto txn = std::move(*store_->Begin());
    ASSERT_TRUE(txn->Exec("UPDATE idem_records SET response = (SELECT response FROM idem_records "
                          "WHERE scope_hash = ?) WHERE scope_hash = ?",
                          {Blob{std::string(x.ticket.scope.begin(), x.ticket.scope.end())},
                           Blob{std::string(y.begin(), y.end())}})
                    .has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  auto moved = engine_->Lookup(alice, policy_, "scope-y-0001");
  ASSERT_FALSE(moved.has_value());
  EXPECT_EQ(moved.error().code, Errc::kDataLoss);
  EXPECT_EQ(StartError(Req("scope-y-0001")), Errc::kDataLoss);
}

// Waits, in real time and bounded, until `done()` holds: for what a heartbeat's own thread does.
template <typename Predicate>
bool Eventually(Predicate done) {
  for (int i = 0; i < 5000 && !done(); ++i) std::this_thread::sleep_for(Millis(1));
  return done();
}

// A store whose transactions can be made to fail as they do when the database is unreachable.
class FlakyStore final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  std::atomic<bool> down{false};
  Result<std::unique_ptr<StoreTxn>> Begin() override {
    if (down) return MakeError(Errc::kUnavailable, "no database connection within 5000 ms");
    return StoreWrapper::Begin();
  }
};

TEST_F(EngineTest, AdvanceBeforeCallRenewsTheLeaseAndNeedsItToCoverTheCall) {
  Decision d = MustStart(Req("cover-key-001"), InsertPending("pay_c1"));
  EXPECT_EQ(d.ticket.lease_ttl, kLease);
  clock_.Advance(kLease - Millis(1000));  // one second of the claim's lease left
  // The step renews first, so a call as long as the whole lease is covered...
  ASSERT_TRUE(engine_->AdvanceBeforeCall(d.ticket, "charge_sent", kLease).has_value());
  EXPECT_EQ(ToUnixMillis(d.ticket.lease.until), ToUnixMillis(clock_.Now() + kLease));
  EXPECT_EQ(ToUnixMillis(RecordOf("cover-key-001").value().lease.until),
            ToUnixMillis(clock_.Now() + kLease));
  EXPECT_EQ(RecordOf("cover-key-001").value().recovery_point, "charge_sent");
  // ...and one a millisecond longer never is: a distinct error, nothing written, lease kept.
  clock_.Advance(Millis(2000));
  const Timestamp held_until = d.ticket.lease.until;
  auto refused = engine_->AdvanceBeforeCall(d.ticket, "second_call", kLease + Millis(1));
  ASSERT_FALSE(refused.has_value()) << "advanced under a lease that cannot cover the call";
  EXPECT_EQ(refused.error().code, Errc::kConflict) << refused.error().message;
  EXPECT_EQ(RecordOf("cover-key-001").value().recovery_point, "charge_sent");
  EXPECT_EQ(ToUnixMillis(RecordOf("cover-key-001").value().lease.until), ToUnixMillis(held_until));
  EXPECT_EQ(ToUnixMillis(d.ticket.lease.until), ToUnixMillis(held_until));
  ASSERT_TRUE(engine_->Finish(d.ticket, RecordState::kSucceeded, Created("pay_c1")).has_value());
  EXPECT_EQ(engine_->AdvanceBeforeCall(d.ticket, "charge_sent", Millis(0)).error().code,
            Errc::kFenced);
}

TEST_F(EngineTest, AHeartbeatKeepsALongExecutionsLeaseAlive) {
  Decision d = MustStart(Req("beat-key-001"), InsertPending("pay_b1"));
  ASSERT_TRUE(engine_->AdvanceBeforeCall(d.ticket, "charge_sent", kLease / 2).has_value());
  Heartbeat heartbeat(*engine_, d.ticket, monotonic_, {.poll = Millis(1)});
  // The executor is blocked in its call; twice the lease passes, a third of it at a time, and
  // the heartbeat's thread renews on its own.
  for (int beat = 1; beat <= 6; ++beat) {
    clock_.Advance(kLease / 3);
    monotonic_.Advance(kLease / 3);
    ASSERT_TRUE(Eventually([&] { return heartbeat.Renewals() == beat; }))
        << "beat " << beat << ": " << heartbeat.Renewals() << " renewals";
    EXPECT_EQ(ToUnixMillis(RecordOf("beat-key-001").value().lease.until),
              ToUnixMillis(clock_.Now() + kLease));
  }
  EXPECT_TRUE(heartbeat.Check().has_value());
  // Nobody took the record over, and the executor may take its next step with its own ticket.
  EXPECT_EQ(MustStart(Req("beat-key-001")).kind, Decision::Kind::kInProgress);
  EXPECT_TRUE(engine_->AdvanceBeforeCall(d.ticket, "charge_sent", kLease / 2).has_value());
}

TEST_F(EngineTest, AFencedRenewalStopsTheExecutorBeforeItsNextCall) {
  Decision d = MustStart(Req("beat-key-002"), InsertPending("pay_b2"));
  Heartbeat heartbeat(*engine_, d.ticket, monotonic_, {.poll = Millis(1)});
  // The executor's process stalls, heartbeat included: the lease runs out and is taken over.
  clock_.Advance(kLease + Millis(1));
  Decision taker = MustStart(Req("beat-key-002"));
  ASSERT_EQ(taker.kind, Decision::Kind::kExecute);
  ASSERT_TRUE(taker.ticket.resumed);
  // It wakes up: the renewal due now is fenced, and the check before the next call says so.
  monotonic_.Advance(kLease / 3);
  auto verdict = heartbeat.Check();
  ASSERT_FALSE(verdict.has_value()) << "a taken-over executor was told to go on";
  EXPECT_EQ(verdict.error().code, Errc::kFenced) << verdict.error().message;
  EXPECT_EQ(heartbeat.Renewals(), 0);
  EXPECT_EQ(RecordOf("beat-key-002").value().lease.owner, taker.ticket.lease.owner);
  EXPECT_EQ(ToUnixMillis(RecordOf("beat-key-002").value().lease.until),
            ToUnixMillis(taker.ticket.lease.until))
      << "the taker's lease stands";
}

TEST_F(EngineTest, AHeartbeatThatCannotReachTheStoreStopsForGood) {
  FlakyStore flaky(*store_);
  Engine engine(flaky, *fingerprinter_, *sealer_, clock_);
  auto started = engine.Start(policy_, Req("beat-key-003"), InsertPending("pay_b3"));
  ASSERT_TRUE(started.has_value()) << started.error().message;
  Heartbeat heartbeat(engine, started->ticket, monotonic_, {.poll = Millis(1)});
  clock_.Advance(kLease / 3);
  monotonic_.Advance(kLease / 3);
  ASSERT_TRUE(heartbeat.Check().has_value());
  EXPECT_EQ(heartbeat.Renewals(), 1);
  const Timestamp renewed_until = RecordOf("beat-key-003").value().lease.until;

  flaky.down = true;
  clock_.Advance(kLease / 3);
  monotonic_.Advance(kLease / 3);
  auto verdict = heartbeat.Check();
  ASSERT_FALSE(verdict.has_value())
      << "the executor was told to go on under a lease nobody renewed";
  EXPECT_EQ(verdict.error().code, Errc::kUnavailable) << verdict.error().message;
  // The store comes back; the heartbeat does not: the lease may have run out in between.
  flaky.down = false;
  clock_.Advance(kLease / 3);
  monotonic_.Advance(kLease / 3);
  EXPECT_EQ(heartbeat.Check().error().code, Errc::kUnavailable);
  EXPECT_EQ(heartbeat.Renewals(), 1);
  EXPECT_EQ(ToUnixMillis(RecordOf("beat-key-003").value().lease.until),
            ToUnixMillis(renewed_until));
}

// What a coroutine on an I/O thread asks before it sends without a hop to the store's threads:
// the lease held, nothing due; once a renewal is due it is told to go and make it (Check), and a
// failed renewal is reported at once, without anything due.
TEST_F(EngineTest, AHeartbeatCheckedWithoutRenewingSaysWhenARenewalIsDue) {
  FlakyStore flaky(*store_);
  Engine engine(flaky, *fingerprinter_, *sealer_, clock_);
  auto started = engine.Start(policy_, Req("beat-key-005"), InsertPending("pay_b5"));
  ASSERT_TRUE(started.has_value()) << started.error().message;
  Heartbeat heartbeat(engine, started->ticket, monotonic_, {.own_thread = false});
  auto fresh = heartbeat.CheckIfNothingDue();
  ASSERT_TRUE(fresh.has_value()) << "nothing is due right after the claim";
  EXPECT_TRUE(fresh->has_value());

  monotonic_.Advance(heartbeat.Interval() - Millis(1));
  EXPECT_TRUE(heartbeat.CheckIfNothingDue().has_value());
  monotonic_.Advance(Millis(1));
  EXPECT_FALSE(heartbeat.CheckIfNothingDue().has_value()) << "a due renewal was skipped";
  EXPECT_EQ(heartbeat.Renewals(), 0) << "checking without renewing renewed";
  ASSERT_TRUE(heartbeat.Check().has_value());
  EXPECT_EQ(heartbeat.Renewals(), 1);
  ASSERT_TRUE(heartbeat.CheckIfNothingDue().has_value()) << "the renewal made is not seen";

  flaky.down = true;
  monotonic_.Advance(heartbeat.Interval());
  ASSERT_FALSE(heartbeat.Check().has_value());
  auto failed = heartbeat.CheckIfNothingDue();
  ASSERT_TRUE(failed.has_value()) << "a failed renewal sent the caller to renew again";
  ASSERT_FALSE(failed->has_value()) << "a failed renewal read as a held lease";
  EXPECT_EQ(failed->error().code, Errc::kUnavailable);
}

TEST_F(EngineTest, TheHeartbeatFailpointFailsARenewal) {
  Decision d = MustStart(Req("beat-key-004"));
  Heartbeat heartbeat(*engine_, d.ticket, monotonic_, {.poll = Millis(1)});
  ASSERT_TRUE(ArmFailpoints("heartbeat=error").has_value());
  monotonic_.Advance(kLease / 3);
  auto verdict = heartbeat.Check();
  ClearFailpoints();
#if defined(IDEM_NO_FAILPOINTS)
  EXPECT_TRUE(verdict.has_value());
#else
  ASSERT_FALSE(verdict.has_value());
  EXPECT_EQ(verdict.error().code, Errc::kUnavailable);
#endif
}

// A transaction that forwards to a real one, except that the record is deleted just before the
// first Reclaim: what a sweeper on another connection does when its delete commits between the
// claim's read of an expiring record and the reclaim (PostgreSQL; SQLite's write lock orders
// them).
class SweptBeforeReclaimTxn final : public StoreTxnWrapper {
 public:
  using StoreTxnWrapper::StoreTxnWrapper;

  Result<Record> Reclaim(const ClaimSpec& spec, int64_t seen_fence) override {
    if (!swept_) {
      swept_ = true;
      IDEM_RETURN_IF_ERROR(
          target().Exec("DELETE FROM idem_records WHERE scope_hash = ?",
                        {Blob{std::string(spec.scope.begin(), spec.scope.end())}}));
    }
    return StoreTxnWrapper::Reclaim(spec, seen_fence);
  }

 private:
  bool swept_ = false;
};

class SweptBeforeReclaimStore final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;

 private:
  std::unique_ptr<StoreTxn> WrapTxn(std::unique_ptr<StoreTxn> txn) override {
    return std::make_unique<SweptBeforeReclaimTxn>(std::move(txn));
  }
};

TEST_F(EngineTest, ARetryThatRacesTheSweeperExecutesAndIsNeverNotFound) {
  for (const Millis before_expiry : {Millis(1), Millis(0)}) {
    // A retryable failure at its last moment (a resume) and at its expiry (a new operation).
    const std::string key = "swept-key-" + std::to_string(before_expiry.count());
    Decision d = MustStart(Req(key));
    ASSERT_TRUE(
        engine_->Finish(d.ticket, RecordState::kFailedRetryable, {503, {}, "busy"}).has_value());
    clock_.Advance(kRetention - before_expiry);
    SweptBeforeReclaimStore swept(*store_);
    Engine engine(swept, *fingerprinter_, *sealer_, clock_);
    auto retry = engine.Start(policy_, Req(key));
    ASSERT_TRUE(retry.has_value()) << "the retry failed with " << ErrcName(retry.error().code)
                                   << ": " << retry.error().message;
    EXPECT_EQ(retry->kind, Decision::Kind::kExecute);
    EXPECT_EQ(ToUnixMillis(retry->key_expires), ToUnixMillis(clock_.Now() + kRetention));
    ASSERT_TRUE(RecordOf(key).has_value());
    EXPECT_EQ(RecordOf(key).value().state, RecordState::kProcessing);
    clock_.Advance(before_expiry - kRetention);
  }
}

}  // namespace
}  // namespace idem
