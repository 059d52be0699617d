// testing/memory_store_test.cc — the memory store: the contract suite, what only it has (the
// write lock's wait, no SQL, shared data), and a differential test that runs the same random
// operations on it and on a SQLite file under one clock and compares every answer.
#include "testing/memory_store.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "idem/limits.h"
#include "idem/store/sqlite.h"
#include "testing/fakes.h"
#include "testing/store_contract.h"

namespace idem::testing {
namespace {

// Every store a test opens shares that test's data, as long as one of them is open (the data
// is not durable: once the last store and transaction on it are gone, so is it).
StoreFactory MemoryFactory() {
  auto data = std::make_shared<std::map<const StoreTestEnv*, std::weak_ptr<MemoryData>>>();
  return StoreFactory{"Memory", [=](StoreTestEnv& env) -> Result<std::unique_ptr<Store>> {
                        std::shared_ptr<MemoryData> shared = (*data)[&env].lock();
                        if (!shared) {
                          shared = NewMemoryData();
                          (*data)[&env] = shared;
                        }
                        return MakeMemoryStore(shared, env.clock, env.random);
                      }};
}

INSTANTIATE_TEST_SUITE_P(Memory, StoreContractTest, ::testing::Values(MemoryFactory()),
                         FactoryName);

ClaimSpec Spec(const std::string& key, const std::string& user = "alice",
               const std::string& route = "payments.create") {
  ClaimSpec spec;
  spec.scope = *Scope{"acme", user, route, key}.Hash();
  spec.tenant = "acme";
  spec.user = user;
  spec.route = route;
  spec.fingerprint.rules_version = 1;
  spec.fingerprint.secret_id = 7;
  spec.fingerprint.mac.fill(1);
  spec.lease_ttl = Millis(1000);
  spec.retention = Millis(5000);
  return spec;
}

TEST(MemoryStore, BeginWaitsForTheWriteLockThenGivesUp) {
  FakeClock clock;
  SeededRandom random(1);
  auto store = MakeMemoryStore(NewMemoryData(Millis(50)), clock, random);
  auto first = store->Begin();
  ASSERT_TRUE(first.has_value()) << first.error().message;
  auto second = store->Begin();
  ASSERT_FALSE(second.has_value());
  EXPECT_EQ(second.error().code, Errc::kUnavailable) << second.error().message;
  auto sweep = store->Sweep(10, {});
  ASSERT_FALSE(sweep.has_value()) << "a sweep writes: it waits for the write lock too";
  EXPECT_EQ(sweep.error().code, Errc::kUnavailable);
  // Reads and the readiness probe do not wait for writers.
  EXPECT_TRUE(store->Read(Spec("key-lock-1").scope).has_value());
  EXPECT_TRUE(store->Ping(Millis(10)).has_value());
  // Dropped on another thread than the one that began it, a transaction still lets go.
  std::thread([txn = std::move(*first)]() mutable { txn.reset(); }).join();
  EXPECT_TRUE(store->Begin().has_value());
}

TEST(MemoryStore, AWaitingBeginGetsTheLockWhenTheWriterCommits) {
  FakeClock clock;
  SeededRandom random(1);
  auto store = MakeMemoryStore(clock, random);
  auto writer = std::move(*store->Begin());
  ASSERT_TRUE(writer->Claim(Spec("key-waiter-1"))->claimed);
  std::thread waiter([&] {
    auto txn = store->Begin();
    ASSERT_TRUE(txn.has_value()) << txn.error().message;
    auto claim = (*txn)->Claim(Spec("key-waiter-1"));
    ASSERT_TRUE(claim.has_value());
    EXPECT_FALSE(claim->claimed) << "the waiter saw the writer's commit";
  });
  std::this_thread::sleep_for(Millis(20));
  ASSERT_TRUE(writer->Commit().has_value());
  waiter.join();
}

TEST(MemoryStore, RunsNoSql) {
  FakeClock clock;
  SeededRandom random(1);
  auto store = MakeMemoryStore(clock, random);
  EXPECT_FALSE(store->capabilities().business_sql);
  EXPECT_FALSE(store->capabilities().durable);
  EXPECT_EQ(store->Query("SELECT 1").error().code, Errc::kInvalidArgument);
  auto txn = std::move(*store->Begin());
  EXPECT_EQ(txn->Exec("SELECT 1", {}).error().code, Errc::kInvalidArgument);
}

// Every write is checked against the state machine; the contract suite above runs every legal
// path through the check, and these are refused with kInternal, not aborted on.
TEST(MemoryStore, RefusesAnIllegalTransition) {
  const Timestamp now = FromUnixMillis(1000);
  Record before;
  before.state = RecordState::kSucceeded;
  before.recovery_point = "done";
  before.expires_at = FromUnixMillis(2000);
  Record after = before;
  after.state = RecordState::kProcessing;
  const Status reclaimed = CheckTransition(before, after, now);
  ASSERT_FALSE(reclaimed.has_value()) << "an unexpired SUCCEEDED record claimed again";
  EXPECT_EQ(reclaimed.error().code, Errc::kInternal);
  EXPECT_EQ(reclaimed.error().message,
            "memory store: an illegal transition from SUCCEEDED at point 'done' to PROCESSING "
            "was refused");
  after.state = RecordState::kFailedRetryable;
  EXPECT_EQ(CheckTransition(before, after, now).error().code, Errc::kInternal)
      << "a finished record that is not a held outcome settled";
  EXPECT_EQ(CheckTransition(std::nullopt, before, now).error().code, Errc::kInternal)
      << "a record inserted finished";
  before.state = RecordState::kFailedFinal;
  before.recovery_point = std::string(kOutcomeUnknownPoint);
  EXPECT_TRUE(CheckTransition(before, after, now).has_value()) << "a held outcome settles";
  EXPECT_EQ(CheckTransition(before, after, FromUnixMillis(2000)).error().code, Errc::kInternal)
      << "an expired held outcome settled";
  after.state = RecordState::kProcessing;
  EXPECT_TRUE(CheckTransition(before, after, FromUnixMillis(2000)).has_value())
      << "an expired record becomes a new operation";
  EXPECT_TRUE(CheckTransition(std::nullopt, after, now).has_value()) << "a claim";
}

TEST(MemoryStore, StoresOnOneDataShareItAndOthersDoNot) {
  FakeClock clock;
  SeededRandom random(1);
  auto data = NewMemoryData();
  auto a = MakeMemoryStore(data, clock, random);
  auto b = MakeMemoryStore(data, clock, random);
  auto other = MakeMemoryStore(clock, random);
  const ClaimSpec spec = Spec("key-shared-1");
  {
    auto txn = std::move(*a->Begin());
    ASSERT_TRUE(txn->Claim(spec)->claimed);
    EXPECT_FALSE(b->Read(spec.scope)->has_value()) << "uncommitted writes are the writer's own";
    ASSERT_TRUE(txn->Commit().has_value());
  }
  auto seen = b->Read(spec.scope);
  ASSERT_TRUE(seen.has_value() && seen->has_value());
  EXPECT_EQ((*seen)->observed_at, clock.Now());
  EXPECT_FALSE(other->Read(spec.scope)->has_value());
}

// ---- The model against SQLite -----------------------------------------------------------------

std::string Hex(const uint8_t* p, std::size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[p[i] >> 4]);
    out.push_back(kDigits[p[i] & 15]);
  }
  return out;
}

// Every field, so two records compare as strings and a difference prints readably.
std::string Describe(const Record& r) {
  std::ostringstream os;
  os << "scope=" << Hex(r.scope.data(), 4) << " tenant=" << r.tenant << " user=" << r.user
     << " route=" << r.route << " fp=" << r.fingerprint.rules_version << "/"
     << r.fingerprint.secret_id << "/" << Hex(r.fingerprint.mac.data(), 4)
     << " state=" << RecordStateName(r.state) << " point=" << r.recovery_point
     << " resource=" << r.resource_id << " status=" << r.status_code << " response=" << r.response
     << " owner=" << Hex(r.lease.owner.data(), 4) << " fence=" << r.lease.fence
     << " until=" << ToUnixMillis(r.lease.until) << " created=" << ToUnixMillis(r.created_at)
     << " updated=" << ToUnixMillis(r.updated_at) << " expires=" << ToUnixMillis(r.expires_at)
     << " sent=" << ToUnixMillis(r.sent_at) << " observed=" << ToUnixMillis(r.observed_at);
  return os.str();
}

std::string Describe(const std::optional<Record>& r) { return r ? Describe(*r) : "none"; }
std::string Describe(const ClaimResult& c) {
  return std::string(c.claimed ? "claimed " : "exists ") + Describe(c.record);
}
std::string Describe(const Lease& l) {
  return "owner=" + Hex(l.owner.data(), 4) + " fence=" + std::to_string(l.fence) +
         " until=" + std::to_string(ToUnixMillis(l.until));
}
std::string Describe(int64_t n) { return std::to_string(n); }
std::string Describe(int n) { return std::to_string(n); }
std::string Describe(const std::vector<Record>& records) {
  std::string out;
  for (const Record& r : records) out += Describe(r) + "\n";
  return out;
}

template <typename T>
std::string Describe(const Result<T>& r) {
  if (!r)
    return std::string("error ") + std::string(ErrcName(r.error().code)) + ": " + r.error().message;
  if constexpr (std::is_void_v<T>) {
    return "ok";
  } else {
    return "ok " + Describe(*r);
  }
}

// What kind of answer a result is ("claimed", "fenced", "none", ...), to show the differential
// test reaches every outcome of every operation.
std::string Shape(const ClaimResult& c) { return c.claimed ? "claimed" : "exists"; }
std::string Shape(const std::optional<Record>& r) { return r ? "found" : "none"; }
std::string Shape(const std::vector<Record>& v) { return v.empty() ? "none" : "some"; }
std::string Shape(int n) { return n == 0 ? "none" : "some"; }
std::string Shape(int64_t n) { return n == 0 ? "none" : "some"; }
std::string Shape(const Lease&) { return "ok"; }
std::string Shape(const Record&) { return "ok"; }

template <typename T>
std::string Shape(const Result<T>& r) {
  if (!r) return std::string(ErrcName(r.error().code));
  if constexpr (std::is_void_v<T>) {
    return "ok";
  } else {
    return Shape(*r);
  }
}

// Runs random operations on both stores, the same ones in the same order, and compares every
// answer: codes, messages and records field by field. One clock drives both; their randomness
// has one seed, so their owner tokens agree as long as both draw them alike.
// The sent points list stale and sweep are given: none, real ones, and the invalid ones.
const std::vector<std::vector<std::string>> kPoints = {
    {}, {"charge_sent"}, {"claimed", "charge_sent"}, {""}, {"a", "b", "c", "d", "e"}};

class Differential {
 public:
  explicit Differential(uint64_t seed)
      : rng_(seed),
        model_random_(seed),
        sqlite_random_(seed),
        model_(MakeMemoryStore(clock_, model_random_)) {
    SqliteStoreOptions options;
    options.path = dir_.File("idem.db");
    options.synchronous_full = false;
    auto sqlite = OpenSqliteStore(options, clock_, sqlite_random_);
    IDEM_CHECK(sqlite.has_value());
    sqlite_ = std::move(*sqlite);
    for (const char* user : {"alice", "bob"}) {
      for (const char* key : {"key-diff-1", "key-diff-2"}) specs_.push_back(Spec(key, user));
    }
    specs_.push_back(Spec("key-diff-3", "alice", "orders.create"));
  }

  // Runs `steps` steps; returns false at the first disagreement (after reporting it).
  bool Run(int steps) {
    for (step_ = 0; step_ < steps; ++step_) {
      switch (Pick(10)) {
        case 0:
        case 1:
        case 2:
        case 3:
        case 4:
        case 5:
          if (!Transaction()) return false;
          break;
        case 6: {
          const ScopeHash scope = AnySpec().scope;
          if (!Same("read", model_->Read(scope), sqlite_->Read(scope))) return false;
          break;
        }
        case 7: {
          const auto& points = kPoints[Pick(kPoints.size())];
          const std::string route = Pick(4) == 0 ? "orders.create" : "payments.create";
          const int limit = std::vector<int>{-1, 0, 1, 2, 100}[Pick(5)];
          if (!Same("list stale", model_->ListStale(route, points, limit),
                    sqlite_->ListStale(route, points, limit))) {
            return false;
          }
          break;
        }
        case 8: {
          const int batch = std::vector<int>{-1, 0, 1, 2, 100}[Pick(5)];
          const auto& points = kPoints[Pick(kPoints.size())];
          if (!Same("sweep", model_->Sweep(batch, points), sqlite_->Sweep(batch, points))) {
            return false;
          }
          break;
        }
        default:
          clock_.Advance(std::vector<Millis>{Millis(0), Millis(1), Millis(499), Millis(500),
                                             Millis(1000), Millis(1001), Millis(5000)}[Pick(7)]);
      }
    }
    // Everything both hold at the end.
    for (const ClaimSpec& spec : specs_) {
      if (!Same("final read", model_->Read(spec.scope), sqlite_->Read(spec.scope))) return false;
    }
    return true;
  }

  int Compared() const { return compared_; }
  const std::map<std::string, int>& Outcomes() const { return outcomes_; }

 private:
  bool Transaction() {
    auto m = model_->Begin();
    auto s = sqlite_->Begin();
    EXPECT_TRUE(m.has_value() && s.has_value()) << "step " << step_ << ": begin failed";
    if (!m || !s) return false;
    StoreTxn& mt = **m;
    StoreTxn& st = **s;
    const int ops = 1 + static_cast<int>(Pick(4));
    for (int i = 0; i < ops; ++i) {
      ClaimSpec spec = AnySpec();
      spec.lease_ttl = Pick(2) == 0 ? Millis(1000) : Millis(500);
      spec.retention = Pick(2) == 0 ? Millis(5000) : Millis(3000);
      spec.fingerprint.mac.fill(static_cast<uint8_t>(1 + Pick(2)));
      // The record as the transaction sees it, for a lease or fence worth trying.
      auto mg = mt.Get(spec.scope);
      if (!Same("get", mg, st.Get(spec.scope))) return false;
      const std::optional<Record>& seen = *mg;
      if (seen) leases_.push_back(seen->lease);
      const Lease lease = LeaseFor(seen);
      switch (Pick(7)) {
        case 0: {
          auto a = mt.Claim(spec);
          if (!Same("claim", a, st.Claim(spec))) return false;
          break;
        }
        case 1: {
          const int64_t fence =
              seen && Pick(4) != 0 ? seen->lease.fence : static_cast<int64_t>(Pick(4));
          if (!Same("reclaim", mt.Reclaim(spec, fence), st.Reclaim(spec, fence))) return false;
          break;
        }
        case 2: {
          const Millis ttl =
              std::vector<Millis>{Millis(-1), Millis(0), Millis(500), Millis(1000)}[Pick(4)];
          auto a = mt.Renew(spec.scope, lease, ttl);
          if (!Same("renew", a, st.Renew(spec.scope, lease, ttl))) return false;
          if (a) leases_.push_back(*a);
          break;
        }
        case 3: {
          const std::string point = Point();
          const std::string resource = std::vector<std::string>{
              "", "pay_1", "pay_2", std::string(limits::kResourceIdMaxLength + 1, 'r')}[Pick(4)];
          if (!Same("advance", mt.Advance(spec.scope, lease, point, resource),
                    st.Advance(spec.scope, lease, point, resource))) {
            return false;
          }
          break;
        }
        case 4: {
          const std::string point = Point();
          const Millis cover = std::vector<Millis>{Millis(0), Millis(100), Millis(500),
                                                   Millis(1000), Millis(1001)}[Pick(5)];
          if (!Same("advance covered", mt.AdvanceCovered(spec.scope, lease, point, cover),
                    st.AdvanceCovered(spec.scope, lease, point, cover))) {
            return false;
          }
          break;
        }
        case 5: {
          Outcome outcome;
          outcome.state =
              std::vector<RecordState>{RecordState::kSucceeded, RecordState::kFailedFinal,
                                       RecordState::kFailedRetryable}[Pick(3)];
          outcome.status_code = 200 + static_cast<int>(Pick(300));
          outcome.sealed_response = Pick(3) == 0 ? "" : "sealed-" + std::to_string(step_);
          outcome.recovery_point = Point();
          if (!Same("finish", mt.Finish(spec.scope, lease, outcome),
                    st.Finish(spec.scope, lease, outcome))) {
            return false;
          }
          break;
        }
        default: {
          const std::string user = Pick(2) == 0 ? "alice" : "bob";
          std::optional<RecordState> state;
          if (Pick(2) == 0) {
            state = std::vector<RecordState>{RecordState::kProcessing, RecordState::kSucceeded,
                                             RecordState::kFailedFinal,
                                             RecordState::kFailedRetryable}[Pick(4)];
          }
          const int64_t limit = std::vector<int64_t>{-1, 0, 1, 2, 100}[Pick(5)];
          if (!Same("count", mt.Count("acme", user, state, limit),
                    st.Count("acme", user, state, limit))) {
            return false;
          }
        }
      }
    }
    if (Pick(10) < 7) return Same("commit", mt.Commit(), st.Commit());
    return true;  // dropped: both roll back
  }

  std::string Point() {
    return std::vector<std::string>{"", "claimed", "charge_sent",
                                    std::string(limits::kRecoveryPointMaxLength + 1, 'p')}[Pick(4)];
  }

  // Mostly the record's own lease; sometimes one seen earlier, or nobody's.
  Lease LeaseFor(const std::optional<Record>& seen) {
    const std::size_t p = Pick(10);
    if (seen && p < 6) return seen->lease;
    if (!leases_.empty() && p < 9) return leases_[Pick(leases_.size())];
    return Lease{};
  }

  const ClaimSpec& AnySpec() { return specs_[Pick(specs_.size())]; }
  std::size_t Pick(std::size_t n) { return static_cast<std::size_t>(rng_() % n); }

  template <typename T>
  bool Same(const char* what, const Result<T>& model, const Result<T>& sqlite) {
    ++compared_;
    ++outcomes_[std::string(what) + " " + Shape(model)];
    const std::string a = Describe(model);
    const std::string b = Describe(sqlite);
    EXPECT_EQ(a, b) << "step " << step_ << ", " << what << ": the model (left) and SQLite differ";
    return a == b;
  }

  std::mt19937_64 rng_;
  FakeClock clock_;
  SeededRandom model_random_;
  SeededRandom sqlite_random_;
  TempDir dir_;
  std::unique_ptr<Store> model_;
  std::unique_ptr<Store> sqlite_;
  std::vector<ClaimSpec> specs_;
  std::vector<Lease> leases_;
  int step_ = 0;
  int compared_ = 0;
  std::map<std::string, int> outcomes_;
};

TEST(MemoryStore, AgreesWithSqliteOnRandomOperations) {
  std::map<std::string, int> outcomes;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    Differential run(seed);
    ASSERT_TRUE(run.Run(1500)) << "seed " << seed;
    EXPECT_GT(run.Compared(), 1500);
    for (const auto& [outcome, n] : run.Outcomes()) outcomes[outcome] += n;
  }
  // The runs reached every outcome of every operation, so each of them was compared.
  for (const char* outcome : {"claim claimed",
                              "claim exists",
                              "reclaim ok",
                              "reclaim not_found",
                              "reclaim conflict",
                              "renew ok",
                              "renew fenced",
                              "advance ok",
                              "advance fenced",
                              "advance invalid_argument",
                              "advance covered ok",
                              "advance covered conflict",
                              "advance covered fenced",
                              "advance covered invalid_argument",
                              "finish ok",
                              "finish fenced",
                              "finish invalid_argument",
                              "get found",
                              "get none",
                              "count some",
                              "count none",
                              "commit ok",
                              "read found",
                              "read none",
                              "list stale some",
                              "list stale none",
                              "list stale invalid_argument",
                              "sweep some",
                              "sweep none"}) {
    EXPECT_GT(outcomes[outcome], 0) << "never reached: " << outcome;
  }
}

}  // namespace
}  // namespace idem::testing
