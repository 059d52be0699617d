// testing/faulty_store.cc — fault injection around any Store (see faulty_store.h).
#include "testing/faulty_store.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <string>
#include <utility>

namespace idem::testing {

std::string_view StoreOpName(StoreOp op) {
  switch (op) {
    case StoreOp::kBegin:
      return "begin";
    case StoreOp::kRead:
      return "read";
    case StoreOp::kQuery:
      return "query";
    case StoreOp::kListStale:
      return "list_stale";
    case StoreOp::kSweep:
      return "sweep";
    case StoreOp::kPing:
      return "ping";
    case StoreOp::kClaim:
      return "claim";
    case StoreOp::kReclaim:
      return "reclaim";
    case StoreOp::kRenew:
      return "renew";
    case StoreOp::kAdvance:
      return "advance";
    case StoreOp::kAdvanceCovered:
      return "advance_covered";
    case StoreOp::kFinish:
      return "finish";
    case StoreOp::kSettle:
      return "settle";
    case StoreOp::kGet:
      return "get";
    case StoreOp::kCount:
      return "count";
    case StoreOp::kExec:
      return "exec";
    case StoreOp::kCommit:
      return "commit";
  }
  return "unknown";
}

namespace {

constexpr std::size_t kOps = static_cast<std::size_t>(StoreOp::kCommit) + 1;

// SplitMix64's finaliser: a well-mixed 64-bit function of one 64-bit input.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The calls that commit on their own success: only these can commit and then fail.
bool Commits(StoreOp op) { return op == StoreOp::kCommit || op == StoreOp::kSweep; }

}  // namespace

FaultPlan FaultPlan::FromSeed(uint64_t seed, double rate, Millis max_delay) {
  const uint64_t delays = static_cast<uint64_t>(std::max<int64_t>(max_delay.count(), 1));
  return FaultPlan([=](const StoreCall& call) {
    const uint64_t h = Mix(seed ^ Mix(call.n));
    const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // uniform in [0, 1)
    if (u >= rate) return Fault::Pass();
    const uint64_t pick = Mix(h);
    switch (pick % (Commits(call.op) ? 3 : 2)) {
      case 0:
        return Fault::FailBefore();
      case 1:
        return Fault::Delay(Millis(static_cast<int64_t>(1 + Mix(pick) % delays)));
      default:
        return Fault::CommitThenFail();
    }
  });
}

FaultPlan FaultPlan::FailNth(uint64_t n, Fault fault) {
  return FaultPlan([=](const StoreCall& call) { return call.n == n ? fault : Fault::Pass(); });
}

FaultPlan FaultPlan::FailNthOf(StoreOp op, uint64_t n, Fault fault) {
  return FaultPlan([=](const StoreCall& call) {
    return call.op == op && call.n_of_op == n ? fault : Fault::Pass();
  });
}

class FaultyStore::State {
 public:
  explicit State(FaultyStoreOptions options) : options_(std::move(options)) {}

  // Runs `forward` (the call on the wrapped store or transaction) as the plan says for the next
  // call of `op`.
  template <typename Forward>
  auto Run(StoreOp op, Forward&& forward) -> decltype(forward()) {
    const Fault fault = Next(op);
    if (fault.kind == Fault::Kind::kFailBefore ||
        (fault.kind == Fault::Kind::kCommitThenFail && !Commits(op))) {
      return MakeError(Errc::kUnavailable, "fault injected: " + std::string(StoreOpName(op)) +
                                               " failed before it reached the store");
    }
    auto result = forward();
    if (fault.kind == Fault::Kind::kCommitThenFail && result.has_value()) {
      return MakeError(Errc::kDeadlineExceeded,
                       "fault injected: " + std::string(StoreOpName(op)) +
                           " outcome unknown (it was committed; the answer was lost)");
    }
    return result;
  }

  void SetPlan(FaultPlan plan) {
    std::lock_guard lock(mu_);
    options_.plan = std::move(plan);
  }
  uint64_t Calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }
  std::vector<InjectedFault> Injected() const {
    std::lock_guard lock(mu_);
    return injected_;
  }

 private:
  // Numbers the call, asks the plan, records a fault and carries out a delay.
  Fault Next(StoreOp op) {
    StoreCall call;
    Fault fault;
    FakeClock* clock = nullptr;
    std::function<void(const StoreCall&, Millis)> on_delay;
    {
      std::lock_guard lock(mu_);
      call.n = ++calls_;
      call.op = op;
      call.n_of_op = ++calls_of_op_[static_cast<std::size_t>(op)];
      fault = options_.plan(call);
      if (fault.kind == Fault::Kind::kPass) return fault;
      injected_.push_back({call, fault});
      clock = options_.clock;
      on_delay = options_.on_delay;
    }
    if (fault.kind == Fault::Kind::kDelay) {
      if (clock != nullptr) clock->Advance(fault.delay);
      if (on_delay) on_delay(call, fault.delay);
    }
    return fault;
  }

  mutable std::mutex mu_;
  FaultyStoreOptions options_;
  uint64_t calls_ = 0;
  std::array<uint64_t, kOps> calls_of_op_{};
  std::vector<InjectedFault> injected_;
};

namespace {

// A transaction of the wrapped store, each operation and the commit counted and planned.
class FaultyTxn final : public StoreTxn {
 public:
  FaultyTxn(std::unique_ptr<StoreTxn> target, std::shared_ptr<FaultyStore::State> state)
      : target_(std::move(target)), state_(std::move(state)) {}

  Result<ClaimResult> Claim(const ClaimSpec& spec) override {
    return state_->Run(StoreOp::kClaim, [&] { return target_->Claim(spec); });
  }
  Result<Record> Reclaim(const ClaimSpec& spec, int64_t seen_fence) override {
    return state_->Run(StoreOp::kReclaim, [&] { return target_->Reclaim(spec, seen_fence); });
  }
  Result<Lease> Renew(const ScopeHash& scope, const Lease& lease, Millis ttl) override {
    return state_->Run(StoreOp::kRenew, [&] { return target_->Renew(scope, lease, ttl); });
  }
  Status Advance(const ScopeHash& scope, const Lease& lease, std::string_view point,
                 std::string_view resource_id) override {
    return state_->Run(StoreOp::kAdvance,
                       [&] { return target_->Advance(scope, lease, point, resource_id); });
  }
  Status AdvanceCovered(const ScopeHash& scope, const Lease& lease, std::string_view point,
                        Millis must_cover) override {
    return state_->Run(StoreOp::kAdvanceCovered,
                       [&] { return target_->AdvanceCovered(scope, lease, point, must_cover); });
  }
  Status Finish(const ScopeHash& scope, const Lease& lease, const Outcome& outcome) override {
    return state_->Run(StoreOp::kFinish, [&] { return target_->Finish(scope, lease, outcome); });
  }
  Status Settle(const ScopeHash& scope, int64_t seen_fence, const Outcome& outcome) override {
    return state_->Run(StoreOp::kSettle,
                       [&] { return target_->Settle(scope, seen_fence, outcome); });
  }
  Result<std::optional<Record>> Get(const ScopeHash& scope) override {
    return state_->Run(StoreOp::kGet, [&] { return target_->Get(scope); });
  }
  Result<int64_t> Count(std::string_view tenant, std::string_view user,
                        std::optional<RecordState> state, int64_t limit) override {
    return state_->Run(StoreOp::kCount, [&] { return target_->Count(tenant, user, state, limit); });
  }
  Result<std::vector<SqlRow>> Exec(std::string_view sql,
                                   const std::vector<SqlValue>& params) override {
    return state_->Run(StoreOp::kExec, [&] { return target_->Exec(sql, params); });
  }
  // A failure before leaves the wrapped transaction uncommitted: it rolls back when this one is
  // dropped.
  Status Commit() override {
    return state_->Run(StoreOp::kCommit, [&] { return target_->Commit(); });
  }

 private:
  std::unique_ptr<StoreTxn> target_;
  std::shared_ptr<FaultyStore::State> state_;
};

}  // namespace

FaultyStore::FaultyStore(Store& target, FaultyStoreOptions options)
    : StoreWrapper(target), state_(std::make_shared<State>(std::move(options))) {}

FaultyStore::~FaultyStore() = default;

void FaultyStore::SetPlan(FaultPlan plan) { state_->SetPlan(std::move(plan)); }
uint64_t FaultyStore::Calls() const { return state_->Calls(); }
std::vector<InjectedFault> FaultyStore::Injected() const { return state_->Injected(); }

Status FaultyStore::Ping(Millis timeout) {
  return state_->Run(StoreOp::kPing, [&] { return target().Ping(timeout); });
}

Result<std::unique_ptr<StoreTxn>> FaultyStore::Begin() {
  return state_->Run(StoreOp::kBegin, [&]() -> Result<std::unique_ptr<StoreTxn>> {
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, target().Begin());
    return std::unique_ptr<StoreTxn>(std::make_unique<FaultyTxn>(std::move(txn), state_));
  });
}

Result<std::optional<Record>> FaultyStore::Read(const ScopeHash& scope) {
  return state_->Run(StoreOp::kRead, [&] { return target().Read(scope); });
}

Result<std::vector<SqlRow>> FaultyStore::Query(std::string_view sql,
                                               const std::vector<SqlValue>& params) {
  return state_->Run(StoreOp::kQuery, [&] { return target().Query(sql, params); });
}

Result<std::vector<Record>> FaultyStore::ListStale(std::string_view route,
                                                   const std::vector<std::string>& sent_points,
                                                   int limit) {
  return state_->Run(StoreOp::kListStale,
                     [&] { return target().ListStale(route, sent_points, limit); });
}

Result<int> FaultyStore::Sweep(int batch, const std::vector<std::string>& sent_points) {
  return state_->Run(StoreOp::kSweep, [&] { return target().Sweep(batch, sent_points); });
}

}  // namespace idem::testing
