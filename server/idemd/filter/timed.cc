// server/idemd/filter/timed.cc — the timing decorators of the store and the provider.
#include "server/idemd/filter/timed.h"

namespace idem::idemd {
namespace {

// Times each call of `operation` that is one of kTimedStoreOperations, whatever it answers.
Status TimeAround(Metrics& metrics, MonotonicClock& monotonic, StoreOperation operation,
                  const ForwardedCall& call) {
  if (!IsTimedStoreOperation(operation)) return call();  // an operator's tool's: not timed
  const SteadyTime began = monotonic.Now();
  Status status = call();
  metrics.ObserveStore(operation, monotonic.SecondsSince(began));
  return status;
}

class TimedTxn final : public StoreTxnWrapper {
 public:
  TimedTxn(std::unique_ptr<StoreTxn> target, Metrics& metrics, MonotonicClock& monotonic)
      : StoreTxnWrapper(std::move(target)), metrics_(metrics), monotonic_(monotonic) {}

 private:
  Status Around(StoreOperation operation, const ForwardedCall& call) override {
    return TimeAround(metrics_, monotonic_, operation, call);
  }

  Metrics& metrics_;
  MonotonicClock& monotonic_;
};

class TimedStore final : public StoreWrapper {
 public:
  TimedStore(std::unique_ptr<Store> target, Metrics& metrics, MonotonicClock& monotonic)
      : StoreWrapper(std::move(target)), metrics_(metrics), monotonic_(monotonic) {}

 private:
  Status Around(StoreOperation operation, const ForwardedCall& call) override {
    return TimeAround(metrics_, monotonic_, operation, call);
  }
  std::unique_ptr<StoreTxn> WrapTxn(std::unique_ptr<StoreTxn> txn) override {
    return std::make_unique<TimedTxn>(std::move(txn), metrics_, monotonic_);
  }

  Metrics& metrics_;
  MonotonicClock& monotonic_;
};

}  // namespace

std::unique_ptr<Store> MakeTimedStore(std::unique_ptr<Store> target, Metrics& metrics,
                                      MonotonicClock& monotonic) {
  return std::make_unique<TimedStore>(std::move(target), metrics, monotonic);
}

http::Async<Result<ChargeResult>> TimedProvider::CreateCharge(const std::string& reference,
                                                              const std::string& amount,
                                                              const std::string& currency,
                                                              Millis send_within,
                                                              const std::string& traceparent) {
  const SteadyTime began = monotonic_.Now();
  Result<ChargeResult> answer =
      co_await target_.CreateCharge(reference, amount, currency, send_within, traceparent);
  metrics_.ObserveProvider(ProviderOperation::kCharge, monotonic_.SecondsSince(began));
  co_return answer;
}

http::Async<Result<std::optional<Charge>>> TimedProvider::FindCharge(
    const std::string& reference, const std::string& traceparent) {
  const SteadyTime began = monotonic_.Now();
  Result<std::optional<Charge>> answer = co_await target_.FindCharge(reference, traceparent);
  metrics_.ObserveProvider(ProviderOperation::kLookup, monotonic_.SecondsSince(began));
  co_return answer;
}

http::Async<Result<ChargePage>> TimedProvider::ListCharges(int64_t gte_ms, int64_t lt_ms, int limit,
                                                           const std::string& starting_after) {
  const SteadyTime began = monotonic_.Now();
  Result<ChargePage> answer = co_await target_.ListCharges(gte_ms, lt_ms, limit, starting_after);
  metrics_.ObserveProvider(ProviderOperation::kListCharges, monotonic_.SecondsSince(began));
  co_return answer;
}

http::Async<Result<Refund>> TimedProvider::RefundCharge(const std::string& key,
                                                        const std::string& charge,
                                                        const std::string& amount,
                                                        const std::string& reason) {
  const SteadyTime began = monotonic_.Now();
  Result<Refund> answer = co_await target_.RefundCharge(key, charge, amount, reason);
  metrics_.ObserveProvider(ProviderOperation::kRefund, monotonic_.SecondsSince(began));
  co_return answer;
}

}  // namespace idem::idemd
