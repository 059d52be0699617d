// testing/faulty_store_test.cc — FaultyStore over the memory store and over a SQLite file: what
// each fault does to the data, that plans are exact and reproducible, and that the engine over a
// faulty store never answers two executions for one key.
#include "testing/faulty_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "idem/engine.h"
#include "idem/store/sqlite.h"
#include "testing/fakes.h"
#include "testing/memory_store.h"

namespace idem::testing {
namespace {

enum class Backend { kMemory, kSqlite };

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kMemory ? "Memory" : "Sqlite";
}
void PrintTo(Backend backend, std::ostream* os) {
  *os << (backend == Backend::kMemory ? "memory" : "sqlite");
}

// The wrapped store, on `clock` and `random`, its file (if any) in `dir`.
std::unique_ptr<Store> OpenInner(Backend backend, FakeClock& clock, Random& random,
                                 const TempDir& dir) {
  if (backend == Backend::kMemory) return MakeMemoryStore(clock, random);
  SqliteStoreOptions options;
  options.path = dir.File("idem.db");
  options.synchronous_full = false;
  auto store = OpenSqliteStore(options, clock, random);
  IDEM_CHECK(store.has_value());
  return std::move(*store);
}

ClaimSpec Spec(const std::string& key) {
  ClaimSpec spec;
  spec.scope = *Scope{"acme", "alice", "payments.create", key}.Hash();
  spec.tenant = "acme";
  spec.user = "alice";
  spec.route = "payments.create";
  spec.fingerprint.rules_version = 1;
  spec.fingerprint.secret_id = 7;
  spec.fingerprint.mac.fill(1);
  spec.lease_ttl = Millis(1000);
  spec.retention = Millis(60'000);
  return spec;
}

bool Injected(const Error& e) { return e.message.rfind("fault injected", 0) == 0; }

class FaultyStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { inner_ = OpenInner(GetParam(), clock_, random_, dir_); }

  // A faulty store over the test's store, its delays on the test's clock.
  std::unique_ptr<FaultyStore> Faulty(FaultPlan plan) {
    return std::make_unique<FaultyStore>(*inner_, FaultyStoreOptions{std::move(plan), &clock_, {}});
  }

  std::optional<Record> InnerRead(const ScopeHash& scope) {
    auto r = inner_->Read(scope);
    EXPECT_TRUE(r.has_value()) << r.error().message;
    return r ? *r : std::nullopt;
  }

  TempDir dir_;
  FakeClock clock_;
  SeededRandom random_{5};
  std::unique_ptr<Store> inner_;
};

INSTANTIATE_TEST_SUITE_P(Backends, FaultyStoreTest,
                         ::testing::Values(Backend::kMemory, Backend::kSqlite), BackendName);

TEST_P(FaultyStoreTest, AFailedBeforeCallChangesNothing) {
  const ClaimSpec spec = Spec("key-before-1");
  {
    // No transaction, and no write lock left held: the next Begin gets it at once.
    auto store = Faulty(FaultPlan::FailNthOf(StoreOperation::kBegin, 1, Fault::FailBefore()));
    auto refused = store->Begin();
    ASSERT_FALSE(refused.has_value());
    EXPECT_EQ(refused.error().code, Errc::kUnavailable);
    EXPECT_TRUE(Injected(refused.error())) << refused.error().message;
    EXPECT_TRUE(store->Begin().has_value());
  }
  {
    // A failed claim inserts nothing, even when its transaction commits.
    auto store = Faulty(FaultPlan::FailNthOf(StoreOperation::kClaim, 1, Fault::FailBefore()));
    auto txn = std::move(*store->Begin());
    auto claim = txn->Claim(spec);
    ASSERT_FALSE(claim.has_value());
    EXPECT_EQ(claim.error().code, Errc::kUnavailable);
    EXPECT_FALSE(txn->Get(spec.scope)->has_value());
    ASSERT_TRUE(txn->Commit().has_value());
    EXPECT_FALSE(InnerRead(spec.scope).has_value());
  }
  Lease lease;
  {
    // A failed advance leaves the point where it was; the rest of the transaction commits.
    auto store = Faulty(FaultPlan::FailNthOf(StoreOperation::kAdvance, 1, Fault::FailBefore()));
    auto txn = std::move(*store->Begin());
    auto claim = txn->Claim(spec);
    ASSERT_TRUE(claim.has_value() && claim->claimed);
    lease = claim->record.lease;
    EXPECT_EQ(txn->Advance(spec.scope, lease, "charge_sent", "pay_1").error().code,
              Errc::kUnavailable);
    ASSERT_TRUE(txn->Commit().has_value());
    auto stored = InnerRead(spec.scope);
    ASSERT_TRUE(stored.has_value());
    EXPECT_EQ(stored->recovery_point, "");
    EXPECT_EQ(stored->resource_id, "");
  }
  {
    // A failed commit commits nothing of its transaction.
    auto store = Faulty(FaultPlan::FailNthOf(StoreOperation::kCommit, 1, Fault::FailBefore()));
    auto txn = std::move(*store->Begin());
    ASSERT_TRUE(txn->Advance(spec.scope, lease, "charge_sent", "pay_1").has_value());
    auto commit = txn->Commit();
    ASSERT_FALSE(commit.has_value());
    EXPECT_EQ(commit.error().code, Errc::kUnavailable);
  }
  auto stored = InnerRead(spec.scope);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->recovery_point, "");
  {
    // A failed sweep deletes nothing.
    auto txn = std::move(*inner_->Begin());
    ASSERT_TRUE(txn->Finish(spec.scope, lease, {RecordState::kSucceeded, 201, "answer", "done"})
                    .has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  clock_.Advance(spec.retention);
  auto store = Faulty(FaultPlan::FailNthOf(StoreOperation::kSweep, 1, Fault::FailBefore()));
  EXPECT_EQ(store->Sweep(10, {}).error().code, Errc::kUnavailable);
  EXPECT_TRUE(InnerRead(spec.scope).has_value());
  EXPECT_EQ(*store->Sweep(10, {}), 1);
}

TEST_P(FaultyStoreTest, CommitThenFailLeavesTheDataCommitted) {
  const ClaimSpec spec = Spec("key-unknown-1");
  auto store = Faulty(FaultPlan::FailNthOf(StoreOperation::kCommit, 1, Fault::CommitThenFail()));
  Record claimed;
  {
    auto txn = std::move(*store->Begin());
    auto claim = txn->Claim(spec);
    ASSERT_TRUE(claim.has_value() && claim->claimed);
    claimed = claim->record;
    auto commit = txn->Commit();
    ASSERT_FALSE(commit.has_value());
    EXPECT_EQ(commit.error().code, Errc::kDeadlineExceeded) << commit.error().message;
  }  // dropped after the "failed" commit: nothing is rolled back
  auto stored = InnerRead(spec.scope);
  ASSERT_TRUE(stored.has_value()) << "the commit reported as failed did commit";
  EXPECT_EQ(stored->state, RecordState::kProcessing);
  EXPECT_EQ(stored->lease.owner, claimed.lease.owner);
  EXPECT_EQ(stored->lease.fence, claimed.lease.fence);

  // A sweep commits on its own: its deletions stand although it reports failure.
  {
    auto txn = std::move(*store->Begin());
    ASSERT_TRUE(
        txn->Finish(spec.scope, claimed.lease, {RecordState::kSucceeded, 201, "a", "done"}));
    ASSERT_TRUE(txn->Commit().has_value());
  }
  clock_.Advance(spec.retention);
  store->SetPlan(FaultPlan::FailNthOf(StoreOperation::kSweep, 1, Fault::CommitThenFail()));
  auto swept = store->Sweep(10, {});
  ASSERT_FALSE(swept.has_value());
  EXPECT_EQ(swept.error().code, Errc::kDeadlineExceeded);
  EXPECT_FALSE(InnerRead(spec.scope).has_value());
}

// A delay makes the call run later by the store's clock; an answer that comes late leaves the
// call on time and moves the clock after it: the claim's lease starts before the delay, and its
// caller learns of it that much later.
TEST_P(FaultyStoreTest, ADelayedCallRunsLateAndALateAnswerRanOnTime) {
  for (const Fault fault : {Fault::Delay(Millis(700)), Fault::AnswerLate(Millis(700))}) {
    const ClaimSpec spec = Spec(fault.kind == Fault::Kind::kDelay ? "key-delayed" : "key-late");
    auto store = Faulty(FaultPlan::FailNthOf(StoreOperation::kClaim, 1, fault));
    const Timestamp asked = clock_.Now();
    auto txn = store->Begin();
    ASSERT_TRUE(txn.has_value()) << txn.error().message;
    auto claimed = (*txn)->Claim(spec);
    ASSERT_TRUE(claimed.has_value()) << claimed.error().message;
    EXPECT_EQ(clock_.Now(), asked + Millis(700)) << "the caller learns 700 ms later either way";
    ASSERT_TRUE((*txn)->Commit().has_value());
    const std::optional<Record> r = InnerRead(spec.scope);
    ASSERT_TRUE(r.has_value());
    const Timestamp ran = fault.kind == Fault::Kind::kDelay ? asked + Millis(700) : asked;
    EXPECT_EQ(r->lease.until, ran + spec.lease_ttl);
  }
}

TEST_P(FaultyStoreTest, TheNthCallPlanHitsExactlyTheNthCall) {
  // Read, Begin, Claim, Get, Count, Commit, Read, Ping: eight calls.
  const std::vector<StoreOperation> ops = {StoreOperation::kRead,  StoreOperation::kBegin,
                                           StoreOperation::kClaim, StoreOperation::kGet,
                                           StoreOperation::kCount, StoreOperation::kCommit,
                                           StoreOperation::kRead,  StoreOperation::kPing};
  for (uint64_t n = 1; n <= ops.size(); ++n) {
    const ClaimSpec spec = Spec("key-nth-" + std::to_string(n));
    auto store = Faulty(FaultPlan::FailNth(n, Fault::FailBefore()));
    std::vector<bool> failed;
    auto note = [&](bool ok) { failed.push_back(!ok); };
    note(store->Read(spec.scope).has_value());
    auto txn = store->Begin();
    note(txn.has_value());
    if (txn) {
      note((*txn)->Claim(spec).has_value());
      note((*txn)->Get(spec.scope).has_value());
      note((*txn)->Count("acme", "alice", std::nullopt, 10).has_value());
      note((*txn)->Commit().has_value());
      txn = MakeError(Errc::kInternal, "dropped");
    }
    note(store->Read(spec.scope).has_value());
    note(store->Ping(Millis(100)).has_value());

    // Exactly call n failed; without a transaction (n = 2) its four calls were never made.
    std::vector<bool> expected(n == 2 ? ops.size() - 4 : ops.size(), false);
    expected[n == 2 ? 1 : n - 1] = true;
    EXPECT_EQ(failed, expected) << "n = " << n;
    EXPECT_EQ(store->Calls(), expected.size());
    const std::vector<InjectedFault> injected = store->Injected();
    ASSERT_EQ(injected.size(), 1u);
    EXPECT_EQ(injected[0].call.n, n);
    EXPECT_EQ(injected[0].call.op, ops[n - 1]);
    EXPECT_EQ(injected[0].fault, Fault::FailBefore());
  }
}

// The calls a fixed script makes and what each answered, for comparing runs.
struct Trace {
  std::vector<InjectedFault> injected;
  std::vector<std::string> answers;
  Millis delayed{0};
  bool operator==(const Trace&) const = default;
};

Trace RunScript(Backend backend, const FaultPlan& plan) {
  TempDir dir;
  FakeClock clock;
  SeededRandom random(9);
  auto inner = OpenInner(backend, clock, random, dir);
  const Timestamp start = clock.Now();
  FaultyStore store(*inner, FaultyStoreOptions{plan, &clock, {}});
  Trace trace;
  auto note = [&](const char* what, const auto& result) {
    trace.answers.push_back(std::string(what) + " " +
                            (result ? "ok" : std::string(ErrcName(result.error().code))));
  };
  for (int i = 0; i < 60; ++i) {
    if (i > 0 && i % 10 == 0) clock.Advance(Millis(1001));
    const ClaimSpec spec = Spec("key-script-" + std::to_string(i % 5));
    note("read", store.Read(spec.scope));
    auto txn = store.Begin();
    note("begin", txn);
    if (!txn) continue;
    auto claim = (*txn)->Claim(spec);
    note("claim", claim);
    if (claim && !claim->claimed) note("reclaim", (*txn)->Reclaim(spec, claim->record.lease.fence));
    note("count", (*txn)->Count("acme", "alice", RecordState::kProcessing, 100));
    note("commit", (*txn)->Commit());
  }
  trace.injected = store.Injected();
  trace.delayed = std::chrono::duration_cast<Millis>(clock.Now() - start) - Millis(5 * 1001);
  return trace;
}

TEST_P(FaultyStoreTest, TheSameSeedInjectsTheSameFaults) {
  const Trace first = RunScript(GetParam(), FaultPlan::FromSeed(7, 0.3));
  const Trace again = RunScript(GetParam(), FaultPlan::FromSeed(7, 0.3));
  EXPECT_EQ(first, again);
  EXPECT_NE(first.injected, RunScript(GetParam(), FaultPlan::FromSeed(8, 0.3)).injected);

  // Every kind of fault occurs, and the delays moved the store's clock by exactly their sum.
  std::map<Fault::Kind, int> kinds;
  Millis delays{0};
  for (const InjectedFault& f : first.injected) {
    ++kinds[f.fault.kind];
    delays += f.fault.delay;
    if (f.fault.kind == Fault::Kind::kCommitThenFail) {
      EXPECT_TRUE(f.call.op == StoreOperation::kCommit || f.call.op == StoreOperation::kSweep);
    }
  }
  EXPECT_GT(kinds[Fault::Kind::kFailBefore], 0);
  EXPECT_GT(kinds[Fault::Kind::kDelay], 0);
  EXPECT_GT(kinds[Fault::Kind::kAnswerLate], 0);
  EXPECT_GT(kinds[Fault::Kind::kCommitThenFail], 0);
  EXPECT_EQ(first.delayed, delays);
  EXPECT_TRUE(RunScript(GetParam(), FaultPlan()).injected.empty());
}

TEST_P(FaultyStoreTest, CallsFromManyThreadsAreEachCountedOnce) {
  auto store = Faulty(FaultPlan::FromSeed(3, 0.5, Millis(1)));
  constexpr int kThreads = 4;
  constexpr int kReads = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kReads; ++i) (void)store->Read(Spec("key-threads").scope);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(store->Calls(), uint64_t{kThreads * kReads});
  std::set<uint64_t> numbers;
  for (const InjectedFault& f : store->Injected()) EXPECT_TRUE(numbers.insert(f.call.n).second);
  EXPECT_GT(numbers.size(), 0u);
}

Request Req(const std::string& key) {
  Request r;
  r.principal = {"acme", "alice"};
  r.key_header = key;
  r.method = "POST";
  r.content_type = "application/json";
  r.api_version = "v1";
  r.body = R"({"amount":"100.00"})";
  return r;
}

bool OneOf(Errc code, std::initializer_list<Errc> codes) {
  return std::find(codes.begin(), codes.end(), code) != codes.end();
}

// Requests for a few keys through an engine whose store fails, delays and loses commit answers at
// random; some executors stall past their lease and finish late. An execution that the engine
// calls fresh (not resumed) never follows an earlier one, at most one finish of a key succeeds,
// and a key's answer never changes once given.
TEST_P(FaultyStoreTest, TheEngineNeverAnswersTwoExecutionsForOneKey) {
  auto fingerprinter = std::move(*Fingerprinter::Create({{1, std::string(32, 'h')}}, 1));
  auto sealer = std::move(*Sealer::Create({{1, std::string(32, 's')}}, 1, random_));
  RoutePolicy policy;
  policy.route = "payments.create";
  policy.lease = Millis(1000);
  policy.retention = Millis(24LL * 3600 * 1000);

  std::map<std::string, int> seen;  // what happened, over all seeds
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    FaultyStore store(*inner_,
                      FaultyStoreOptions{FaultPlan::FromSeed(seed, 0.2, Millis(700)), &clock_, {}});
    Engine engine(store, *fingerprinter, *sealer, clock_);
    std::mt19937_64 rng(seed);
    struct KeyState {
      int executions = 0;                   // downstream calls
      int64_t fence = 0;                    // the newest ticket's
      Timestamp until{};                    // and when its lease ends
      std::optional<std::string> finished;  // the body of the finish that answered Ok
      std::optional<std::string> answer;    // the body replayed
    };
    std::map<std::string, KeyState> keys;
    std::vector<std::pair<std::string, Ticket>> stalled;

    // An executor: a fresh ticket calls the downstream; a resumed one asks it first.
    auto execute = [&](const std::string& key, const Ticket& ticket) {
      KeyState& k = keys[key];
      if (!ticket.resumed) {
        EXPECT_EQ(k.executions, 0) << key << ": a fresh execution after an earlier one";
      }
      EXPECT_GT(ticket.lease.fence, k.fence) << key << ": a fence given twice";
      // A takeover (not a retry after a retryable failure) needs the last lease to have ended.
      if (ticket.resumed && ticket.resumed_from == RecordState::kProcessing && k.fence > 0) {
        EXPECT_LT(k.until, ticket.record.observed_at) << key << ": taken over from a live lease";
      }
      k.fence = ticket.lease.fence;
      k.until = ticket.lease.until;
      if (k.executions == 0) ++k.executions;
      ++seen[ticket.resumed ? "resumed execution" : "fresh execution"];
    };
    auto finish = [&](const std::string& key, const Ticket& ticket,
                      RecordState state = RecordState::kSucceeded) {
      const std::string body = key + " finished under fence " + std::to_string(ticket.lease.fence);
      Status s = engine.Finish(ticket, state, StoredResponse{201, {}, body});
      ++seen[s ? "finish ok" : "finish " + std::string(ErrcName(s.error().code))];
      if (s) {
        EXPECT_EQ(ticket.lease.fence, keys[key].fence) << key << ": finished after a takeover";
        if (state == RecordState::kSucceeded) {
          EXPECT_FALSE(keys[key].finished.has_value()) << key << ": finished twice";
          keys[key].finished = body;
        }
      } else {
        EXPECT_TRUE(
            OneOf(s.error().code, {Errc::kUnavailable, Errc::kDeadlineExceeded, Errc::kFenced}))
            << s.error().message;
      }
    };
    auto replayed = [&](const std::string& key, const Decision& d) {
      KeyState& k = keys[key];
      ++seen["replay"];
      EXPECT_EQ(k.executions, 1) << key;
      if (!k.answer) k.answer = d.response.body;
      EXPECT_EQ(d.response.body, *k.answer) << key << ": the answer changed";
      if (k.finished) {
        EXPECT_EQ(d.response.body, *k.finished) << key;
      }
    };

    for (int step = 0; step < 200; ++step) {
      if (!stalled.empty() && rng() % 3 == 0) {
        const std::size_t i = rng() % stalled.size();
        finish(stalled[i].first, stalled[i].second);
        stalled.erase(stalled.begin() + static_cast<std::ptrdiff_t>(i));
      }
      const std::string key = "key-seed-" + std::to_string(seed) + "-" + std::to_string(rng() % 5);
      auto d = engine.Start(policy, Req(key));
      if (!d) {
        EXPECT_TRUE(OneOf(d.error().code, {Errc::kUnavailable, Errc::kDeadlineExceeded}))
            << d.error().message;
      } else if (d->kind == Decision::Kind::kExecute) {
        execute(key, d->ticket);
        const uint64_t next = rng() % 8;
        if (next < 3) {
          stalled.emplace_back(key, d->ticket);  // finishes later, or is fenced
        } else {
          finish(key, d->ticket,
                 next == 3 ? RecordState::kFailedRetryable : RecordState::kSucceeded);
        }
      } else if (d->kind == Decision::Kind::kReplay) {
        replayed(key, *d);
      }
      if (rng() % 6 == 0) clock_.Advance(policy.lease + Millis(1));
    }

    // Without faults every key settles: the stalled executors wake (and are fenced, or finish),
    // what is left is taken over and finished, and then each key replays its one answer.
    store.SetPlan(FaultPlan());
    for (const auto& [key, ticket] : stalled) finish(key, ticket);
    clock_.Advance(policy.lease + Millis(1));
    for (const auto& [key, k] : keys) {
      auto d = engine.Start(policy, Req(key));
      ASSERT_TRUE(d.has_value()) << d.error().message;
      if (d->kind == Decision::Kind::kExecute) {
        execute(key, d->ticket);
        finish(key, d->ticket);
        d = engine.Start(policy, Req(key));
        ASSERT_TRUE(d.has_value()) << d.error().message;
      }
      ASSERT_EQ(d->kind, Decision::Kind::kReplay) << key;
      replayed(key, *d);
    }
    for (const InjectedFault& f : store.Injected()) {
      ++seen[std::string(StoreOperationName(f.call.op)) + " " +
             (f.fault.kind == Fault::Kind::kDelay        ? "delayed"
              : f.fault.kind == Fault::Kind::kAnswerLate ? "answered late"
              : f.fault.kind == Fault::Kind::kFailBefore ? "failed before"
                                                         : "committed then failed")];
    }
  }
  // The runs met what the invariants are about: takeovers of stalled executors, which then
  // wake and are fenced, and commits whose answer was lost.
  for (const char* what : {"fresh execution", "resumed execution", "finish ok", "finish fenced",
                           "finish unavailable", "finish deadline_exceeded", "replay",
                           "commit committed then failed", "commit failed before"}) {
    EXPECT_GT(seen[what], 0) << "never happened: " << what;
  }
}

// An answer the claim transaction reads (in progress, a mismatch) is given only after that
// transaction's Commit: a store that commits in groups may have shown it writes not yet durable.
// With the Commit failing, the engine answers the failure instead.
TEST_P(FaultyStoreTest, TheEngineAnswersFromTheClaimTransactionOnlyAfterItsCommit) {
  auto fingerprinter = std::move(*Fingerprinter::Create({{1, std::string(32, 'h')}}, 1));
  auto sealer = std::move(*Sealer::Create({{1, std::string(32, 's')}}, 1, random_));
  RoutePolicy policy;
  policy.route = "payments.create";
  policy.lease = Millis(10'000);
  // Commits 2 and 3 (the duplicate's and the mismatch's claim transactions) fail.
  auto store = Faulty(FaultPlan([](const StoreCall& call) {
    return call.op == StoreOperation::kCommit && call.n_of_op > 1 ? Fault::FailBefore()
                                                                  : Fault::Pass();
  }));
  Engine engine(*store, *fingerprinter, *sealer, clock_);
  const std::string key = "key-00001";  // Request::key_header views it
  auto first = engine.Start(policy, Req(key));
  ASSERT_TRUE(first.has_value()) << first.error().message;
  ASSERT_EQ(first->kind, Decision::Kind::kExecute);

  // Without the snapshot read first (which sees only committed records, and answers these two
  // from one), the claim transaction decides.
  auto duplicate = engine.Start(policy, Req(key), {}, nullptr, /*read_first=*/false);
  ASSERT_FALSE(duplicate.has_value()) << "answered in progress without a commit";
  EXPECT_TRUE(Injected(duplicate.error())) << duplicate.error().message;
  Request other = Req(key);
  other.body = R"({"amount":"200.00"})";
  auto mismatch = engine.Start(policy, other, {}, nullptr, /*read_first=*/false);
  ASSERT_FALSE(mismatch.has_value());
  EXPECT_TRUE(Injected(mismatch.error())) << mismatch.error().message;

  // With the commits passing again, the same requests get their answers.
  auto healthy = Faulty(FaultPlan());
  Engine again(*healthy, *fingerprinter, *sealer, clock_);
  auto in_progress = again.Start(policy, Req(key), {}, nullptr, /*read_first=*/false);
  ASSERT_TRUE(in_progress.has_value()) << in_progress.error().message;
  EXPECT_EQ(in_progress->kind, Decision::Kind::kInProgress);
  auto refused = again.Start(policy, other, {}, nullptr, /*read_first=*/false);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, Errc::kFingerprintMismatch);
}

}  // namespace
}  // namespace idem::testing
