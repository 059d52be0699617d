// server/idemd/filter/timed.h — the store and the provider, timed: decorators that observe how long
// each call takes into Metrics (idem_store_operation_duration_seconds{operation},
// idem_provider_request_duration_seconds{operation}) and change nothing else.
#pragma once

#include <memory>

#include "idem/store.h"
#include "server/idemd/metrics.h"
#include "server/idemd/payments/provider.h"

namespace idem::idemd {

// Owns `target`; borrows `metrics` and `monotonic`, which must outlive it. Every call of the store
// and of the transactions it begins is forwarded and timed, failures included, under the name of
// its method; ReadCached and KeepFinished (no I/O) are forwarded untimed. As thread-safe as the
// target.
std::unique_ptr<Store> MakeTimedStore(std::unique_ptr<Store> target, Metrics& metrics,
                                      MonotonicClock& monotonic);

// Borrows everything; as thread-safe as the target. Each call is timed from its start to its
// answer, failures included.
class TimedProvider final : public Provider {
 public:
  TimedProvider(Provider& target, Metrics& metrics, MonotonicClock& monotonic)
      : target_(target), metrics_(metrics), monotonic_(monotonic) {}

  http::Async<Result<ChargeResult>> CreateCharge(const std::string& reference,
                                                 const std::string& amount,
                                                 const std::string& currency, Millis send_within,
                                                 const std::string& traceparent) override;
  http::Async<Result<std::optional<Charge>>> FindCharge(const std::string& reference,
                                                        const std::string& traceparent) override;
  http::Async<Result<ChargePage>> ListCharges(int64_t gte_ms, int64_t lt_ms, int limit,
                                              const std::string& starting_after) override;
  http::Async<Result<Refund>> RefundCharge(const std::string& key, const std::string& charge,
                                           const std::string& amount,
                                           const std::string& reason) override;

 private:
  Provider& target_;
  Metrics& metrics_;
  MonotonicClock& monotonic_;
};

}  // namespace idem::idemd
