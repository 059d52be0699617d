// tests/sim/sim_provider.h — the simulator's payment provider: idemd's Provider interface, in
// simulated time, failing in every way the provider contract allows (docs/idemd.md): a decline; a
// 5xx that did nothing; a 5xx that did the work, now or later; the answer lost after the work (a
// timeout, a reset connection); the work landing after the caller gave up; a request that never
// left; lookups that time out, fail or answer garbage, and that find nothing while a late charge
// has not landed yet; the provider's own duplicate (one request charged twice) and charges made by
// hand that no payment asked for; listings that repeat a page, fail, or do not show a charge yet
// (its index lags); refunds that fail, lose their answer or land late. It charges by reference
// (the payment's id) and honours idempotency keys or not, as the schedule says. Each fault is
// drawn from the schedule's random stream.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "server/idemd/payments/provider.h"
#include "tests/sim/sim_common.h"

namespace idem::sim {

// What a charge request met at the provider (the words of the trace).
enum class ChargeFault {
  kCharged,             // charged, answered 201
  kDeclined,            // declined, answered 402
  kFailedNothing,       // a 5xx the provider declares as "nothing charged"
  kFailedCharged,       // a 5xx after it charged
  kFailedChargesLater,  // a 5xx, and the charge lands later all the same
  kLostAfterCharge,     // charged, and the connection reset before the answer
  kTimeoutCharged,      // charged, and no answer by the call's deadline
  kTimeoutLandsLate,    // no answer by the deadline; the charge lands later
  kNeverLeft,           // the request never left (nothing charged)
  kChargedTwice,        // charged twice (the provider's own duplicate), answered 201 with one
};
const char* ChargeFaultName(ChargeFault fault);

// What a lookup by reference met.
enum class LookupFault { kAnswered, kFailed, kTimeout, kGarbage };
const char* LookupFaultName(LookupFault fault);

// What a page of the listing met: answered, answered starting before its cursor (charges already
// seen, again), or failed as a lookup does.
enum class ListFault { kAnswered, kRepeats, kFailed, kTimeout, kGarbage };
const char* ListFaultName(ListFault fault);

// What a refund met.
enum class RefundFault {
  kRefunded,         // refunded, answered 200
  kFailedNothing,    // a 5xx, nothing refunded
  kFailedRefunded,   // a 5xx after it refunded
  kTimeoutRefunded,  // refunded, no answer by the deadline
  kTimeoutLandsLate  // no answer by the deadline; the refund lands later (if anything is left)
};
const char* RefundFaultName(RefundFault fault);

struct SimCharge {
  std::string id;
  std::string reference;
  std::string amount;
  std::string currency;
  std::string status;  // "succeeded" or "declined"
  int64_t created_at_ms = 0;
  bool refunded = false;
  int64_t listed_at_ms = 0;  // from when the listing shows it (its index lags its creation)
  bool doubled = false;      // the provider's own second charge of one request
  bool by_hand = false;      // made by hand on the provider's console: no payment asked for it
};

// Single-threaded: the simulator's one thread calls it, and its coroutines run on the
// simulator's event loops. Borrows `clock` (the world's time), `rng` and `log`.
class SimProvider final : public idemd::Provider {
 public:
  struct Options {
    bool honours_keys = false;
    Millis call_timeout{1000};   // the provider call's deadline ([provider] timeout_ms)
    Millis lands_within{2400};   // the longest a charge takes to land after it left
    Millis listed_within{3000};  // the longest the listing takes to show a charge
  };
  SimProvider(Options options, const Clock& clock, std::mt19937_64& rng,
              std::function<void(const std::string&)> log);

  // Faults are drawn only while on (the schedule's fault phase); off, every call succeeds.
  void SetFaults(bool on) { faults_ = on; }
  // At once: calls answer without waiting (the takeover loop's calls, made from plain code).
  void SetAtOnce(bool at_once) { delays_.SetAtOnce(at_once); }
  // Lands the charges due by now.
  void Tick();
  // Lands every charge still to land.
  void LandAll();
  // Every charge landed, by reference, declined ones included, oldest first.
  const std::map<std::string, std::vector<SimCharge>>& Charges() const { return charges_; }
  // Someone charges `reference` by hand on the provider's console, now.
  void ChargeByHand(const std::string& reference, const std::string& amount,
                    const std::string& currency);

  http::Async<Result<idemd::ChargeResult>> CreateCharge(const std::string& reference,
                                                        const std::string& amount,
                                                        const std::string& currency,
                                                        Millis send_within,
                                                        const std::string& traceparent) override;
  http::Async<Result<std::optional<idemd::Charge>>> FindCharge(
      const std::string& reference, const std::string& traceparent) override;
  http::Async<Result<idemd::ChargePage>> ListCharges(int64_t gte_ms, int64_t lt_ms, int limit,
                                                     const std::string& starting_after) override;
  http::Async<Result<idemd::Refund>> RefundCharge(const std::string& key, const std::string& charge,
                                                  const std::string& amount,
                                                  const std::string& reason) override;

 private:
  struct Request {
    std::string reference;
    std::string amount;
    std::string currency;
  };
  struct Pending {
    Timestamp at;
    Request request;
  };
  struct PendingRefund {
    Timestamp at;
    std::string key;
    idemd::Refund refund;
  };
  // Charges landed for `reference`, oldest first.
  std::vector<SimCharge> ChargesOf(const std::string& reference) const;
  // Whether a charge for `reference` has left and not landed yet.
  bool Landing(const std::string& reference) const;
  // Makes the charge `request` asks for, with `status` (honouring keys: finds the one made).
  SimCharge Make(const Request& request, const std::string& status);
  // Makes a charge whatever the keys say.
  SimCharge MakeNew(const Request& request, const std::string& status);
  // Refunds `charge` in full if nothing of it is refunded; whether it did.
  bool Refund(SimCharge& charge);
  SimCharge* Find(const std::string& charge);
  idemd::Charge ToCharge(const SimCharge& c) const;

  Options options_;
  const Clock& clock_;
  std::mt19937_64& rng_;
  std::function<void(const std::string&)> log_;
  bool faults_ = true;
  SimDelays delays_{rng_};
  int next_id_ = 0;
  std::map<std::string, std::vector<SimCharge>> charges_;  // by reference
  std::vector<Pending> pending_;
  std::vector<PendingRefund> pending_refunds_;
  std::map<std::string, idemd::Refund> refunds_;  // by idempotency key (honouring keys)
};

}  // namespace idem::sim
