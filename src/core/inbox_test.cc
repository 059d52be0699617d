// src/core/inbox_test.cc — the Inbox on real stores (a SQLite file, PostgreSQL): each message's
// effect exactly once, whatever is delivered twice, crashes or runs at once. Instantiated per
// backend by inbox_sqlite_test.cc and inbox_postgres_itest.cc (src/core/inbox_suite.h).
#include "idem/inbox.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <future>
#include <random>
#include <stdexcept>
#include <thread>

#include "idem/failpoint.h"
#include "src/core/inbox_suite.h"
#include "testing/assert_ok.h"
#include "testing/services.h"

namespace idem::testing {

AppMigrations InboxTestTables() {
  return {"inbox_test",
          {{1, "CREATE TABLE inbox_orders (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)"},
           {2,
            "CREATE TABLE inbox_shipments (id TEXT PRIMARY KEY, downstream_key TEXT NOT NULL, "
            "by_consumer TEXT NOT NULL)"}}};
}

void InboxTest::SetUp() {
  for (const std::string& variable : GetParam().services) {
    IDEM_NEED_SERVICE(ServiceUrl(variable), variable);
  }
  IDEM_ASSERT_OK_AND_ASSIGN(fingerprinter_, Fingerprinter::Create({{1, std::string(32, 'h')}}, 1));
  IDEM_ASSERT_OK_AND_ASSIGN(sealer_, Sealer::Create({{1, std::string(32, 's')}}, 1, env_.random));
  policy_.lease = Millis(10'000);
  policy_.retention = Millis(24LL * 3600 * 1000);
  ASSERT_NO_FATAL_FAILURE(OpenConsumer(main_, policy_));
}

void InboxTest::OpenConsumer(Consumer& consumer, const InboxPolicy& policy) {
  IDEM_ASSERT_OK_AND_ASSIGN(consumer.store, GetParam().open(env_));
  consumer.engine =
      std::make_unique<Engine>(*consumer.store, *fingerprinter_, *sealer_, env_.clock);
  IDEM_ASSERT_OK_AND_ASSIGN(Inbox inbox, Inbox::Create(*consumer.engine, policy));
  consumer.inbox.emplace(std::move(inbox));
}

namespace {

using Kind = InboxOutcome::Kind;

std::string OrderJson(std::string_view id, int amount) {
  return R"({"order":")" + std::string(id) + R"(","amount":)" + std::to_string(amount) + "}";
}

// A message keyed by its payload's "order" member, as a producer of orders would publish it.
InboxMessage Order(std::string_view id, int amount) {
  auto message = InboxMessage::KeyedByJson(OrderJson(id, amount), "/order");
  EXPECT_TRUE(message.has_value()) << message.error().message;
  return message ? std::move(*message) : InboxMessage{};
}

std::string Describe(const InboxOutcome& outcome) {
  return std::string(InboxOutcomeName(outcome.kind)) +
         (outcome.error ? ": " + outcome.error->message : std::string());
}

// A handler that stores the order (its amount: the payload's length, which tells payloads apart)
// and counts its runs.
InboxHandler StoreOrder(std::atomic<int>& runs) {
  return [&runs](InboxTxn& txn) -> Result<std::string> {
    ++runs;
    IDEM_RETURN_IF_ERROR(txn.Exec("INSERT INTO inbox_orders (id, amount) VALUES (?, ?)",
                                  {txn.Key(), static_cast<int64_t>(txn.Message().payload.size())}));
    return "stored " + txn.Key();
  };
}

// How many rows of `table` have id `id`; -1, failing the test, when they cannot be counted.
int64_t Rows(Store& store, const std::string& table, const std::string& id) {
  auto rows = store.Query("SELECT count(*) FROM " + table + " WHERE id = ?", {id});
  if (!rows || rows->size() != 1 || !std::holds_alternative<int64_t>(rows->at(0).at(0))) {
    ADD_FAILURE() << "no count of " << table << " " << id
                  << (rows ? "" : ": " + rows.error().message);
    return -1;
  }
  return std::get<int64_t>(rows->at(0)[0]);
}

// A store that counts the transactions begun and committed through it.
class CountingTxn final : public StoreTxnWrapper {
 public:
  CountingTxn(std::unique_ptr<StoreTxn> txn, std::atomic<int>& commits)
      : StoreTxnWrapper(std::move(txn)), commits_(commits) {}

 protected:
  Status Around(StoreOperation operation, const ForwardedCall& call) override {
    Status done = call();
    if (done && operation == StoreOperation::kCommit) ++commits_;
    return done;
  }

 private:
  std::atomic<int>& commits_;
};

class CountingStore final : public StoreWrapper {
 public:
  explicit CountingStore(Store& target) : StoreWrapper(target) {}
  std::atomic<int> begins{0};
  std::atomic<int> commits{0};

 protected:
  Status Around(StoreOperation operation, const ForwardedCall& call) override {
    if (operation == StoreOperation::kBegin) ++begins;
    return call();
  }
  std::unique_ptr<StoreTxn> WrapTxn(std::unique_ptr<StoreTxn> txn) override {
    return std::make_unique<CountingTxn>(std::move(txn), commits);
  }
};

TEST_P(InboxTest, AMessageDeliveredTwiceRunsOnceAndTheCopyIsADuplicateWithTheFirstResult) {
  std::atomic<int> runs{0};
  const InboxOutcome executed = main_.inbox->Process(Order("A-1001", 25), StoreOrder(runs));
  ASSERT_EQ(executed.kind, Kind::kExecuted) << Describe(executed);
  EXPECT_TRUE(executed.Acknowledge());
  EXPECT_FALSE(executed.error);
  EXPECT_FALSE(executed.resumed);
  EXPECT_EQ(executed.key, "A-1001");
  EXPECT_EQ(executed.result, "stored A-1001");
  EXPECT_EQ(executed.key_expires, env_.clock.Now() + policy_.retention);

  env_.clock.Advance(Millis(5000));
  // The same delivery again, and a copy whose JSON says the same in other words.
  for (const std::string& payload :
       {OrderJson("A-1001", 25), std::string(R"({ "amount": 25.0, "order": "A-1001" })")}) {
    auto copy = InboxMessage::KeyedByJson(payload, "/order");
    ASSERT_TRUE(copy.has_value());
    const InboxOutcome again = main_.inbox->Process(*copy, StoreOrder(runs));
    EXPECT_EQ(again.kind, Kind::kDuplicate) << Describe(again);
    EXPECT_TRUE(again.Acknowledge()) << "a duplicate is acknowledged, never an error";
    EXPECT_FALSE(again.error);
    EXPECT_EQ(again.result, "stored A-1001");
    EXPECT_EQ(again.key_expires, executed.key_expires);
  }
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(Rows(*main_.store, "inbox_orders", "A-1001"), 1);
  auto found = IDEM_VALUE_OF(main_.inbox->Lookup("A-1001"));
  ASSERT_TRUE(found && found->has_value());
  EXPECT_EQ((*found)->record.state, RecordState::kSucceeded);
  EXPECT_EQ((*found)->record.route, "inbox.orders");
  EXPECT_EQ((*found)->record.user, "billing");
  ASSERT_TRUE((*found)->response.has_value());
  EXPECT_EQ((*found)->response->body, "stored A-1001");
}

TEST_P(InboxTest, TheSameKeyWithAnotherPayloadIsAMismatchAndDoesNotRun) {
  std::atomic<int> runs{0};
  ASSERT_EQ(main_.inbox->Process(Order("A-2001", 25), StoreOrder(runs)).kind, Kind::kExecuted);
  const InboxOutcome other = main_.inbox->Process(Order("A-2001", 99), StoreOrder(runs));
  EXPECT_EQ(other.kind, Kind::kMismatch) << Describe(other);
  EXPECT_FALSE(other.Acknowledge());
  ASSERT_TRUE(other.error.has_value());
  EXPECT_EQ(other.error->code, Errc::kFingerprintMismatch);
  EXPECT_TRUE(other.result.empty());
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(Rows(*main_.store, "inbox_orders", "A-2001"), 1);
  // The first payload is still the one the key answers for.
  EXPECT_EQ(main_.inbox->Process(Order("A-2001", 25), StoreOrder(runs)).kind, Kind::kDuplicate);
}

TEST_P(InboxTest, AHandlerErrorLeavesNothingAndTheNextDeliveryRunsIt) {
  const InboxMessage message = Order("A-3001", 25);
  const InboxHandler failing = [](InboxTxn& txn) -> Result<std::string> {
    IDEM_RETURN_IF_ERROR(
        txn.Exec("INSERT INTO inbox_orders (id, amount) VALUES (?, 1)", {txn.Key()}));
    return MakeError(Errc::kUnavailable, "the warehouse is closed");
  };
  const InboxHandler throwing = [](InboxTxn& txn) -> Result<std::string> {
    IDEM_RETURN_IF_ERROR(
        txn.Exec("INSERT INTO inbox_orders (id, amount) VALUES (?, 1)", {txn.Key()}));
    throw std::runtime_error("a bug");
  };
  const InboxOutcome failed = main_.inbox->Process(message, failing);
  EXPECT_EQ(failed.kind, Kind::kFailed) << Describe(failed);
  EXPECT_FALSE(failed.Acknowledge());
  ASSERT_TRUE(failed.error.has_value());
  EXPECT_EQ(failed.error->code, Errc::kUnavailable);
  EXPECT_EQ(failed.error->message, "the warehouse is closed");
  const InboxOutcome threw = main_.inbox->Process(message, throwing);
  EXPECT_EQ(threw.kind, Kind::kFailed) << Describe(threw);
  ASSERT_TRUE(threw.error.has_value());
  EXPECT_EQ(threw.error->code, Errc::kInternal);
  // Neither the business row nor the record.
  EXPECT_EQ(Rows(*main_.store, "inbox_orders", "A-3001"), 0);
  auto found = IDEM_VALUE_OF(main_.inbox->Lookup("A-3001"));
  ASSERT_TRUE(found.has_value());
  EXPECT_FALSE(found->has_value()) << "a failed handler left a record";

  std::atomic<int> runs{0};
  const InboxOutcome redelivered = main_.inbox->Process(message, StoreOrder(runs));
  EXPECT_EQ(redelivered.kind, Kind::kExecuted) << Describe(redelivered);
  EXPECT_FALSE(redelivered.resumed) << "nothing was left to resume";
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(Rows(*main_.store, "inbox_orders", "A-3001"), 1);
}

// A consumer process dies after its handler's writes, before their transaction commits: at the
// handler's own exit, and at the failpoint just before the commit. The redelivery, in this
// process, runs the message once; nothing of the dead one is left.
TEST_P(InboxTest, ACrashBeforeTheCommitLeavesNothingAndTheRedeliveryRunsOnce) {
  const InboxMessage message = Order("A-4001", 25);
  constexpr int kDiedInHandler = 77;
  std::vector<std::string> crashes = {"handler"};
#if !defined(IDEM_NO_FAILPOINTS)
  crashes.emplace_back("before_complete_commit");
#endif
  for (const std::string& crash : crashes) {
    SCOPED_TRACE(crash);
    const std::string ran = env_.dir.File("ran-" + crash);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child: a consumer process of its own on the same data.
      auto store = GetParam().open(env_);
      if (!store) _exit(2);
      Engine engine(**store, *fingerprinter_, *sealer_, env_.clock);
      auto inbox = Inbox::Create(engine, policy_);
      if (!inbox) _exit(3);
      if (crash != "handler" && !ArmFailpoints(crash + "=crash")) _exit(4);
      (void)inbox->Process(message, [&](InboxTxn& txn) -> Result<std::string> {
        if (!txn.Exec("INSERT INTO inbox_orders (id, amount) VALUES (?, 1)", {txn.Key()})) {
          _exit(5);
        }
        if (FILE* f = std::fopen(ran.c_str(), "w")) std::fclose(f);
        if (crash == "handler") _exit(kDiedInHandler);
        return std::string("stored by the child");
      });
      _exit(6);  // not reached: the child died before its commit
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), crash == "handler" ? kDiedInHandler : 86);
    EXPECT_EQ(access(ran.c_str(), F_OK), 0) << "the child's handler did not run";
    EXPECT_EQ(Rows(*main_.store, "inbox_orders", "A-4001"), 0);
    auto found = IDEM_VALUE_OF(main_.inbox->Lookup("A-4001"));
    ASSERT_TRUE(found.has_value());
    EXPECT_FALSE(found->has_value()) << "the dead consumer's record committed";
  }
  std::atomic<int> runs{0};
  const InboxOutcome redelivered = main_.inbox->Process(message, StoreOrder(runs));
  EXPECT_EQ(redelivered.kind, Kind::kExecuted) << Describe(redelivered);
  EXPECT_EQ(main_.inbox->Process(message, StoreOrder(runs)).kind, Kind::kDuplicate);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(Rows(*main_.store, "inbox_orders", "A-4001"), 1);
}

TEST_P(InboxTest, ABatchCommitsOnceAndRecognisesEveryKindOfCopy) {
  std::atomic<int> runs{0};
  ASSERT_EQ(main_.inbox->Process(Order("B-0", 10), StoreOrder(runs)).kind, Kind::kExecuted);
  CountingStore counting(*main_.store);
  Engine engine(counting, *fingerprinter_, *sealer_, env_.clock);
  IDEM_ASSERT_OK_AND_ASSIGN(Inbox inbox, Inbox::Create(engine, policy_));
  const std::vector<InboxMessage> batch = {
      Order("B-1", 10),                         // new
      Order("B-2", 20),                         // new
      Order("B-1", 10),                         // a copy of the first, in the same batch
      Order("B-0", 10),                         // processed before
      Order("B-2", 99),                         // B-2's key with another payload, in the batch
      Order("B-0", 11),                         // B-0's key with another payload
      InboxMessage::Keyed("bad\x01key", "{}"),  // a key no record can hold
      InboxMessage::Keyed("B-3", "not json at all"),  // a payload that is not JSON
  };
  const std::vector<InboxOutcome> outcomes = inbox.ProcessBatch(batch, StoreOrder(runs));
  ASSERT_EQ(outcomes.size(), batch.size());
  const std::vector<Kind> expected = {Kind::kExecuted,  Kind::kExecuted, Kind::kDuplicate,
                                      Kind::kDuplicate, Kind::kMismatch, Kind::kMismatch,
                                      Kind::kInvalid,   Kind::kInvalid};
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(outcomes[i].kind, expected[i]) << i << ": " << Describe(outcomes[i]);
    EXPECT_EQ(outcomes[i].key, batch[i].key);
  }
  EXPECT_EQ(outcomes[2].result, "stored B-1");
  EXPECT_EQ(outcomes[3].result, "stored B-0");
  EXPECT_EQ(runs, 3) << "B-0 before, B-1 and B-2 in the batch";
  for (const char* id : {"B-0", "B-1", "B-2"}) {
    EXPECT_EQ(Rows(*main_.store, "inbox_orders", id), 1) << id;
  }
  EXPECT_EQ(Rows(*main_.store, "inbox_orders", "B-3"), 0);
  EXPECT_EQ(counting.begins, 1);
  EXPECT_EQ(counting.commits, 1);
}

TEST_P(InboxTest, ABatchWhoseHandlerFailsFallsBackAndTheOthersStillCommit) {
  CountingStore counting(*main_.store);
  Engine engine(counting, *fingerprinter_, *sealer_, env_.clock);
  IDEM_ASSERT_OK_AND_ASSIGN(Inbox inbox, Inbox::Create(engine, policy_));
  std::atomic<int> runs{0};
  const InboxHandler store = StoreOrder(runs);
  const InboxHandler handler = [&](InboxTxn& txn) -> Result<std::string> {
    if (txn.Key() == "C-2") {
      IDEM_RETURN_IF_ERROR(
          txn.Exec("INSERT INTO inbox_orders (id, amount) VALUES (?, 1)", {txn.Key()}));
      return MakeError(Errc::kInvalidArgument, "the amount is refused");
    }
    return store(txn);
  };
  const std::vector<InboxMessage> batch = {Order("C-1", 1), Order("C-2", 2), Order("C-3", 3)};
  const std::vector<InboxOutcome> outcomes = inbox.ProcessBatch(batch, handler);
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_EQ(outcomes[0].kind, Kind::kExecuted) << Describe(outcomes[0]);
  EXPECT_EQ(outcomes[1].kind, Kind::kFailed) << Describe(outcomes[1]);
  ASSERT_TRUE(outcomes[1].error.has_value());
  EXPECT_EQ(outcomes[1].error->message, "the amount is refused");
  EXPECT_EQ(outcomes[2].kind, Kind::kExecuted) << Describe(outcomes[2]);
  EXPECT_EQ(Rows(*main_.store, "inbox_orders", "C-1"), 1);
  EXPECT_EQ(Rows(*main_.store, "inbox_orders", "C-2"), 0);
  EXPECT_EQ(Rows(*main_.store, "inbox_orders", "C-3"), 1);
  auto found = IDEM_VALUE_OF(inbox.Lookup("C-2"));
  ASSERT_TRUE(found.has_value());
  EXPECT_FALSE(found->has_value());
  // The batch's transaction and one per message; the batch's and C-2's own rolled back.
  EXPECT_EQ(counting.begins, 4);
  EXPECT_EQ(counting.commits, 2);
  // Each message again: C-1 and C-3 are duplicates, C-2 runs (and fails) again.
  const std::vector<InboxOutcome> again = inbox.ProcessBatch(batch, handler);
  EXPECT_EQ(again[0].kind, Kind::kDuplicate) << Describe(again[0]);
  EXPECT_EQ(again[1].kind, Kind::kFailed) << Describe(again[1]);
  EXPECT_EQ(again[2].kind, Kind::kDuplicate) << Describe(again[2]);
}

TEST_P(InboxTest, MalformedMessagesAreInvalidAndNeverRun) {
  std::atomic<int> runs{0};
  InboxPolicy small = policy_;
  small.rules.max_bytes = 64;
  Consumer limited;
  ASSERT_NO_FATAL_FAILURE(OpenConsumer(limited, small));
  for (const InboxMessage& message :
       {InboxMessage::Keyed("tab\tin key", "{}"), InboxMessage::Keyed(std::string(256, 'k'), "{}"),
        InboxMessage::Keyed("", "{}"), InboxMessage::Keyed("D-1", "{\"amount\":"),
        InboxMessage::Keyed("D-2", "{\"pad\":\"" + std::string(100, 'x') + "\"}")}) {
    const InboxOutcome outcome = limited.inbox->Process(message, StoreOrder(runs));
    EXPECT_EQ(outcome.kind, Kind::kInvalid) << message.key << ": " << Describe(outcome);
    EXPECT_FALSE(outcome.Acknowledge());
    EXPECT_TRUE(outcome.error.has_value());
  }
  EXPECT_EQ(runs, 0);
  // A business key may be a single character, and may hold what an HTTP key may not.
  for (const char* key : {"7", "order/17@eu", "\"quoted\\key\""}) {
    const InboxOutcome outcome =
        limited.inbox->Process(InboxMessage::Keyed(key, "{}"), StoreOrder(runs));
    EXPECT_EQ(outcome.kind, Kind::kExecuted) << key << ": " << Describe(outcome);
    EXPECT_EQ(Rows(*main_.store, "inbox_orders", key), 1) << key;
    EXPECT_EQ(limited.inbox->Process(InboxMessage::Keyed(key, "{}"), StoreOrder(runs)).kind,
              Kind::kDuplicate);
  }
  EXPECT_EQ(runs, 3);
}

TEST_P(InboxTest, CreateRefusesAPolicyThatCannotMakeRecords) {
  auto refused = [&](const InboxPolicy& policy) {
    auto inbox = Inbox::Create(*main_.engine, policy);
    return !inbox.has_value() && inbox.error().code == Errc::kInvalidArgument;
  };
  InboxPolicy p = policy_;
  p.group = "";
  EXPECT_TRUE(refused(p));
  p = policy_;
  p.name = std::string(limits::kRouteMaxLength, 'n');
  EXPECT_TRUE(refused(p));
  p = policy_;
  p.tenant = "a\x1f";
  EXPECT_TRUE(refused(p));
  p = policy_;
  p.key_policy.min_length = 0;
  EXPECT_TRUE(refused(p));
  p = policy_;
  p.retention = p.lease;
  EXPECT_TRUE(refused(p));
  p = policy_;
  p.max_result_bytes = limits::kSealedResponseCeiling + 1;
  EXPECT_TRUE(refused(p));
  p = policy_;
  p.max_result_bytes = limits::kSealedResponseCeiling;
  EXPECT_FALSE(refused(p));
}

TEST_P(InboxTest, AResultOverTheCapFailsAndLeavesNothing) {
  InboxPolicy small = policy_;
  small.max_result_bytes = 64;
  Consumer limited;
  ASSERT_NO_FATAL_FAILURE(OpenConsumer(limited, small));
  const InboxHandler big = [](InboxTxn& txn) -> Result<std::string> {
    IDEM_RETURN_IF_ERROR(
        txn.Exec("INSERT INTO inbox_orders (id, amount) VALUES (?, 1)", {txn.Key()}));
    return std::string(100, 'r');
  };
  const InboxOutcome outcome = limited.inbox->Process(Order("E-1", 1), big);
  EXPECT_EQ(outcome.kind, Kind::kFailed) << Describe(outcome);
  ASSERT_TRUE(outcome.error.has_value());
  EXPECT_EQ(outcome.error->code, Errc::kTooLarge);
  EXPECT_EQ(Rows(*main_.store, "inbox_orders", "E-1"), 0);
}

// Two consumers of one group, each on a store instance of its own: the first stalls with its
// call out, its lease runs out, the second takes the message over and finishes it; the first is
// fenced and nothing of its finish commits.
TEST_P(InboxTest, ATakeoverKeepsTheDownstreamKeyAndFencesTheConsumerThatStalled) {
  Consumer second;
  ASSERT_NO_FATAL_FAILURE(OpenConsumer(second, policy_));
  const InboxMessage message = Order("S-1", 5);
  std::promise<void> called, resume;
  std::string first_key;
  bool first_resumed = true;
  InboxOutcome first_outcome;
  std::thread first([&] {
    first_outcome =
        main_.inbox->ProcessWithCalls(message, [&](InboxCall& call) -> Result<std::string> {
          first_resumed = call.Resumed();
          Status covered = call.BeforeCall("ship", Millis(1000));
          if (!covered) {
            called.set_value();
            return Result<std::string>(std::move(covered).error());
          }
          first_key = call.DownstreamKey("ship");
          // ... the carrier is called with first_key here ...
          call.AtFinish([&](InboxTxn& txn) -> Status {
            IDEM_RETURN_IF_ERROR(
                txn.Exec("INSERT INTO inbox_shipments (id, downstream_key, by_consumer) VALUES (?, "
                         "?, 'first')",
                         {txn.Key(), first_key}));
            return Ok();
          });
          called.set_value();
          resume.get_future().wait();
          return Result<std::string>(std::string("shipped by the first"));
        });
  });
  called.get_future().wait();

  // While the first one's lease runs, the message is in progress elsewhere: not run.
  std::atomic<int> runs{0};
  const InboxOutcome busy =
      second.inbox->ProcessWithCalls(message, [&](InboxCall&) -> Result<std::string> {
        ++runs;
        return Result<std::string>(std::string("must not run"));
      });
  EXPECT_EQ(busy.kind, Kind::kInProgress) << Describe(busy);
  EXPECT_FALSE(busy.Acknowledge());
  EXPECT_GT(busy.retry_after, Millis(0));
  EXPECT_EQ(runs, 0);

  env_.clock.Advance(policy_.lease + Millis(1000));
  const InboxOutcome taken =
      second.inbox->ProcessWithCalls(message, [&](InboxCall& call) -> Result<std::string> {
        ++runs;
        EXPECT_TRUE(call.Resumed());
        EXPECT_EQ(call.RecoveryPoint(), "ship") << "the first one's call may have happened";
        const std::string key = call.DownstreamKey("ship");
        EXPECT_EQ(key, first_key);
        EXPECT_NE(call.DownstreamKey("invoice"), key);
        IDEM_RETURN_IF_ERROR(call.BeforeCall("ship", Millis(1000)));
        // ... the carrier is asked about `key` first, and called with it only if it has nothing ...
        call.AtFinish([key](InboxTxn& txn) -> Status {
          IDEM_RETURN_IF_ERROR(
              txn.Exec("INSERT INTO inbox_shipments (id, downstream_key, by_consumer) VALUES (?, "
                       "?, 'second')",
                       {txn.Key(), key}));
          return Ok();
        });
        return Result<std::string>(std::string("shipped by the second"));
      });
  EXPECT_EQ(taken.kind, Kind::kExecuted) << Describe(taken);
  EXPECT_TRUE(taken.resumed);
  EXPECT_EQ(taken.result, "shipped by the second");
  EXPECT_EQ(runs, 1);

  resume.set_value();
  first.join();
  EXPECT_FALSE(first_resumed);
  EXPECT_EQ(first_key.size(), 64u);
  EXPECT_EQ(first_key.find("S-1"), std::string::npos);
  EXPECT_EQ(first_outcome.kind, Kind::kFailed) << Describe(first_outcome);
  ASSERT_TRUE(first_outcome.error.has_value());
  EXPECT_EQ(first_outcome.error->code, Errc::kFenced);
  // The second's finish and its write, none of the first's.
  EXPECT_EQ(Rows(*main_.store, "inbox_shipments", "S-1"), 1);
  auto by = IDEM_VALUE_OF(
      main_.store->Query("SELECT by_consumer, downstream_key FROM inbox_shipments WHERE id = ?",
                         {std::string("S-1")}));
  ASSERT_TRUE(by && by->size() == 1);
  EXPECT_EQ(std::get<std::string>(by->at(0).at(0)), "second");
  EXPECT_EQ(std::get<std::string>(by->at(0).at(1)), first_key);
  const InboxOutcome copy =
      main_.inbox->ProcessWithCalls(message, [&](InboxCall&) -> Result<std::string> {
        ++runs;
        return Result<std::string>(std::string("must not run"));
      });
  EXPECT_EQ(copy.kind, Kind::kDuplicate) << Describe(copy);
  EXPECT_EQ(copy.result, "shipped by the second");
  EXPECT_EQ(runs, 1);
}

TEST_P(InboxTest, BeforeCallRefusesACallTheLeaseCannotCoverAndTheNextDeliveryResumes) {
  const InboxMessage message = Order("S-2", 5);
  std::atomic<int> calls{0};
  const InboxOutcome refused =
      main_.inbox->ProcessWithCalls(message, [&](InboxCall& call) -> Result<std::string> {
        EXPECT_FALSE(call.Resumed());
        Status bad_name = call.BeforeCall("done", Millis(1000));
        EXPECT_FALSE(bad_name.has_value());
        if (!bad_name) {
          EXPECT_EQ(bad_name.error().code, Errc::kInvalidArgument);
        }
        Status covered = call.BeforeCall("ship", policy_.lease + Millis(1));
        EXPECT_FALSE(covered.has_value());
        if (covered) return Result<std::string>(std::string("called"));
        return Result<std::string>(std::move(covered).error());  // no call without cover
      });
  EXPECT_EQ(refused.kind, Kind::kFailed) << Describe(refused);
  ASSERT_TRUE(refused.error.has_value());
  EXPECT_EQ(refused.error->code, Errc::kConflict);
  EXPECT_EQ(calls, 0);
  // Left PROCESSING, nothing recorded as sent, the lease released: the next delivery takes over
  // at once.
  auto found = IDEM_VALUE_OF(main_.inbox->Lookup("S-2"));
  ASSERT_TRUE(found && found->has_value());
  EXPECT_EQ((*found)->record.state, RecordState::kProcessing);
  EXPECT_EQ((*found)->record.recovery_point, "");
  EXPECT_FALSE((*found)->lease_left.has_value());

  const InboxOutcome resumed =
      main_.inbox->ProcessWithCalls(message, [&](InboxCall& call) -> Result<std::string> {
        EXPECT_TRUE(call.Resumed());
        EXPECT_EQ(call.RecoveryPoint(), "");
        IDEM_RETURN_IF_ERROR(call.BeforeCall("ship", Millis(1000)));
        ++calls;
        return Result<std::string>(std::string("shipped"));
      });
  EXPECT_EQ(resumed.kind, Kind::kExecuted) << Describe(resumed);
  EXPECT_TRUE(resumed.resumed);
  EXPECT_EQ(calls, 1);
}

// Threads of two consumer instances process the same messages, each several times over, one by
// one or in batches: each message's effect exactly once.
TEST_P(InboxTest, ConcurrentConsumersOfTheSameMessagesRunEachOnce) {
  constexpr int kThreads = 6;
  constexpr int kKeys = 24;
  constexpr int kRounds = 3;
  Consumer other;
  ASSERT_NO_FATAL_FAILURE(OpenConsumer(other, policy_));
  std::vector<InboxMessage> messages;
  for (int k = 0; k < kKeys; ++k) messages.push_back(Order("N-" + std::to_string(k), k));
  std::array<std::atomic<int>, kKeys> executed{};
  std::atomic<int> runs{0}, unexpected{0}, retries{0};
  const InboxHandler handler = StoreOrder(runs);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Inbox& inbox = t % 2 == 0 ? *main_.inbox : *other.inbox;
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int round = 0; round < kRounds; ++round) {
        std::vector<int> order(kKeys);
        for (int k = 0; k < kKeys; ++k) order[static_cast<std::size_t>(k)] = k;
        std::shuffle(order.begin(), order.end(), rng);
        const std::size_t step = t % 3 == 2 ? 4 : 1;  // every third thread in batches of four
        for (std::size_t at = 0; at < order.size(); at += step) {
          std::vector<int> keys(order.begin() + static_cast<std::ptrdiff_t>(at),
                                order.begin() + static_cast<std::ptrdiff_t>(at + step));
          std::vector<InboxMessage> batch;
          for (int k : keys) batch.push_back(messages[static_cast<std::size_t>(k)]);
          std::vector<InboxOutcome> outcomes = inbox.ProcessBatch(batch, handler);
          for (std::size_t i = 0; i < keys.size(); ++i) {
            // A store that is busy (a failure, nothing committed) is redelivered.
            for (int attempt = 0; outcomes[i].kind == Kind::kFailed && attempt < 50; ++attempt) {
              ++retries;
              std::this_thread::sleep_for(Millis(5));
              outcomes[i] = inbox.Process(batch[i], handler);
            }
            if (outcomes[i].kind == Kind::kExecuted) {
              ++executed[static_cast<std::size_t>(keys[i])];
            } else if (outcomes[i].kind != Kind::kDuplicate) {
              ++unexpected;
              ADD_FAILURE() << batch[i].key << ": " << Describe(outcomes[i]);
            }
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(unexpected, 0);
  for (int k = 0; k < kKeys; ++k) {
    const std::string id = "N-" + std::to_string(k);
    EXPECT_EQ(executed[static_cast<std::size_t>(k)], 1) << id;
    EXPECT_EQ(Rows(*main_.store, "inbox_orders", id), 1) << id;
  }
  RecordProperty("retries", retries.load());
}

}  // namespace
}  // namespace idem::testing
