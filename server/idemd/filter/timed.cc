// server/idemd/filter/timed.cc — the timing decorators of the store and the provider.
#include "server/idemd/filter/timed.h"

namespace idem::idemd {
namespace {

// Times one call: observed when it goes out of scope, whatever the call returned.
class Timer {
 public:
  Timer(Metrics& metrics, MonotonicClock& monotonic, StoreOperation operation)
      : metrics_(metrics), monotonic_(monotonic), operation_(operation), began_(monotonic.Now()) {}
  ~Timer() { metrics_.ObserveStore(operation_, monotonic_.SecondsSince(began_)); }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

 private:
  Metrics& metrics_;
  MonotonicClock& monotonic_;
  StoreOperation operation_;
  SteadyTime began_;
};

class TimedTxn final : public StoreTxn {
 public:
  TimedTxn(std::unique_ptr<StoreTxn> target, Metrics& metrics, MonotonicClock& monotonic)
      : target_(std::move(target)), metrics_(metrics), monotonic_(monotonic) {}

  Result<ClaimResult> Claim(const ClaimSpec& spec) override {
    Timer timer = Time(StoreOperation::kClaim);
    return target_->Claim(spec);
  }
  Result<Record> Reclaim(const ClaimSpec& spec, int64_t seen_fence) override {
    Timer timer = Time(StoreOperation::kReclaim);
    return target_->Reclaim(spec, seen_fence);
  }
  Result<Lease> Renew(const ScopeHash& scope, const Lease& lease, Millis ttl) override {
    Timer timer = Time(StoreOperation::kRenew);
    return target_->Renew(scope, lease, ttl);
  }
  Status Advance(const ScopeHash& scope, const Lease& lease, std::string_view point,
                 std::string_view resource_id) override {
    Timer timer = Time(StoreOperation::kAdvance);
    return target_->Advance(scope, lease, point, resource_id);
  }
  Status AdvanceCovered(const ScopeHash& scope, const Lease& lease, std::string_view point,
                        Millis must_cover) override {
    Timer timer = Time(StoreOperation::kAdvanceCovered);
    return target_->AdvanceCovered(scope, lease, point, must_cover);
  }
  Status Finish(const ScopeHash& scope, const Lease& lease, const Outcome& outcome) override {
    Timer timer = Time(StoreOperation::kFinish);
    return target_->Finish(scope, lease, outcome);
  }
  // Only an operator's tool settles: not timed.
  Status Settle(const ScopeHash& scope, int64_t seen_fence, const Outcome& outcome) override {
    return target_->Settle(scope, seen_fence, outcome);
  }
  Result<std::optional<Record>> Get(const ScopeHash& scope) override {
    Timer timer = Time(StoreOperation::kGet);
    return target_->Get(scope);
  }
  Result<int64_t> Count(std::string_view tenant, std::string_view user,
                        std::optional<RecordState> state, int64_t limit) override {
    Timer timer = Time(StoreOperation::kCount);
    return target_->Count(tenant, user, state, limit);
  }
  Result<std::vector<SqlRow>> Exec(std::string_view sql,
                                   const std::vector<SqlValue>& params) override {
    Timer timer = Time(StoreOperation::kExec);
    return target_->Exec(sql, params);
  }
  Status Commit() override {
    Timer timer = Time(StoreOperation::kCommit);
    return target_->Commit();
  }

 private:
  Timer Time(StoreOperation operation) { return Timer(metrics_, monotonic_, operation); }

  std::unique_ptr<StoreTxn> target_;
  Metrics& metrics_;
  MonotonicClock& monotonic_;
};

class TimedStore final : public Store {
 public:
  TimedStore(std::unique_ptr<Store> target, Metrics& metrics, MonotonicClock& monotonic)
      : target_(std::move(target)), metrics_(metrics), monotonic_(monotonic) {}

  Result<std::unique_ptr<Subscription>> SubscribeFinished(
      std::function<void(const ScopeHash&)> on_finished) override {
    return target_->SubscribeFinished(std::move(on_finished));
  }
  const StoreCapabilities& capabilities() const override { return target_->capabilities(); }
  Status Ping(Millis timeout) override {
    Timer timer = Time(StoreOperation::kPing);
    return target_->Ping(timeout);
  }
  Result<std::unique_ptr<StoreTxn>> Begin() override {
    Timer timer = Time(StoreOperation::kBegin);
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, target_->Begin());
    return std::unique_ptr<StoreTxn>(
        std::make_unique<TimedTxn>(std::move(txn), metrics_, monotonic_));
  }
  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    Timer timer = Time(StoreOperation::kRead);
    return target_->Read(scope);
  }
  std::optional<Record> ReadCached(const ScopeHash& scope) override {
    return target_->ReadCached(scope);
  }
  void KeepFinished(const Record& record, SteadyTime as_of) override {
    target_->KeepFinished(record, as_of);
  }
  Result<std::vector<SqlRow>> Query(std::string_view sql,
                                    const std::vector<SqlValue>& params) override {
    Timer timer = Time(StoreOperation::kQuery);
    return target_->Query(sql, params);
  }
  Result<std::vector<Record>> ListStale(std::string_view route,
                                        const std::vector<std::string>& sent_points,
                                        int limit) override {
    Timer timer = Time(StoreOperation::kListStale);
    return target_->ListStale(route, sent_points, limit);
  }
  Result<std::vector<Record>> ListHeld(std::string_view route, int limit) override {
    return target_->ListHeld(route, limit);  // an operator's tool's: not timed
  }
  Result<int> Sweep(int batch, const std::vector<std::string>& sent_points) override {
    Timer timer = Time(StoreOperation::kSweep);
    return target_->Sweep(batch, sent_points);
  }
  Result<RecordCensus> Census() override {
    Timer timer = Time(StoreOperation::kCensus);
    return target_->Census();
  }

 private:
  Timer Time(StoreOperation operation) { return Timer(metrics_, monotonic_, operation); }

  std::unique_ptr<Store> target_;
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
