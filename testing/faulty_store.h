// testing/faulty_store.h — a Store decorator that injects faults chosen by a plan, for tests and
// the deterministic simulator (leveldb's EnvWrapper is the model). Never for production.
//
// FaultyStore forwards every call to the store it wraps, and the transactions it begins forward
// to the wrapped store's. It counts the calls that reach a database — Begin, Read, Query,
// ListStale, Sweep, Ping, and on a transaction each operation and Commit — numbering them 1, 2,
// ... in the order they arrive, and asks its FaultPlan what to do with each:
//   pass             forward it;
//   fail before      answer kUnavailable without forwarding: nothing was done;
//   delay            advance the injected FakeClock and/or call the delay hook (never sleep), then
//                    forward it: the call runs that much later on the store's clock;
//   answer late      forward it, then advance the clock and call the hook: the call ran on time,
//                    and its answer arrives that much later (a slow acknowledgment, a caller
//                    paused on its way back);
//   commit then fail for Commit (and Sweep, which commits on its own): forward it, and when it
//                    succeeded answer kDeadlineExceeded anyway — the data IS committed, and the
//                    caller is told the outcome is unknown (the dangerous case). For any other
//                    call it fails before.
// A plan is a pure function of the call's number and operation, so the same plan over the same
// sequence of calls injects the same faults. Thread-safe: calls from several threads are numbered
// in the order they take the store's lock (so only a single-threaded run is reproducible).
// SubscribeFinished, capabilities(), ReadCached, KeepFinished, Census and ListHeld pass through
// uncounted.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "idem/store.h"
#include "testing/fakes.h"

namespace idem::testing {

struct Fault {
  enum class Kind : uint8_t { kPass, kFailBefore, kDelay, kAnswerLate, kCommitThenFail };
  Kind kind = Kind::kPass;
  Millis delay{0};  // kDelay, kAnswerLate

  static Fault Pass() { return {}; }
  static Fault FailBefore() { return {Kind::kFailBefore, Millis(0)}; }
  static Fault Delay(Millis d) { return {Kind::kDelay, d}; }
  static Fault AnswerLate(Millis d) { return {Kind::kAnswerLate, d}; }
  static Fault CommitThenFail() { return {Kind::kCommitThenFail, Millis(0)}; }
  bool operator==(const Fault&) const = default;
};

// One counted call: its number among all calls of the store (from 1), its operation, and its
// number among the calls of that operation (from 1).
struct StoreCall {
  uint64_t n = 0;
  StoreOperation op = StoreOperation::kBegin;
  uint64_t n_of_op = 0;
};

// Decides the fault of each call. Value type; copies decide alike.
class FaultPlan {
 public:
  using Decide = std::function<Fault(const StoreCall&)>;

  // Every call passes.
  FaultPlan() = default;
  explicit FaultPlan(Decide decide) : decide_(std::move(decide)) {}

  // Each call faults with probability `rate` (0..1), decided from (seed, call number) alone: a
  // fault that fits the operation, chosen evenly — fail before, delay or answer late
  // (1..max_delay ms); for Commit and Sweep also commit then fail.
  static FaultPlan FromSeed(uint64_t seed, double rate, Millis max_delay = Millis(1000));
  // Call `n` (counting every operation, from 1) gets `fault`; every other call passes.
  static FaultPlan FailNth(uint64_t n, Fault fault);
  // The `n`th call of `op` gets `fault`; every other call passes.
  static FaultPlan FailNthOf(StoreOperation op, uint64_t n, Fault fault);

  Fault operator()(const StoreCall& call) const { return decide_ ? decide_(call) : Fault::Pass(); }

 private:
  Decide decide_;
};

// What the store injected: every call whose fault was not a pass, in order.
struct InjectedFault {
  StoreCall call;
  Fault fault;
  bool operator==(const InjectedFault& o) const {
    return call.n == o.call.n && call.op == o.call.op && call.n_of_op == o.call.n_of_op &&
           fault == o.fault;
  }
};

struct FaultyStoreOptions {
  FaultPlan plan;
  // A delay advances this clock (the store's, so the delayed call runs later by its time)...
  FakeClock* clock = nullptr;
  // ...and calls this hook, when set (e.g. to advance a monotonic clock too, or to let other
  // simulated actors run).
  std::function<void(const StoreCall&, Millis)> on_delay;
};

class FaultyStore final : public StoreWrapper {
 public:
  // Borrows `target`, which must outlive this store and every transaction begun through it.
  FaultyStore(Store& target, FaultyStoreOptions options);
  ~FaultyStore() override;

  // Replaces the plan; the call count continues.
  void SetPlan(FaultPlan plan);
  // Calls counted so far, and the faults injected so far.
  uint64_t Calls() const;
  std::vector<InjectedFault> Injected() const;

  // The counter and the plan, shared with the transactions this store began.
  class State;

 private:
  Status Around(StoreOperation op, const ForwardedCall& call) override;
  std::unique_ptr<StoreTxn> WrapTxn(std::unique_ptr<StoreTxn> txn) override;

  std::shared_ptr<State> state_;
};

}  // namespace idem::testing
