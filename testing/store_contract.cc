// testing/store_contract.cc — the store contract suite (see store_contract.h).
#include "testing/store_contract.h"

#include <atomic>
#include <barrier>
#include <thread>

#include "idem/limits.h"
#include "testing/assert_ok.h"
#include "testing/services.h"

namespace idem::testing {

std::string FactoryName(const ::testing::TestParamInfo<StoreFactory>& info) {
  return info.param.name;
}

const std::vector<Migration>& ContractMigrations() {
  static const std::vector<Migration> kMigrations = {
      {1, "CREATE TABLE contract_business (k TEXT PRIMARY KEY, v TEXT NOT NULL)"},
      {2,
       "CREATE TABLE contract_types (id BIGINT PRIMARY KEY, i BIGINT, r DOUBLE PRECISION, "
       "t TEXT, b BYTEA, ts TIMESTAMPTZ)"},
  };
  return kMigrations;
}

void StoreContractTest::SetUp() {
  for (const std::string& variable : GetParam().services) {
    IDEM_NEED_SERVICE(ServiceUrl(variable), variable);
  }
  store_ = Open();
  ASSERT_NE(store_, nullptr) << "the store did not open";
}

std::unique_ptr<Store> StoreContractTest::Open() {
  auto store = GetParam().open(env_);
  EXPECT_TRUE(store.has_value()) << store.error().message;
  return store ? std::move(*store) : nullptr;
}

ClaimSpec ContractSpec(const std::string& key, const std::string& tenant, const std::string& user,
                       uint8_t fp_byte) {
  ClaimSpec spec;
  spec.scope = *Scope{tenant, user, "payments.create", key}.Hash();
  spec.tenant = tenant;
  spec.user = user;
  spec.route = "payments.create";
  spec.fingerprint.rules_version = 1;
  spec.fingerprint.secret_id = 7;
  spec.fingerprint.mac.fill(fp_byte);
  spec.lease_ttl = kContractLease;
  spec.retention = kContractRetention;
  return spec;
}

namespace {

constexpr Millis kLease = kContractLease;
constexpr Millis kRetention = kContractRetention;

// Claims `spec` in a transaction of its own and commits it: the new record, or the store's error
// (kAlreadyExists when the claim met an existing record).
Result<Record> ClaimAndCommit(Store& store, const ClaimSpec& spec) {
  IDEM_ASSIGN_OR_RETURN(auto txn, store.Begin());
  IDEM_ASSIGN_OR_RETURN(ClaimResult claim, txn->Claim(spec));
  if (!claim.claimed) return MakeError(Errc::kAlreadyExists, "the claim met an existing record");
  IDEM_RETURN_IF_ERROR(txn->Commit());
  return std::move(claim.record);
}

Outcome Succeeded(std::string body = "sealed-bytes") {
  return Outcome{RecordState::kSucceeded, 201, std::move(body), "done"};
}

// Finishes the record of `spec` held under `lease` with `outcome`, in a transaction of its own.
Status FinishAndCommit(Store& store, const ClaimSpec& spec, const Lease& lease,
                       const Outcome& outcome) {
  IDEM_ASSIGN_OR_RETURN(auto txn, store.Begin());
  IDEM_RETURN_IF_ERROR(txn->Finish(spec.scope, lease, outcome));
  return txn->Commit();
}

// Claims `spec` and finishes it with `outcome`, each in a committed transaction of its own.
Status ClaimAndFinish(Store& store, const ClaimSpec& spec, const Outcome& outcome) {
  IDEM_ASSIGN_OR_RETURN(const Record record, ClaimAndCommit(store, spec));
  return FinishAndCommit(store, spec, record.lease, outcome);
}

// The record of `scope`, if any; a store error fails the test (not fatally) and reads as none.
std::optional<Record> ReadOrNone(Store& store, const ScopeHash& scope) {
  auto r = store.Read(scope);
  EXPECT_TRUE(r.has_value()) << r.error().message;
  return r ? *r : std::nullopt;
}

// The tests of business SQL (StoreTxn::Exec, Store::Query) need a store that runs it.
#define SKIP_WITHOUT_BUSINESS_SQL()                                    \
  do {                                                                 \
    if (!store_->capabilities().business_sql) {                        \
      GTEST_SKIP() << "the store runs no business SQL (capabilities)"; \
    }                                                                  \
  } while (false)

int64_t BusinessRows(Store& store, const std::string& k) {
  auto txn = store.Begin();
  EXPECT_TRUE(txn.has_value()) << txn.error().message;
  if (!txn) return -1;
  auto rows = (*txn)->Exec("SELECT count(*) FROM contract_business WHERE k = ?", {k});
  EXPECT_TRUE(rows.has_value()) << rows.error().message;
  return rows ? std::get<int64_t>(rows->at(0).at(0)) : -1;
}

TEST_P(StoreContractTest, ClaimInsertsProcessingRecordOnce) {
  const ClaimSpec spec = ContractSpec("key-claim-1");
  const Timestamp now = env_.clock.Now();
  IDEM_ASSERT_OK_AND_ASSIGN(Record first, ClaimAndCommit(*store_, spec));
  EXPECT_EQ(first.state, RecordState::kProcessing);
  EXPECT_EQ(first.lease.fence, 1);
  EXPECT_EQ(first.lease.until, now + kLease);
  EXPECT_EQ(first.expires_at, now + kRetention);
  EXPECT_EQ(first.recovery_point, "");

  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto again = txn->Claim(ContractSpec("key-claim-1", "acme", "alice", /*fp_byte=*/9));
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_FALSE(again->claimed);
  // The existing record comes back untouched: the first owner and fingerprint.
  EXPECT_EQ(again->record.lease.owner, first.lease.owner);
  EXPECT_EQ(again->record.fingerprint.mac, spec.fingerprint.mac);
  EXPECT_EQ(again->record.tenant, "acme");
  EXPECT_EQ(again->record.user, "alice");
  EXPECT_EQ(again->record.route, "payments.create");
}

TEST_P(StoreContractTest, ScopesOfOtherPrincipalsDoNotCollide) {
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, ContractSpec("same-key-1", "acme", "alice")));
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, ContractSpec("same-key-1", "acme", "bob")));
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, ContractSpec("same-key-1", "globex", "alice")));
}

TEST_P(StoreContractTest, UncommittedClaimLeavesNothing) {
  const ClaimSpec spec = ContractSpec("key-rollback");
  const bool business_sql = store_->capabilities().business_sql;
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Claim(spec)->claimed);
    if (business_sql) {
      ASSERT_TRUE(txn->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                            {std::string("rolled"), std::string("back")})
                      .has_value());
    }
  }
  EXPECT_FALSE(ReadOrNone(*store_, spec.scope).has_value());
  if (business_sql) {
    EXPECT_EQ(BusinessRows(*store_, "rolled"), 0);
  }
}

TEST_P(StoreContractTest, ClaimRaceHasExactlyOneWinner) {
  // Separate store instances (separate connections, as separate processes would have) and many
  // threads claim the same fresh scope at once, round after round.
  constexpr int kThreads = 8;
  constexpr int kRounds = 2000;
  std::unique_ptr<Store> second = Open();
  ASSERT_NE(second, nullptr);
  std::vector<ClaimSpec> specs;
  for (int r = 0; r < kRounds; ++r)
    specs.push_back(ContractSpec("race-" + std::to_string(r) + "-key"));

  std::vector<std::atomic<int>> winners(kRounds);
  std::atomic<int> errors{0};
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Store& store = (t % 2 == 0) ? *store_ : *second;
      for (int r = 0; r < kRounds; ++r) {
        start.arrive_and_wait();
        auto txn = store.Begin();
        if (!txn) {
          ++errors;
          continue;
        }
        auto claim = (*txn)->Claim(specs[static_cast<std::size_t>(r)]);
        if (!claim || !(*txn)->Commit()) {
          ++errors;
          continue;
        }
        if (claim->claimed) ++winners[static_cast<std::size_t>(r)];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  int bad_rounds = 0;
  for (int r = 0; r < kRounds; ++r) bad_rounds += winners[static_cast<std::size_t>(r)] != 1;
  EXPECT_EQ(bad_rounds, 0) << "rounds without exactly one winner";
}

TEST_P(StoreContractTest, ReclaimTakesOverOnlyAnExpiredLeaseAtTheSeenFence) {
  const ClaimSpec spec = ContractSpec("key-takeover");
  IDEM_ASSERT_OK_AND_ASSIGN(Record first, ClaimAndCommit(*store_, spec));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Advance(spec.scope, first.lease, "charge_sent", "pay_123").has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto early = txn->Reclaim(spec, first.lease.fence);
    ASSERT_FALSE(early.has_value());
    EXPECT_EQ(early.error().code, Errc::kConflict);
  }
  env_.clock.Advance(kLease + Millis(1));
  Record second;
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto taken = txn->Reclaim(spec, first.lease.fence);
    ASSERT_TRUE(taken.has_value()) << taken.error().message;
    second = *taken;
    ASSERT_TRUE(txn->Commit().has_value());
  }
  EXPECT_EQ(second.state, RecordState::kProcessing);
  EXPECT_EQ(second.lease.fence, first.lease.fence + 1);
  EXPECT_NE(second.lease.owner, first.lease.owner);
  EXPECT_EQ(second.lease.until, env_.clock.Now() + kLease);
  // Same operation: progress and resource survive a takeover, and it is kept a full retention
  // from the takeover.
  EXPECT_EQ(second.recovery_point, "charge_sent");
  EXPECT_EQ(second.resource_id, "pay_123");
  EXPECT_EQ(ToUnixMillis(second.expires_at), ToUnixMillis(env_.clock.Now() + kRetention));
  EXPECT_EQ(second.created_at, first.created_at);

  // A second taker that saw the old fence loses, even once this lease expires too.
  env_.clock.Advance(kLease + Millis(1));
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto stale = txn->Reclaim(spec, first.lease.fence);
  ASSERT_FALSE(stale.has_value());
  EXPECT_EQ(stale.error().code, Errc::kConflict);
}

// Without business SQL (capabilities), only the record half: the fenced finish changes nothing.
TEST_P(StoreContractTest, FencedFinishIsRejectedAndItsBusinessWriteRollsBack) {
  const ClaimSpec spec = ContractSpec("key-fenced");
  const bool business_sql = store_->capabilities().business_sql;
  IDEM_ASSERT_OK_AND_ASSIGN(Record old_owner, ClaimAndCommit(*store_, spec));
  env_.clock.Advance(kLease + Millis(1));
  Record new_owner;
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    IDEM_ASSERT_OK_AND_ASSIGN(new_owner, txn->Reclaim(spec, old_owner.lease.fence));
    ASSERT_TRUE(txn->Commit().has_value());
  }
  {
    // The slow first executor wakes up and tries to complete, business write first.
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    if (business_sql) {
      ASSERT_TRUE(txn->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                            {std::string("pay-1"), std::string("stale")})
                      .has_value());
    }
    auto finished = txn->Finish(spec.scope, old_owner.lease, Succeeded());
    ASSERT_FALSE(finished.has_value());
    EXPECT_EQ(finished.error().code, Errc::kFenced);
    auto advanced = txn->Advance(spec.scope, old_owner.lease, "done", "");
    ASSERT_FALSE(advanced.has_value());
    EXPECT_EQ(advanced.error().code, Errc::kFenced);
  }  // dropped: rolled back
  if (business_sql) {
    EXPECT_EQ(BusinessRows(*store_, "pay-1"), 0);
  }
  IDEM_ASSERT_OK_AND_ASSIGN(auto record, store_->Read(spec.scope));
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, RecordState::kProcessing);
  EXPECT_EQ(record->lease.owner, new_owner.lease.owner);

  // The current owner completes with its business write.
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    if (business_sql) {
      ASSERT_TRUE(txn->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                            {std::string("pay-1"), std::string("fresh")})
                      .has_value());
    }
    ASSERT_TRUE(txn->Finish(spec.scope, new_owner.lease, Succeeded("answer")).has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  if (business_sql) {
    EXPECT_EQ(BusinessRows(*store_, "pay-1"), 1);
  }
  record = ReadOrNone(*store_, spec.scope);
  EXPECT_EQ(record->state, RecordState::kSucceeded);
  EXPECT_EQ(record->status_code, 201);
  EXPECT_EQ(record->response, "answer");
  EXPECT_EQ(record->recovery_point, "done");
}

TEST_P(StoreContractTest, AfterCommitHooksRunOnceTheCommitSucceededAndNeverOnARollback) {
  std::vector<int> ran;
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    IDEM_ASSERT_OK(txn->Claim(ContractSpec("key-hooks-dropped")));
    txn->AfterCommit([&] { ran.push_back(0); });
  }  // dropped: rolled back
  EXPECT_TRUE(ran.empty());

  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  IDEM_ASSERT_OK(txn->Claim(ContractSpec("key-hooks")));
  txn->AfterCommit([&] { ran.push_back(1); });
  txn->AfterCommit([&] { ran.push_back(2); });
  EXPECT_TRUE(ran.empty()) << "a hook ran before the commit";
  IDEM_ASSERT_OK(txn->Commit());
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
  EXPECT_TRUE(ReadOrNone(*store_, ContractSpec("key-hooks").scope).has_value());
  EXPECT_FALSE(ReadOrNone(*store_, ContractSpec("key-hooks-dropped").scope).has_value());
}

TEST_P(StoreContractTest, RenewExtendsTheLeaseOfItsOwnerOnly) {
  const ClaimSpec spec = ContractSpec("key-renew");
  IDEM_ASSERT_OK_AND_ASSIGN(Record rec, ClaimAndCommit(*store_, spec));
  env_.clock.Advance(Millis(20000));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto renewed = txn->Renew(spec.scope, rec.lease, kLease);
    ASSERT_TRUE(renewed.has_value()) << renewed.error().message;
    EXPECT_EQ(renewed->until, env_.clock.Now() + kLease);
    EXPECT_EQ(renewed->fence, rec.lease.fence);
    ASSERT_TRUE(txn->Commit().has_value());
  }
  // Past the original lease but within the renewed one: no takeover.
  env_.clock.Advance(Millis(20000));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto taken = txn->Reclaim(spec, rec.lease.fence);
    ASSERT_FALSE(taken.has_value());
    EXPECT_EQ(taken.error().code, Errc::kConflict);
  }
  IDEM_ASSERT_OK_AND_ASSIGN(auto record, store_->Read(spec.scope));
  EXPECT_EQ(record->expires_at, rec.expires_at) << "renewal must not touch retention";

  Lease stranger = rec.lease;
  stranger.owner[0] ^= 0xff;
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto refused = txn->Renew(spec.scope, stranger, kLease);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, Errc::kFenced);
}

TEST_P(StoreContractTest, AdvanceBeforeACallRequiresALeaseThatCoversTheCall) {
  const ClaimSpec spec = ContractSpec("key-cover");
  IDEM_ASSERT_OK_AND_ASSIGN(Record rec, ClaimAndCommit(*store_, spec));
  env_.clock.Advance(kLease - Millis(10000));  // 10 s of the lease left
  {
    // A call that needs the lease one millisecond longer than it lasts is refused, and the
    // refusal is not a lost lease: the transaction stays usable and commits nothing.
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto refused = txn->AdvanceCovered(spec.scope, rec.lease, "charge_sent", Millis(10001));
    ASSERT_FALSE(refused.has_value()) << "advanced under a lease that ends before the call";
    EXPECT_EQ(refused.error().code, Errc::kConflict) << refused.error().message;
    ASSERT_TRUE(txn->Commit().has_value());
  }
  IDEM_ASSERT_OK_AND_ASSIGN(auto unchanged, store_->Read(spec.scope));
  ASSERT_TRUE(unchanged.has_value());
  EXPECT_EQ(unchanged->recovery_point, "");
  EXPECT_EQ(unchanged->lease.until, rec.lease.until);
  EXPECT_EQ(unchanged->lease.fence, rec.lease.fence);
  EXPECT_EQ(unchanged->updated_at, rec.updated_at);
  {
    // A lease that ends exactly when the call would covers it.
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto at_limit = txn->AdvanceCovered(spec.scope, rec.lease, "charge_sent", Millis(10000));
    EXPECT_TRUE(at_limit.has_value()) << at_limit.error().message;
  }  // rolled back
  {
    // Renewed in the same transaction, the lease covers the call.
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto renewed = txn->Renew(spec.scope, rec.lease, kLease);
    ASSERT_TRUE(renewed.has_value()) << renewed.error().message;
    auto advanced = txn->AdvanceCovered(spec.scope, *renewed, "charge_sent", kLease);
    ASSERT_TRUE(advanced.has_value()) << advanced.error().message;
    ASSERT_TRUE(txn->Commit().has_value());
  }
  IDEM_ASSERT_OK_AND_ASSIGN(auto sent, store_->Read(spec.scope));
  EXPECT_EQ(sent->recovery_point, "charge_sent");
  EXPECT_EQ(sent->lease.until, env_.clock.Now() + kLease);
  EXPECT_EQ(sent->resource_id, "") << "only the recovery point moves";

  // A lease lost to a takeover is fenced, however short the call.
  env_.clock.Advance(kLease + Millis(1));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Reclaim(spec, rec.lease.fence).has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto fenced = txn->AdvanceCovered(spec.scope, rec.lease, "charge_sent", Millis(0));
  ASSERT_FALSE(fenced.has_value());
  EXPECT_EQ(fenced.error().code, Errc::kFenced) << fenced.error().message;
}

// ReadCached (a cache in front of the store; nullopt for a store without one) answers at most
// what Read answers: never a running record, never one past its expiry, and a finished one only
// as Read has it.
TEST_P(StoreContractTest, ReadCachedAnswersOnlyFinishedUnexpiredRecordsAsReadHasThem) {
  const ClaimSpec spec = ContractSpec("key-cached-1");
  IDEM_ASSERT_OK_AND_ASSIGN(const Record rec, ClaimAndCommit(*store_, spec));
  ASSERT_TRUE(ReadOrNone(*store_, spec.scope).has_value());
  EXPECT_FALSE(store_->ReadCached(spec.scope).has_value()) << "a running record is not cached";
  IDEM_ASSERT_OK(FinishAndCommit(*store_, spec, rec.lease, Succeeded("answer")));
  IDEM_ASSERT_OK_AND_ASSIGN(const std::optional<Record> read, store_->Read(spec.scope));
  ASSERT_TRUE(read.has_value());
  if (const std::optional<Record> cached = store_->ReadCached(spec.scope)) {
    EXPECT_EQ(cached->scope, spec.scope);
    EXPECT_EQ(cached->state, RecordState::kSucceeded);
    EXPECT_EQ(cached->response, "answer");
    EXPECT_EQ(cached->fingerprint.mac, read->fingerprint.mac);
    EXPECT_EQ(cached->expires_at, read->expires_at);
    EXPECT_EQ(cached->status_code, read->status_code);
  }
  EXPECT_FALSE(store_->ReadCached(ContractSpec("key-cached-2").scope).has_value());
  env_.clock.Advance(kRetention + Millis(1));
  EXPECT_FALSE(store_->ReadCached(spec.scope).has_value()) << "not past its expiry";
}

TEST_P(StoreContractTest, FinishedRecordsCannotBeRenewedOrFinishedAgain) {
  const ClaimSpec spec = ContractSpec("key-finished");
  IDEM_ASSERT_OK_AND_ASSIGN(Record rec, ClaimAndCommit(*store_, spec));
  IDEM_ASSERT_OK(FinishAndCommit(*store_, spec, rec.lease, Succeeded()));
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  EXPECT_EQ(txn->Renew(spec.scope, rec.lease, kLease).error().code, Errc::kFenced);
  EXPECT_EQ(txn->Finish(spec.scope, rec.lease, Succeeded()).error().code, Errc::kFenced);
  EXPECT_EQ(txn->AdvanceCovered(spec.scope, rec.lease, "charge_sent", Millis(0)).error().code,
            Errc::kFenced);
}

TEST_P(StoreContractTest, RetryableFailureMayBeClaimedAgainAtOnceFinalMayNot) {
  const ClaimSpec retry = ContractSpec("key-retryable");
  IDEM_ASSERT_OK_AND_ASSIGN(Record r1, ClaimAndCommit(*store_, retry));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Advance(retry.scope, r1.lease, "claimed", "pay_9").has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  IDEM_ASSERT_OK(FinishAndCommit(*store_, retry, r1.lease,
                                 Outcome{RecordState::kFailedRetryable, 503, "", ""}));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto again = txn->Reclaim(retry, r1.lease.fence);
    ASSERT_TRUE(again.has_value()) << again.error().message;
    EXPECT_EQ(again->state, RecordState::kProcessing);
    EXPECT_EQ(again->lease.fence, 2);
    EXPECT_EQ(again->resource_id, "pay_9") << "a retry keeps the operation's resource id";
    EXPECT_EQ(again->recovery_point, "claimed");
    ASSERT_TRUE(txn->Commit().has_value());
  }

  const ClaimSpec final_spec = ContractSpec("key-final");
  IDEM_ASSERT_OK_AND_ASSIGN(Record f1, ClaimAndCommit(*store_, final_spec));
  IDEM_ASSERT_OK(FinishAndCommit(*store_, final_spec, f1.lease,
                                 Outcome{RecordState::kFailedFinal, 402, "declined", "done"}));
  env_.clock.Advance(kLease * 2);
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto refused = txn->Reclaim(final_spec, f1.lease.fence);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, Errc::kConflict);
}

// A held outcome (FAILED_FINAL at kOutcomeUnknownPoint) is settled once, by the fence it was read
// with: executed, it holds the operator's answer; not executed, it is a retryable failure at the
// point of a fresh claim, claimed again under the operation's resource id. Nothing else settles:
// not another final record, not a stale fence, not a settled record, not a missing one.
TEST_P(StoreContractTest, OnlyAHeldOutcomeIsSettledAndOnlyOnce) {
  const Outcome held{RecordState::kFailedFinal, 502, "unknown-outcome-answer",
                     std::string(kOutcomeUnknownPoint)};
  const ClaimSpec executed = ContractSpec("held-executed");
  IDEM_ASSERT_OK_AND_ASSIGN(const Record e1, ClaimAndCommit(*store_, executed));
  IDEM_ASSERT_OK(FinishAndCommit(*store_, executed, e1.lease, held));
  const Outcome answer{RecordState::kSucceeded, 201, "operator-answer",
                       std::string(kOperatorSettledPoint)};
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    const Status stale = txn->Settle(executed.scope, e1.lease.fence + 1, answer);
    ASSERT_FALSE(stale.has_value());
    EXPECT_EQ(stale.error().code, Errc::kConflict) << stale.error().message;
    ASSERT_TRUE(txn->Settle(executed.scope, e1.lease.fence, answer).has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  IDEM_ASSERT_OK_AND_ASSIGN(std::optional<Record> settled, store_->Read(executed.scope));
  ASSERT_TRUE(settled.has_value());
  EXPECT_EQ(settled->state, RecordState::kSucceeded);
  EXPECT_EQ(settled->status_code, 201);
  EXPECT_EQ(settled->response, "operator-answer");
  EXPECT_EQ(settled->recovery_point, kOperatorSettledPoint);
  EXPECT_EQ(settled->lease.fence, e1.lease.fence + 1);
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    const Status again = txn->Settle(executed.scope, settled->lease.fence, answer);
    ASSERT_FALSE(again.has_value()) << "settled once";
    EXPECT_EQ(again.error().code, Errc::kConflict);
  }

  const ClaimSpec not_executed = ContractSpec("held-not-executed");
  IDEM_ASSERT_OK_AND_ASSIGN(const Record n1, ClaimAndCommit(*store_, not_executed));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Advance(not_executed.scope, n1.lease, "forwarded", "upstream-key-1"));
    ASSERT_TRUE(txn->Commit().has_value());
  }
  IDEM_ASSERT_OK(FinishAndCommit(*store_, not_executed, n1.lease, held));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Settle(not_executed.scope, n1.lease.fence,
                            Outcome{RecordState::kFailedRetryable, 0, "", ""}));
    ASSERT_TRUE(txn->Commit().has_value());
  }
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto retried = txn->Reclaim(not_executed, n1.lease.fence + 1);
    ASSERT_TRUE(retried.has_value()) << retried.error().message;
    EXPECT_EQ(retried->state, RecordState::kProcessing);
    EXPECT_EQ(retried->recovery_point, "");
    EXPECT_EQ(retried->resource_id, "upstream-key-1") << "the operation keeps its ids";
    ASSERT_TRUE(txn->Commit().has_value());
  }

  // A final record that is not held, and a key with no record.
  const ClaimSpec final_spec = ContractSpec("held-never");
  IDEM_ASSERT_OK_AND_ASSIGN(const Record f1, ClaimAndCommit(*store_, final_spec));
  IDEM_ASSERT_OK(FinishAndCommit(*store_, final_spec, f1.lease,
                                 Outcome{RecordState::kFailedFinal, 402, "declined", "done"}));
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  const Status not_held = txn->Settle(final_spec.scope, f1.lease.fence, answer);
  ASSERT_FALSE(not_held.has_value());
  EXPECT_EQ(not_held.error().code, Errc::kConflict);
  const Status missing = txn->Settle(ContractSpec("held-missing").scope, 1, answer);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, Errc::kNotFound);
  const Status processing =
      txn->Settle(final_spec.scope, f1.lease.fence, Outcome{RecordState::kProcessing, 0, "", ""});
  ASSERT_FALSE(processing.has_value());
  EXPECT_EQ(processing.error().code, Errc::kInvalidArgument);
}

// ListHeld lists the unexpired held outcomes, longest held first, of one route or of all.
TEST_P(StoreContractTest, ListHeldFindsUnexpiredHeldOutcomesOnly) {
  const Outcome held{RecordState::kFailedFinal, 502, "unknown", std::string(kOutcomeUnknownPoint)};
  ClaimSpec other = ContractSpec("list-held-other");
  other.route = "gw.orders";
  other.scope = *Scope{"acme", "alice", other.route, "list-held-other"}.Hash();
  IDEM_ASSERT_OK(ClaimAndFinish(*store_, other, held));
  env_.clock.Advance(Millis(5));
  const ClaimSpec first = ContractSpec("list-held-first");
  IDEM_ASSERT_OK(ClaimAndFinish(*store_, first, held));
  const ClaimSpec plain = ContractSpec("list-held-plain");
  IDEM_ASSERT_OK(ClaimAndFinish(*store_, plain,
                                Outcome{RecordState::kFailedFinal, 502, "bad gateway", "done"}));
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, ContractSpec("list-held-running")));

  auto all = store_->ListHeld("", 10);
  ASSERT_TRUE(all.has_value()) << all.error().message;
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ(all->at(0).scope, other.scope) << "the longest held first";
  EXPECT_EQ(all->at(1).scope, first.scope);
  EXPECT_EQ(all->at(1).recovery_point, kOutcomeUnknownPoint);
  auto route = store_->ListHeld("payments.create", 10);
  ASSERT_TRUE(route.has_value()) << route.error().message;
  ASSERT_EQ(route->size(), 1u);
  EXPECT_EQ(route->at(0).scope, first.scope);
  EXPECT_EQ(store_->ListHeld("", 1)->size(), 1u);

  env_.clock.Advance(kRetention + Millis(1));
  EXPECT_EQ(store_->ListHeld("", 10)->size(), 0u) << "an expired held outcome is not listed";
}

TEST_P(StoreContractTest, ExpiredRecordIsReclaimedAsANewOperation) {
  const ClaimSpec spec = ContractSpec("key-expired");
  IDEM_ASSERT_OK_AND_ASSIGN(Record old, ClaimAndCommit(*store_, spec));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Advance(spec.scope, old.lease, "claimed", "pay_old").has_value());
    ASSERT_TRUE(txn->Finish(spec.scope, old.lease, Succeeded()).has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  env_.clock.Advance(kRetention);
  const ClaimSpec next = ContractSpec("key-expired", "acme", "alice", /*fp_byte=*/5);
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto fresh = txn->Reclaim(next, old.lease.fence);
  ASSERT_TRUE(fresh.has_value()) << fresh.error().message;
  EXPECT_EQ(fresh->state, RecordState::kProcessing);
  EXPECT_EQ(fresh->fingerprint.mac, next.fingerprint.mac);
  EXPECT_EQ(fresh->resource_id, "");
  EXPECT_EQ(fresh->recovery_point, "");
  EXPECT_EQ(fresh->response, "");
  EXPECT_EQ(fresh->created_at, env_.clock.Now());
  EXPECT_EQ(fresh->expires_at, env_.clock.Now() + kRetention);
  EXPECT_EQ(fresh->lease.fence, old.lease.fence + 1);
}

TEST_P(StoreContractTest, ExpiredProcessingRecordIsOnlyTakenOver) {
  const ClaimSpec spec = ContractSpec("key-expired-processing");
  IDEM_ASSERT_OK_AND_ASSIGN(Record old, ClaimAndCommit(*store_, spec));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Advance(spec.scope, old.lease, "charge_sent", "pay_x").has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  env_.clock.Advance(kRetention);
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto taken =
      txn->Reclaim(ContractSpec("key-expired-processing", "acme", "alice", 5), old.lease.fence);
  ASSERT_TRUE(taken.has_value()) << taken.error().message;
  // The charge may have left: progress and ids survive, and so does the original fingerprint.
  EXPECT_EQ(taken->recovery_point, "charge_sent");
  EXPECT_EQ(taken->resource_id, "pay_x");
  EXPECT_EQ(taken->fingerprint.mac, spec.fingerprint.mac);
  EXPECT_EQ(taken->created_at, old.created_at);
}

// A resume (a retry after a retryable failure, or a takeover of an expired lease) continues the
// operation, so the key is honoured for a full retention after it: a finished outcome must stay
// replayable however late the resume came.
TEST_P(StoreContractTest, AResumeExtendsRetentionToAtLeastAFullPeriodFromNow) {
  const ClaimSpec retry = ContractSpec("key-late-retry");
  IDEM_ASSERT_OK_AND_ASSIGN(Record r1, ClaimAndCommit(*store_, retry));
  IDEM_ASSERT_OK(FinishAndCommit(*store_, retry, r1.lease,
                                 Outcome{RecordState::kFailedRetryable, 503, "", ""}));
  const ClaimSpec takeover = ContractSpec("key-late-takeover");
  IDEM_ASSERT_OK_AND_ASSIGN(Record t1, ClaimAndCommit(*store_, takeover));
  env_.clock.Advance(kRetention - Millis(1000));  // a second before both expire
  for (const auto& [spec, seen] : {std::pair{retry, r1}, std::pair{takeover, t1}}) {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto resumed = txn->Reclaim(spec, seen.lease.fence);
    ASSERT_TRUE(resumed.has_value()) << resumed.error().message;
    EXPECT_EQ(ToUnixMillis(resumed->expires_at), ToUnixMillis(env_.clock.Now() + kRetention))
        << "a resume a second before expiry left the key one second to live";
    EXPECT_EQ(ToUnixMillis(resumed->created_at), ToUnixMillis(seen.created_at));
    ASSERT_TRUE(txn->Commit().has_value());
    EXPECT_EQ(ToUnixMillis(ReadOrNone(*store_, spec.scope)->expires_at),
              ToUnixMillis(env_.clock.Now() + kRetention));
  }

  // Extended, never shortened: a resume under a shorter retention keeps the longer expiry.
  const ClaimSpec early = ContractSpec("key-early-retry");
  IDEM_ASSERT_OK_AND_ASSIGN(Record e1, ClaimAndCommit(*store_, early));
  IDEM_ASSERT_OK(FinishAndCommit(*store_, early, e1.lease,
                                 Outcome{RecordState::kFailedRetryable, 503, "", ""}));
  ClaimSpec shorter = early;
  shorter.retention = Millis(1000);
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto resumed = txn->Reclaim(shorter, e1.lease.fence);
  ASSERT_TRUE(resumed.has_value()) << resumed.error().message;
  EXPECT_EQ(ToUnixMillis(resumed->expires_at), ToUnixMillis(e1.expires_at));
}

// An execution that outlived its record's retention (a process stopped for longer) finishes a
// record already past expires_at: it is kept a full retention from its completion, so a retry
// that waited meanwhile is answered from it instead of beginning the operation anew. One that
// finishes in time keeps its expiry.
TEST_P(StoreContractTest, ACompletionPastItsExpiryKeepsTheRecordAFullRetentionFromThen) {
  const ClaimSpec late = ContractSpec("key-finished-late");
  IDEM_ASSERT_OK_AND_ASSIGN(Record l1, ClaimAndCommit(*store_, late));
  const ClaimSpec on_time = ContractSpec("key-finished-on-time");
  IDEM_ASSERT_OK_AND_ASSIGN(Record o1, ClaimAndCommit(*store_, on_time));
  Outcome succeeded = Succeeded("the answer");
  succeeded.retention = kRetention;
  IDEM_ASSERT_OK(FinishAndCommit(*store_, on_time, o1.lease, succeeded));
  env_.clock.Advance(kRetention + Millis(5000));
  IDEM_ASSERT_OK(FinishAndCommit(*store_, late, l1.lease, succeeded));
  IDEM_ASSERT_OK_AND_ASSIGN(auto kept, store_->Read(late.scope));
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(ToUnixMillis(kept->expires_at), ToUnixMillis(env_.clock.Now() + kRetention));
  EXPECT_EQ(ReadOrNone(*store_, on_time.scope)->expires_at, o1.expires_at);
  // The waiting retry's reclaim finds a finished, unexpired record: no new operation.
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto again = txn->Reclaim(ContractSpec("key-finished-late"), kept->lease.fence);
  EXPECT_FALSE(again.has_value()) << "a retry began the operation anew";
}

TEST_P(StoreContractTest, AResumedThenFinishedRecordSurvivesASweepAtItsOldExpiry) {
  const ClaimSpec spec = ContractSpec("key-resumed-kept");
  IDEM_ASSERT_OK_AND_ASSIGN(Record first, ClaimAndCommit(*store_, spec));
  IDEM_ASSERT_OK(FinishAndCommit(*store_, spec, first.lease,
                                 Outcome{RecordState::kFailedRetryable, 503, "", ""}));
  env_.clock.Advance(kRetention - Millis(1000));
  Record resumed;
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto r = txn->Reclaim(spec, first.lease.fence);
    ASSERT_TRUE(r.has_value()) << r.error().message;
    resumed = *r;
    ASSERT_TRUE(txn->Commit().has_value());
  }
  IDEM_ASSERT_OK(FinishAndCommit(*store_, spec, resumed.lease, Succeeded("the answer")));

  env_.clock.Advance(Millis(1000));  // the first attempt's expiry
  auto swept = store_->Sweep(100, {});
  ASSERT_TRUE(swept.has_value()) << swept.error().message;
  EXPECT_EQ(*swept, 0) << "the sweeper deleted an answer the client may still ask for";
  IDEM_ASSERT_OK_AND_ASSIGN(auto kept, store_->Read(spec.scope));
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->state, RecordState::kSucceeded);
  EXPECT_EQ(kept->response, "the answer");

  // A full retention after the resume, it goes.
  env_.clock.Advance(kRetention - Millis(1000));
  EXPECT_EQ(IDEM_VALUE_OF(store_->Sweep(100, {})), 1);
  EXPECT_FALSE(ReadOrNone(*store_, spec.scope).has_value());
}

TEST_P(StoreContractTest, CountsPerPrincipalAndStateAreBoundedByTheLimit) {
  for (int i = 0; i < 5; ++i) {
    IDEM_ASSERT_OK(ClaimAndCommit(*store_, ContractSpec("alice-run-" + std::to_string(i))));
  }
  for (int i = 0; i < 3; ++i) {
    ClaimSpec spec = ContractSpec("alice-done-" + std::to_string(i));
    IDEM_ASSERT_OK(ClaimAndFinish(*store_, spec, Succeeded()));
  }
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, ContractSpec("bob-run-00", "acme", "bob")));
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, ContractSpec("alice-other", "globex", "alice")));

  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  EXPECT_EQ(IDEM_VALUE_OF(txn->Count("acme", "alice", RecordState::kProcessing, 100)), 5);
  EXPECT_EQ(IDEM_VALUE_OF(txn->Count("acme", "alice", RecordState::kSucceeded, 100)), 3);
  EXPECT_EQ(IDEM_VALUE_OF(txn->Count("acme", "alice", std::nullopt, 100)), 8);
  EXPECT_EQ(IDEM_VALUE_OF(txn->Count("acme", "alice", std::nullopt, 4)), 4);
  EXPECT_EQ(IDEM_VALUE_OF(txn->Count("acme", "bob", RecordState::kProcessing, 100)), 1);
  EXPECT_EQ(IDEM_VALUE_OF(txn->Count("globex", "alice", std::nullopt, 100)), 1);
  EXPECT_EQ(IDEM_VALUE_OF(txn->Count("globex", "nobody", std::nullopt, 100)), 0);
}

// The count of a principal's records in any state (the retained-keys quota) follows every way a
// record comes and goes: a committed claim adds one; a rolled-back claim, a claim that met an
// existing record and a fresh claim over an expired record in place add none; each record a sweep
// deletes takes one away from its own principal only.
TEST_P(StoreContractTest, TheRetainedCountFollowsClaimsRollbacksReclaimsAndSweeps) {
  auto retained = [&](const std::string& user) -> int64_t {
    auto txn = store_->Begin();
    EXPECT_TRUE(txn.has_value()) << txn.error().message;
    if (!txn) return -1;
    auto n = (*txn)->Count("acme", user, std::nullopt, 1'000'000);
    EXPECT_TRUE(n.has_value()) << n.error().message;
    return n ? *n : -1;
  };
  std::vector<Record> done;
  for (int i = 0; i < 4; ++i) {
    const ClaimSpec spec = ContractSpec("retained-" + std::to_string(i));
    IDEM_ASSERT_OK_AND_ASSIGN(Record record, ClaimAndCommit(*store_, spec));
    done.push_back(record);
    IDEM_ASSERT_OK(FinishAndCommit(*store_, spec, done.back().lease, Succeeded()));
  }
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, ContractSpec("retained-bob", "acme", "bob")));
  EXPECT_EQ(retained("alice"), 4);
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Claim(ContractSpec("retained-rolled-back")).has_value());
    EXPECT_EQ(IDEM_VALUE_OF(txn->Count("acme", "alice", std::nullopt, 1'000'000)), 5)
        << "its own claim counts";
  }  // dropped uncommitted: rolled back
  EXPECT_EQ(retained("alice"), 4);
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto again = txn->Claim(ContractSpec("retained-0"));
    ASSERT_TRUE(again.has_value()) << again.error().message;
    EXPECT_FALSE(again->claimed);
    ASSERT_TRUE(txn->Commit().has_value());
  }
  EXPECT_EQ(retained("alice"), 4);

  env_.clock.Advance(kRetention);
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto fresh = txn->Reclaim(ContractSpec("retained-0"), done[0].lease.fence);
    ASSERT_TRUE(fresh.has_value()) << fresh.error().message;
    ASSERT_TRUE(txn->Commit().has_value());
  }
  EXPECT_EQ(retained("alice"), 4) << "a record claimed again in place is still one record";

  auto swept = store_->Sweep(2, {});
  ASSERT_TRUE(swept.has_value()) << swept.error().message;
  EXPECT_EQ(*swept, 2);
  EXPECT_EQ(retained("alice"), 2);
  EXPECT_EQ(IDEM_VALUE_OF(store_->Sweep(100, {})), 1);
  EXPECT_EQ(retained("alice"), 1) << "the reclaimed record is PROCESSING and stays";
  EXPECT_EQ(retained("bob"), 1) << "bob's PROCESSING record is not swept, nor counted off";
}

// The census counts the unfinished records by state and every retained one, and dates the oldest
// PROCESSING record from its first claim on the store's clock; what is rolled back or swept
// counts no more.
TEST_P(StoreContractTest, TheCensusCountsUnfinishedRecordsAndAgesTheOldestProcessingOne) {
  auto census = [&] {
    auto c = store_->Census();
    EXPECT_TRUE(c.has_value()) << c.error().message;
    RecordCensus failed;
    failed.processing = -1;
    return c ? *c : failed;
  };
  RecordCensus empty = census();
  EXPECT_EQ(empty.processing, 0);
  EXPECT_EQ(empty.failed_retryable, 0);
  EXPECT_EQ(empty.retained, 0);
  EXPECT_FALSE(empty.oldest_processing_age.has_value());

  const ClaimSpec oldest = ContractSpec("census-oldest");
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, oldest));
  env_.clock.Advance(Millis(4000));
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, ContractSpec("census-newer", "acme", "bob")));
  ClaimSpec elsewhere = ContractSpec("census-other-route");
  elsewhere.route = "gw.orders.create";
  elsewhere.scope = *Scope{"acme", "alice", elsewhere.route, "census-other-route"}.Hash();
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, elsewhere));
  const ClaimSpec done = ContractSpec("census-done");
  IDEM_ASSERT_OK(ClaimAndFinish(*store_, done, Succeeded()));
  const ClaimSpec failed = ContractSpec("census-failed");
  IDEM_ASSERT_OK(
      ClaimAndFinish(*store_, failed, Outcome{RecordState::kFailedRetryable, 503, "sealed", ""}));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Claim(ContractSpec("census-rolled-back")).has_value());
  }  // dropped uncommitted: rolled back
  env_.clock.Advance(Millis(1500));

  RecordCensus c = census();
  EXPECT_EQ(c.processing, 3);
  EXPECT_EQ(c.processing_by_route,
            (std::map<std::string, int64_t>{{"gw.orders.create", 1}, {"payments.create", 2}}));
  EXPECT_EQ(c.failed_retryable, 1);
  EXPECT_EQ(c.retained, 5);
  ASSERT_TRUE(c.oldest_processing_age.has_value());
  EXPECT_EQ(*c.oldest_processing_age, Millis(5500));

  env_.clock.Advance(kRetention);
  EXPECT_EQ(IDEM_VALUE_OF(store_->Sweep(100, {})), 2) << "the finished ones";
  c = census();
  EXPECT_EQ(c.processing, 3);
  EXPECT_EQ(c.failed_retryable, 0);
  EXPECT_EQ(c.retained, 3);
  EXPECT_EQ(*c.oldest_processing_age, kRetention + Millis(5500));
}

// A retryable failure past a send (at one of the sent points) is the takeover loop's, like a
// PROCESSING record: deleted at its expiry, it would leave its business row (a payment holding its
// order) unresolved for ever. Other retryable failures are swept like finished records.
TEST_P(StoreContractTest, TheSweeperLeavesRetryableFailuresPastASendToTheReconciler) {
  const ClaimSpec past = ContractSpec("sweep-past-send");
  IDEM_ASSERT_OK_AND_ASSIGN(const Record claimed, ClaimAndCommit(*store_, past));
  const Lease lease = claimed.lease;
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Advance(past.scope, lease, "charge_sent", "pay_1").has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  IDEM_ASSERT_OK(
      FinishAndCommit(*store_, past, lease, Outcome{RecordState::kFailedRetryable, 503, "", ""}));
  const ClaimSpec before = ContractSpec("sweep-before-send");
  IDEM_ASSERT_OK(
      ClaimAndFinish(*store_, before, Outcome{RecordState::kFailedRetryable, 503, "", ""}));
  env_.clock.Advance(kRetention);

  auto swept = store_->Sweep(100, {"charge_sent"});
  ASSERT_TRUE(swept.has_value()) << swept.error().message;
  EXPECT_EQ(*swept, 1) << "only the retryable failure before any send";
  EXPECT_TRUE(ReadOrNone(*store_, past.scope).has_value());
  EXPECT_FALSE(ReadOrNone(*store_, before.scope).has_value());
  auto invalid = store_->Sweep(100, {""});
  ASSERT_FALSE(invalid.has_value()) << "an empty sent point was taken";
  EXPECT_EQ(invalid.error().code, Errc::kInvalidArgument);
  EXPECT_EQ(IDEM_VALUE_OF(store_->Sweep(100, {})), 1)
      << "with no sent points, it is swept like the others";
}

TEST_P(StoreContractTest, SweeperDeletesExpiredFinishedRecordsInBatchesOnly) {
  std::vector<ClaimSpec> expired, live;
  for (int i = 0; i < 7; ++i) {
    expired.push_back(ContractSpec("old-" + std::to_string(i) + "-key"));
    IDEM_ASSERT_OK(ClaimAndFinish(*store_, expired.back(), Succeeded()));
  }
  const ClaimSpec stuck = ContractSpec("old-processing");
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, stuck));
  env_.clock.Advance(kRetention);
  for (int i = 0; i < 2; ++i) {
    live.push_back(ContractSpec("new-" + std::to_string(i) + "-key"));
    IDEM_ASSERT_OK(ClaimAndFinish(*store_, live.back(), Succeeded()));
  }

  auto first = store_->Sweep(3, {});
  ASSERT_TRUE(first.has_value()) << first.error().message;
  EXPECT_EQ(*first, 3);
  EXPECT_EQ(IDEM_VALUE_OF(store_->Sweep(3, {})), 3);
  EXPECT_EQ(IDEM_VALUE_OF(store_->Sweep(3, {})), 1);
  EXPECT_EQ(IDEM_VALUE_OF(store_->Sweep(3, {})), 0);
  for (const ClaimSpec& s : expired) EXPECT_FALSE(ReadOrNone(*store_, s.scope).has_value());
  for (const ClaimSpec& s : live) EXPECT_TRUE(ReadOrNone(*store_, s.scope).has_value());
  EXPECT_TRUE(ReadOrNone(*store_, stuck.scope).has_value())
      << "an unresolved PROCESSING record is the reconciler's, not the sweeper's";
}

TEST_P(StoreContractTest, ListStaleFindsExpiredLeasesOfItsRouteOnly) {
  const ClaimSpec live = ContractSpec("stale-live-key");
  const ClaimSpec stale = ContractSpec("stale-old-key");
  const ClaimSpec done = ContractSpec("stale-done-key");
  // Older stale records of another route come first by lease, and must not crowd this one out.
  ClaimSpec other = ContractSpec("stale-other-route");
  other.route = "orders.create";
  other.scope = *Scope{"acme", "alice", other.route, "stale-other-route"}.Hash();
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, other));
  env_.clock.Advance(Millis(1));
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, stale));
  IDEM_ASSERT_OK(ClaimAndFinish(*store_, done, Succeeded()));
  env_.clock.Advance(kLease + Millis(1));
  IDEM_ASSERT_OK(ClaimAndCommit(*store_, live));
  auto found = store_->ListStale("payments.create", {"charge_sent"}, 1);
  ASSERT_TRUE(found.has_value()) << found.error().message;
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ(found->at(0).scope, stale.scope);
  EXPECT_EQ(found->at(0).state, RecordState::kProcessing);
  auto others = store_->ListStale("orders.create", {}, 10);
  ASSERT_TRUE(others.has_value()) << others.error().message;
  ASSERT_EQ(others->size(), 1u);
  EXPECT_EQ(others->at(0).scope, other.scope);
  EXPECT_EQ(store_->ListStale("payments.create", {"charge_sent"}, 0)->size(), 0u);
}

// A retryable failure after the send proves nothing about the downstream: such records are
// listed for the takeover loop once their lease (which covered the call) has run out, like expired
// PROCESSING ones. A retryable failure before the send, or one whose lease still runs, is not.
TEST_P(StoreContractTest, ListStaleFindsRetryableFailuresPastTheSendOnly) {
  auto fail_at = [&](const ClaimSpec& spec, const std::string& point) {
    IDEM_ASSERT_OK_AND_ASSIGN(const Record claimed, ClaimAndCommit(*store_, spec));
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Advance(spec.scope, claimed.lease, point, "pay_" + point).has_value());
    ASSERT_TRUE(txn->Finish(spec.scope, claimed.lease,
                            Outcome{RecordState::kFailedRetryable, 503, "sealed", ""})
                    .has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  };
  const ClaimSpec sent = ContractSpec("failed-after-send");
  const ClaimSpec before = ContractSpec("failed-before-send");
  const ClaimSpec fresh = ContractSpec("failed-after-send-live");
  fail_at(sent, "charge_sent");
  fail_at(before, "claimed");
  env_.clock.Advance(kLease + Millis(1));
  fail_at(fresh, "charge_sent");

  auto found = store_->ListStale("payments.create", {"charge_sent"}, 10);
  ASSERT_TRUE(found.has_value()) << found.error().message;
  ASSERT_EQ(found->size(), 1u) << "only the retryable failure past the send whose lease ended";
  EXPECT_EQ(found->at(0).scope, sent.scope);
  EXPECT_EQ(found->at(0).state, RecordState::kFailedRetryable);
  EXPECT_EQ(found->at(0).recovery_point, "charge_sent");

  // A route that declares no point past a send leaves its retryable failures to the client.
  auto undeclared = store_->ListStale("payments.create", {}, 10);
  ASSERT_TRUE(undeclared.has_value()) << undeclared.error().message;
  EXPECT_TRUE(undeclared->empty());
  auto too_many = store_->ListStale("payments.create", {"a", "b", "c", "d", "e"}, 10);
  ASSERT_FALSE(too_many.has_value());
  EXPECT_EQ(too_many.error().code, Errc::kInvalidArgument);
  auto empty_point = store_->ListStale("payments.create", {""}, 10);
  ASSERT_FALSE(empty_point.has_value());
  EXPECT_EQ(empty_point.error().code, Errc::kInvalidArgument);
}

TEST_P(StoreContractTest, QueryReadsCommittedBusinessRowsAndRefusesWrites) {
  SKIP_WITHOUT_BUSINESS_SQL();
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                          {std::string("q1"), std::string("v1")})
                    .has_value());
    // Not visible outside the transaction until it commits.
    auto before = store_->Query("SELECT v FROM contract_business WHERE k = ?", {std::string("q1")});
    ASSERT_TRUE(before.has_value()) << before.error().message;
    EXPECT_TRUE(before->empty());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  auto rows = store_->Query("SELECT v FROM contract_business WHERE k = ?", {std::string("q1")});
  ASSERT_TRUE(rows.has_value());
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ(std::get<std::string>(rows->at(0).at(0)), "v1");
  auto write = store_->Query("DELETE FROM contract_business");
  ASSERT_FALSE(write.has_value());
  EXPECT_EQ(write.error().code, Errc::kInvalidArgument);
}

TEST_P(StoreContractTest, ExecReportsUniqueViolationsAsAlreadyExists) {
  SKIP_WITHOUT_BUSINESS_SQL();
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  ASSERT_TRUE(txn->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                        {std::string("ord-1"), std::string("a")})
                  .has_value());
  auto dup = txn->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                       {std::string("ord-1"), std::string("b")});
  ASSERT_FALSE(dup.has_value());
  EXPECT_EQ(dup.error().code, Errc::kAlreadyExists);
  // The transaction is still usable: decide from the existing row.
  auto rows = txn->Exec("SELECT v FROM contract_business WHERE k = ?", {std::string("ord-1")});
  ASSERT_TRUE(rows.has_value()) << rows.error().message;
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ(std::get<std::string>(rows->at(0).at(0)), "a");
}

TEST_P(StoreContractTest, RecordsSurviveReopeningTheStore) {
  if (!store_->capabilities().durable) GTEST_SKIP() << "store is not durable";
  const ClaimSpec spec = ContractSpec("key-durable");
  IDEM_ASSERT_OK_AND_ASSIGN(Record rec, ClaimAndCommit(*store_, spec));
  IDEM_ASSERT_OK(FinishAndCommit(*store_, spec, rec.lease, Succeeded("kept")));
  store_.reset();
  store_ = Open();
  ASSERT_NE(store_, nullptr);
  IDEM_ASSERT_OK_AND_ASSIGN(auto record, store_->Read(spec.scope));
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, RecordState::kSucceeded);
  EXPECT_EQ(record->response, "kept");
  EXPECT_EQ(record->lease.owner, rec.lease.owner);
  EXPECT_EQ(record->expires_at, rec.expires_at);
}

TEST_P(StoreContractTest, TypedColumnsReadBackAsTheSameAlternativeOnEveryBackend) {
  SKIP_WITHOUT_BUSINESS_SQL();
  const std::string bytes("\0\x01\xff binary", 10);
  // Instants after, at and before the epochs both backends count from (1970, 2000).
  const std::vector<Timestamp> instants = {FromUnixMillis(1'800'000'000'123),
                                           FromUnixMillis(946'684'799'999), FromUnixMillis(-1)};
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    for (std::size_t n = 0; n < instants.size(); ++n) {
      auto inserted =
          txn->Exec("INSERT INTO contract_types (id, i, r, t, b, ts) VALUES (?, ?, ?, ?, ?, ?)",
                    {int64_t(n + 1), int64_t{INT64_MIN} + int64_t(n), 2.5 * double(n + 1),
                     std::string("h\xc3\xa9llo"), Blob{bytes}, instants[n]});
      ASSERT_TRUE(inserted.has_value()) << inserted.error().message;
    }
    auto nulls =
        txn->Exec("INSERT INTO contract_types (id, i, r, t, b, ts) VALUES (?, ?, ?, ?, ?, ?)",
                  {int64_t{99}, SqlValue{}, SqlValue{}, SqlValue{}, SqlValue{}, SqlValue{}});
    ASSERT_TRUE(nulls.has_value()) << nulls.error().message;
    ASSERT_TRUE(txn->Commit().has_value());
  }
  const char* select = "SELECT i, r, t, b, ts FROM contract_types WHERE id = ?";
  for (std::size_t n = 0; n < instants.size(); ++n) {
    auto rows = store_->Query(select, {int64_t(n + 1)});
    ASSERT_TRUE(rows.has_value()) << rows.error().message;
    ASSERT_EQ(rows->size(), 1u);
    const SqlRow& row = rows->at(0);
    ASSERT_EQ(row.size(), 5u);
    ASSERT_TRUE(std::holds_alternative<int64_t>(row[0])) << "integer, row " << n;
    EXPECT_EQ(std::get<int64_t>(row[0]), int64_t{INT64_MIN} + int64_t(n));
    ASSERT_TRUE(std::holds_alternative<double>(row[1])) << "real, row " << n;
    EXPECT_EQ(std::get<double>(row[1]), 2.5 * double(n + 1));
    ASSERT_TRUE(std::holds_alternative<std::string>(row[2])) << "text, row " << n;
    EXPECT_EQ(std::get<std::string>(row[2]), "h\xc3\xa9llo");
    ASSERT_TRUE(std::holds_alternative<Blob>(row[3])) << "blob, row " << n;
    EXPECT_EQ(std::get<Blob>(row[3]).bytes, bytes);
    ASSERT_TRUE(std::holds_alternative<Timestamp>(row[4])) << "timestamp, row " << n;
    EXPECT_EQ(std::get<Timestamp>(row[4]), instants[n]);
  }
  // NULL of every type, read inside a transaction too.
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto rows = txn->Exec(select, {int64_t{99}});
  ASSERT_TRUE(rows.has_value()) << rows.error().message;
  ASSERT_EQ(rows->size(), 1u);
  for (const SqlValue& v : rows->at(0)) EXPECT_TRUE(std::holds_alternative<std::monostate>(v));
}

// The same condition gives the same Errc on every backend, and a failed statement leaves the
// transaction usable.
TEST_P(StoreContractTest, BusinessSqlErrorsAreTheSameOnEveryBackend) {
  SKIP_WITHOUT_BUSINESS_SQL();
  IDEM_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreTxn> txn, store_->Begin());
  struct Case {
    const char* what;
    const char* sql;
    std::vector<SqlValue> params;
    Errc expected;
  };
  const std::vector<Case> cases = {
      {"syntax error", "INSERT INTO contract_business VALUES VALUES", {}, Errc::kInvalidArgument},
      {"unknown table", "SELECT * FROM no_such_table", {}, Errc::kInvalidArgument},
      {"too few parameters",
       "INSERT INTO contract_business (k, v) VALUES (?, ?)",
       {std::string("k1")},
       Errc::kInvalidArgument},
      {"too many parameters",
       "SELECT v FROM contract_business WHERE k = ?",
       {std::string("k1"), std::string("k2")},
       Errc::kInvalidArgument},
      {"NOT NULL violation",
       "INSERT INTO contract_business (k, v) VALUES (?, ?)",
       {std::string("k1"), SqlValue{}},
       Errc::kInvalidArgument},
  };
  for (const Case& c : cases) {
    auto result = txn->Exec(c.sql, c.params);
    ASSERT_FALSE(result.has_value()) << c.what;
    EXPECT_EQ(result.error().code, c.expected) << c.what << ": " << result.error().message;
  }
  auto ok = txn->Exec("INSERT INTO contract_business (k, v) VALUES (?, ?)",
                      {std::string("after-errors"), std::string("v")});
  ASSERT_TRUE(ok.has_value()) << ok.error().message;
  ASSERT_TRUE(txn->Commit().has_value());
  txn.reset();
  EXPECT_EQ(BusinessRows(*store_, "after-errors"), 1);

  auto wrong_count = store_->Query("SELECT v FROM contract_business WHERE k = ?");
  ASSERT_FALSE(wrong_count.has_value());
  EXPECT_EQ(wrong_count.error().code, Errc::kInvalidArgument) << wrong_count.error().message;
  auto unknown = store_->Query("SELECT * FROM no_such_table");
  ASSERT_FALSE(unknown.has_value());
  EXPECT_EQ(unknown.error().code, Errc::kInvalidArgument) << unknown.error().message;
}

TEST_P(StoreContractTest, RecordErrorsAreTheSameOnEveryBackend) {
  const ClaimSpec spec = ContractSpec("key-errors");
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto missing = txn->Reclaim(spec, 1);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, Errc::kNotFound) << missing.error().message;
  Lease nobody;
  nobody.fence = 1;
  EXPECT_EQ(txn->Renew(spec.scope, nobody, kLease).error().code, Errc::kFenced);
  EXPECT_EQ(txn->Advance(spec.scope, nobody, "charge_sent", "").error().code, Errc::kFenced);
  EXPECT_EQ(txn->AdvanceCovered(spec.scope, nobody, "charge_sent", Millis(0)).error().code,
            Errc::kFenced);
  EXPECT_EQ(txn->Finish(spec.scope, nobody, Succeeded()).error().code, Errc::kFenced);
}

TEST_P(StoreContractTest, RecoveryPointsAndResourceIdsAreBounded) {
  const ClaimSpec spec = ContractSpec("key-bounded-progress");
  IDEM_ASSERT_OK_AND_ASSIGN(Record rec, ClaimAndCommit(*store_, spec));
  const std::string point(limits::kRecoveryPointMaxLength, 'p');
  const std::string resource(limits::kResourceIdMaxLength, 'r');
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  auto at_limit = txn->Advance(spec.scope, rec.lease, point, resource);
  ASSERT_TRUE(at_limit.has_value()) << at_limit.error().message;
  auto long_point = txn->Advance(spec.scope, rec.lease, point + "p", resource);
  ASSERT_FALSE(long_point.has_value());
  EXPECT_EQ(long_point.error().code, Errc::kInvalidArgument);
  auto long_resource = txn->Advance(spec.scope, rec.lease, point, resource + "r");
  ASSERT_FALSE(long_resource.has_value());
  EXPECT_EQ(long_resource.error().code, Errc::kInvalidArgument);
  Outcome outcome = Succeeded();
  outcome.recovery_point = point + "p";
  auto long_finish = txn->Finish(spec.scope, rec.lease, outcome);
  ASSERT_FALSE(long_finish.has_value());
  EXPECT_EQ(long_finish.error().code, Errc::kInvalidArgument);
  ASSERT_TRUE(txn->Commit().has_value());
  txn.reset();
  IDEM_ASSERT_OK_AND_ASSIGN(auto stored, store_->Read(spec.scope));
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->recovery_point, point);
  EXPECT_EQ(stored->resource_id, resource);
  EXPECT_EQ(stored->state, RecordState::kProcessing);
}

// A readiness probe on a healthy store answers, also while a write transaction is open.
TEST_P(StoreContractTest, PingAnswersOnAHealthyStore) {
  EXPECT_TRUE(store_->Ping(Millis(1000)));
  IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
  EXPECT_TRUE(store_->Ping(Millis(1000)));
}

// The time of the last send is what a settle window counts from: set by the covered advance
// only, kept by renewals (which move updated_at), cleared by a fresh claim.
TEST_P(StoreContractTest, TheCoveredAdvanceRecordsWhenTheRequestLeft) {
  const ClaimSpec spec = ContractSpec("key-sent-at");
  IDEM_ASSERT_OK_AND_ASSIGN(Record rec, ClaimAndCommit(*store_, spec));
  EXPECT_EQ(rec.sent_at, Timestamp{});
  env_.clock.Advance(Millis(10));
  const Timestamp sent = env_.clock.Now();
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    auto advanced = txn->AdvanceCovered(spec.scope, rec.lease, "charge_sent", Millis(1000));
    ASSERT_TRUE(advanced.has_value()) << advanced.error().message;
    ASSERT_TRUE(txn->Commit().has_value());
  }
  env_.clock.Advance(Millis(10));
  {
    IDEM_ASSERT_OK_AND_ASSIGN(auto txn, store_->Begin());
    ASSERT_TRUE(txn->Renew(spec.scope, rec.lease, kLease).has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  IDEM_ASSERT_OK_AND_ASSIGN(auto stored, store_->Read(spec.scope));
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->sent_at, sent) << "a renewal must not move the time of the send";
  EXPECT_EQ(stored->updated_at, env_.clock.Now());
}

}  // namespace
}  // namespace idem::testing
