// testing/faulty_store.cc — fault injection around any Store (see faulty_store.h).
#include "testing/faulty_store.h"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "idem/mutex.h"

namespace idem::testing {

namespace {

// SplitMix64's finaliser: a well-mixed 64-bit function of one 64-bit input.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The calls that commit on their own success: only these can commit and then fail.
bool Commits(StoreOperation op) {
  return op == StoreOperation::kCommit || op == StoreOperation::kSweep;
}

// The calls a FaultyStore counts: all but an operator's tool's and the census.
bool Counted(StoreOperation op) {
  return op != StoreOperation::kCensus && op != StoreOperation::kListHeld;
}

}  // namespace

FaultPlan FaultPlan::FromSeed(uint64_t seed, double rate, Millis max_delay) {
  const uint64_t delays = static_cast<uint64_t>(std::max<int64_t>(max_delay.count(), 1));
  return FaultPlan([=](const StoreCall& call) {
    const uint64_t h = Mix(seed ^ Mix(call.n));
    const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // uniform in [0, 1)
    if (u >= rate) return Fault::Pass();
    const uint64_t pick = Mix(h);
    const Millis delay(static_cast<int64_t>(1 + Mix(pick) % delays));
    switch (pick % (Commits(call.op) ? 4 : 3)) {
      case 0:
        return Fault::FailBefore();
      case 1:
        return Fault::Delay(delay);
      case 2:
        return Fault::AnswerLate(delay);
      default:
        return Fault::CommitThenFail();
    }
  });
}

FaultPlan FaultPlan::FailNth(uint64_t n, Fault fault) {
  return FaultPlan([=](const StoreCall& call) { return call.n == n ? fault : Fault::Pass(); });
}

FaultPlan FaultPlan::FailNthOf(StoreOperation op, uint64_t n, Fault fault) {
  return FaultPlan([=](const StoreCall& call) {
    return call.op == op && call.n_of_op == n ? fault : Fault::Pass();
  });
}

class FaultyStore::State {
 public:
  explicit State(FaultyStoreOptions options) : options_(std::move(options)) {}

  // Runs `call` (the call on the wrapped store or transaction) as the plan says for the next
  // call of `op`.
  Status Run(StoreOperation op, const ForwardedCall& call) {
    if (!Counted(op)) return call();
    const auto [counted, fault] = Next(op);
    if (fault.kind == Fault::Kind::kFailBefore ||
        (fault.kind == Fault::Kind::kCommitThenFail && !Commits(op))) {
      return MakeError(Errc::kUnavailable,
                       "fault injected: " + std::string(StoreOperationName(op)) +
                           " failed before it reached the store");
    }
    Status status = call();
    if (fault.kind == Fault::Kind::kAnswerLate) Delay(counted, fault.delay);
    if (fault.kind == Fault::Kind::kCommitThenFail && status.has_value()) {
      return MakeError(Errc::kDeadlineExceeded,
                       "fault injected: " + std::string(StoreOperationName(op)) +
                           " outcome unknown (it was committed; the answer was lost)");
    }
    return status;
  }

  void SetPlan(FaultPlan plan) {
    MutexLock lock(mu_);
    options_.plan = std::move(plan);
  }
  uint64_t Calls() const {
    MutexLock lock(mu_);
    return calls_;
  }
  std::vector<InjectedFault> Injected() const {
    MutexLock lock(mu_);
    return injected_;
  }

 private:
  // Numbers the call, asks the plan, records a fault and carries out a delay.
  std::pair<StoreCall, Fault> Next(StoreOperation op) {
    StoreCall call;
    Fault fault;
    {
      MutexLock lock(mu_);
      call.n = ++calls_;
      call.op = op;
      call.n_of_op = ++calls_of_op_[static_cast<std::size_t>(op)];
      fault = options_.plan(call);
      if (fault.kind == Fault::Kind::kPass) return {call, fault};
      injected_.push_back({call, fault});
    }
    if (fault.kind == Fault::Kind::kDelay) Delay(call, fault.delay);
    return {call, fault};
  }

  // Advances the clock and calls the delay hook: `call` is `d` late.
  void Delay(const StoreCall& call, Millis d) {
    FakeClock* clock = nullptr;
    std::function<void(const StoreCall&, Millis)> on_delay;
    {
      MutexLock lock(mu_);
      clock = options_.clock;
      on_delay = options_.on_delay;
    }
    if (clock != nullptr) clock->Advance(d);
    if (on_delay) on_delay(call, d);
  }

  mutable Mutex mu_;
  FaultyStoreOptions options_ IDEM_GUARDED_BY(mu_);
  uint64_t calls_ IDEM_GUARDED_BY(mu_) = 0;
  std::array<uint64_t, kStoreOperations> calls_of_op_ IDEM_GUARDED_BY(mu_) = {};
  std::vector<InjectedFault> injected_ IDEM_GUARDED_BY(mu_);
};

namespace {

// A transaction of the wrapped store, each operation and the commit counted and planned. A
// failure before Commit leaves the wrapped transaction uncommitted: it rolls back when this one
// is dropped.
class FaultyTxn final : public StoreTxnWrapper {
 public:
  FaultyTxn(std::unique_ptr<StoreTxn> target, std::shared_ptr<FaultyStore::State> state)
      : StoreTxnWrapper(std::move(target)), state_(std::move(state)) {}

 private:
  Status Around(StoreOperation op, const ForwardedCall& call) override {
    return state_->Run(op, call);
  }

  std::shared_ptr<FaultyStore::State> state_;
};

}  // namespace

FaultyStore::FaultyStore(Store& target, FaultyStoreOptions options)
    : StoreWrapper(target), state_(std::make_shared<State>(std::move(options))) {}

FaultyStore::~FaultyStore() = default;

void FaultyStore::SetPlan(FaultPlan plan) { state_->SetPlan(std::move(plan)); }
uint64_t FaultyStore::Calls() const { return state_->Calls(); }
std::vector<InjectedFault> FaultyStore::Injected() const { return state_->Injected(); }

Status FaultyStore::Around(StoreOperation op, const ForwardedCall& call) {
  return state_->Run(op, call);
}

std::unique_ptr<StoreTxn> FaultyStore::WrapTxn(std::unique_ptr<StoreTxn> txn) {
  return std::make_unique<FaultyTxn>(std::move(txn), state_);
}

}  // namespace idem::testing
