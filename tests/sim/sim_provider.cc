// tests/sim/sim_provider.cc — the simulator's payment provider.
#include "tests/sim/sim_provider.h"

#include <algorithm>

#include "http/async.h"

namespace idem::sim {

const char* ChargeFaultName(ChargeFault fault) {
  switch (fault) {
    case ChargeFault::kCharged:
      return "charged";
    case ChargeFault::kDeclined:
      return "declined";
    case ChargeFault::kFailedNothing:
      return "5xx, nothing charged (declared)";
    case ChargeFault::kFailedCharged:
      return "5xx after it charged";
    case ChargeFault::kFailedChargesLater:
      return "5xx, and the charge lands later";
    case ChargeFault::kLostAfterCharge:
      return "charged, then the connection reset";
    case ChargeFault::kTimeoutCharged:
      return "charged, no answer by the deadline";
    case ChargeFault::kTimeoutLandsLate:
      return "no answer by the deadline, the charge lands later";
    case ChargeFault::kNeverLeft:
      return "never left";
    case ChargeFault::kChargedTwice:
      return "charged twice (the provider's own duplicate)";
  }
  return "?";
}

const char* LookupFaultName(LookupFault fault) {
  switch (fault) {
    case LookupFault::kAnswered:
      return "answered";
    case LookupFault::kFailed:
      return "5xx";
    case LookupFault::kTimeout:
      return "no answer by the deadline";
    case LookupFault::kGarbage:
      return "401 with an HTML page";
  }
  return "?";
}

const char* ListFaultName(ListFault fault) {
  switch (fault) {
    case ListFault::kAnswered:
      return "answered";
    case ListFault::kRepeats:
      return "a page that starts before its cursor";
    case ListFault::kFailed:
      return "5xx";
    case ListFault::kTimeout:
      return "no answer by the deadline";
    case ListFault::kGarbage:
      return "401 with an HTML page";
  }
  return "?";
}

const char* RefundFaultName(RefundFault fault) {
  switch (fault) {
    case RefundFault::kRefunded:
      return "refunded";
    case RefundFault::kFailedNothing:
      return "5xx, nothing refunded";
    case RefundFault::kFailedRefunded:
      return "5xx after it refunded";
    case RefundFault::kTimeoutRefunded:
      return "refunded, no answer by the deadline";
    case RefundFault::kTimeoutLandsLate:
      return "no answer by the deadline, the refund lands later";
  }
  return "?";
}

SimProvider::SimProvider(Options options, const Clock& clock, std::mt19937_64& rng,
                         std::function<void(const std::string&)> log)
    : options_(options), clock_(clock), rng_(rng), log_(std::move(log)) {}

void SimProvider::Tick() {
  const Timestamp now = clock_.Now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->at <= now) {
      const SimCharge made = Make(it->request, "succeeded");
      log_("provider: a late charge lands for " + it->request.reference + ": " + made.id);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = pending_refunds_.begin(); it != pending_refunds_.end();) {
    if (it->at <= now) {
      SimCharge* charge = Find(it->refund.charge);
      const bool made = charge != nullptr && Refund(*charge);
      if (made) refunds_[it->key] = it->refund;
      log_("provider: a late refund of " + it->refund.charge +
           " lands: " + (made ? "refunded" : "refused, nothing is left to refund"));
      it = pending_refunds_.erase(it);
    } else {
      ++it;
    }
  }
}

void SimProvider::LandAll() {
  for (Pending& p : pending_) p.at = clock_.Now();
  for (PendingRefund& p : pending_refunds_) p.at = clock_.Now();
  Tick();
}

void SimProvider::ChargeByHand(const std::string& reference, const std::string& amount,
                               const std::string& currency) {
  SimCharge& made =
      charges_[reference].emplace_back(MakeNew({reference, amount, currency}, "succeeded"));
  made.by_hand = true;
  log_("someone charges " + reference + " by hand at the provider: " + made.id);
}

std::vector<SimCharge> SimProvider::ChargesOf(const std::string& reference) const {
  auto it = charges_.find(reference);
  return it == charges_.end() ? std::vector<SimCharge>() : it->second;
}

bool SimProvider::Landing(const std::string& reference) const {
  return std::any_of(pending_.begin(), pending_.end(),
                     [&](const Pending& p) { return p.request.reference == reference; });
}

SimCharge SimProvider::Make(const Request& request, const std::string& status) {
  std::vector<SimCharge>& made = charges_[request.reference];
  if (options_.honours_keys && !made.empty()) return made.front();
  return made.emplace_back(MakeNew(request, status));
}

SimCharge SimProvider::MakeNew(const Request& request, const std::string& status) {
  const int64_t now = ToUnixMillis(clock_.Now());
  SimCharge c;
  c.id = "ch_" + std::to_string(++next_id_);
  c.reference = request.reference;
  c.amount = request.amount;
  c.currency = request.currency;
  c.status = status;
  c.created_at_ms = now;
  c.listed_at_ms = now + delays_.Below(options_.listed_within).count();
  return c;
}

SimCharge* SimProvider::Find(const std::string& charge) {
  for (auto& [reference, made] : charges_) {
    for (SimCharge& c : made) {
      if (c.id == charge) return &c;
    }
  }
  return nullptr;
}

bool SimProvider::Refund(SimCharge& charge) {
  if (charge.refunded || charge.status != "succeeded") return false;
  charge.refunded = true;
  return true;
}

idemd::Charge SimProvider::ToCharge(const SimCharge& c) const {
  return {c.id,
          c.reference,
          c.amount,
          c.currency,
          c.status,
          c.created_at_ms,
          c.refunded ? c.amount : std::string("0.00")};
}

http::Async<Result<idemd::ChargeResult>> SimProvider::CreateCharge(const std::string& reference,
                                                                   const std::string& amount,
                                                                   const std::string& currency,
                                                                   Millis send_within,
                                                                   const std::string&) {
  Tick();  // what landed by now, however time moved since the last step
  const Request request{reference, amount, currency};
  // As the HTTP client: the request leaves within send_within or not at all.
  if (send_within <= Millis(0)) {
    log_("provider: a charge for " + reference + " is not sent: its time to leave has passed");
    co_return MakeError(Errc::kUnavailable, "the charge did not leave in time");
  }
  using F = ChargeFault;
  F fault = F::kCharged;
  if (faults_) {
    static constexpr F kFaults[] = {F::kCharged,
                                    F::kCharged,
                                    F::kCharged,
                                    F::kDeclined,
                                    F::kFailedNothing,
                                    F::kFailedCharged,
                                    F::kFailedChargesLater,
                                    F::kLostAfterCharge,
                                    F::kTimeoutCharged,
                                    F::kTimeoutLandsLate,
                                    F::kNeverLeft,
                                    F::kChargedTwice};
    fault = kFaults[rng_() % std::size(kFaults)];
  }
  // A provider that honours keys answers a repeat as it answered the first, and refuses one
  // whose first is still executing (a retryable 409, as unknown as a 5xx).
  if (options_.honours_keys && fault != F::kNeverLeft) {
    if (Landing(reference)) {
      log_("provider: a charge for " + reference + " while its first still executes: 409");
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return idemd::ChargeResult::Unknown("409 conflict");
    }
    if (auto made = ChargesOf(reference); !made.empty()) {
      log_("provider: a repeated charge for " + reference +
           " answers its first: " + made.front().id);
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      if (made.front().status == "declined") co_return idemd::ChargeResult::Declined();
      co_return idemd::ChargeResult::Charged(ToCharge(made.front()));
    }
  }
  log_("provider: a charge for " + reference + ": " + ChargeFaultName(fault));
  auto lands_later = [&] {
    pending_.push_back({clock_.Now() + delays_.Below(options_.lands_within), request});
  };
  switch (fault) {
    case F::kCharged: {
      const SimCharge made = Make(request, "succeeded");
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return idemd::ChargeResult::Charged(ToCharge(made));
    }
    case F::kDeclined:
      Make(request, "declined");
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return idemd::ChargeResult::Declined();
    case F::kFailedNothing:
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return MakeError(Errc::kUnavailable, "503, nothing charged");
    case F::kFailedCharged:
      Make(request, "succeeded");
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return idemd::ChargeResult::Unknown("502");
    case F::kFailedChargesLater:
      lands_later();
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return idemd::ChargeResult::Unknown("502");
    case F::kLostAfterCharge:
      Make(request, "succeeded");
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return idemd::ChargeResult::Unknown("connection reset");
    case F::kTimeoutCharged:
      Make(request, "succeeded");
      co_await delays_.Wait(options_.call_timeout);
      co_return MakeError(Errc::kDeadlineExceeded, "no answer in time");
    case F::kTimeoutLandsLate:
      lands_later();
      co_await delays_.Wait(options_.call_timeout);
      co_return MakeError(Errc::kDeadlineExceeded, "no answer in time");
    case F::kNeverLeft:
      co_await delays_.Wait(delays_.Below(send_within));
      co_return MakeError(Errc::kUnavailable, "connection refused");
    case F::kChargedTwice: {
      const SimCharge made = Make(request, "succeeded");
      SimCharge& twice = charges_[reference].emplace_back(MakeNew(request, "succeeded"));
      twice.doubled = true;
      log_("provider: " + reference + " charged as " + made.id + " and again as " + twice.id);
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return idemd::ChargeResult::Charged(ToCharge(made));
    }
  }
  co_return MakeError(Errc::kInternal, "unreachable");
}

http::Async<Result<std::optional<idemd::Charge>>> SimProvider::FindCharge(const std::string& ref,
                                                                          const std::string&) {
  Tick();
  LookupFault fault = LookupFault::kAnswered;
  if (faults_) {
    static constexpr LookupFault kFaults[] = {LookupFault::kAnswered, LookupFault::kAnswered,
                                              LookupFault::kAnswered, LookupFault::kFailed,
                                              LookupFault::kTimeout,  LookupFault::kGarbage};
    fault = kFaults[rng_() % std::size(kFaults)];
  }
  switch (fault) {
    case LookupFault::kAnswered:
      break;
    case LookupFault::kFailed:
      log_("provider: a lookup of " + ref + ": 5xx");
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return MakeError(Errc::kUnavailable, "503");
    case LookupFault::kTimeout:
      log_("provider: a lookup of " + ref + ": no answer by the deadline");
      co_await delays_.Wait(options_.call_timeout);
      co_return MakeError(Errc::kDeadlineExceeded, "no answer in time");
    case LookupFault::kGarbage:
      log_("provider: a lookup of " + ref + ": 401 with an HTML page");
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return MakeError(Errc::kDataLoss, "401: not the documented shape");
  }
  // The answer is what the provider holds when the lookup arrives.
  const std::vector<SimCharge> made = ChargesOf(ref);
  log_("provider: a lookup of " + ref + " finds " +
       (made.empty() ? std::string("nothing") : made.front().id + " " + made.front().status) +
       (Landing(ref) ? " (a charge is still to land)" : ""));
  co_await delays_.Wait(delays_.Below(options_.call_timeout));
  if (made.empty()) co_return std::optional<idemd::Charge>();
  co_return std::optional<idemd::Charge>(ToCharge(made.front()));
}

http::Async<Result<idemd::ChargePage>> SimProvider::ListCharges(int64_t gte_ms, int64_t lt_ms,
                                                                int limit,
                                                                const std::string& starting_after) {
  Tick();
  ListFault fault = ListFault::kAnswered;
  if (faults_) {
    static constexpr ListFault kFaults[] = {
        ListFault::kAnswered, ListFault::kAnswered, ListFault::kAnswered, ListFault::kRepeats,
        ListFault::kFailed,   ListFault::kTimeout,  ListFault::kGarbage};
    fault = kFaults[rng_() % std::size(kFaults)];
  }
  const std::string page_of = "a page of the listing" +
                              (starting_after.empty() ? std::string() : " after " + starting_after);
  switch (fault) {
    case ListFault::kAnswered:
    case ListFault::kRepeats:
      break;
    case ListFault::kFailed:
      log_("provider: " + page_of + ": 5xx");
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return MakeError(Errc::kUnavailable, "503");
    case ListFault::kTimeout:
      log_("provider: " + page_of + ": no answer by the deadline");
      co_await delays_.Wait(options_.call_timeout);
      co_return MakeError(Errc::kDeadlineExceeded, "no answer in time");
    case ListFault::kGarbage:
      log_("provider: " + page_of + ": 401 with an HTML page");
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return MakeError(Errc::kDataLoss, "401: not the documented shape");
  }
  // What the index shows by now: a charge made a moment ago may not be there yet.
  const int64_t now = ToUnixMillis(clock_.Now());
  std::vector<SimCharge> all;
  for (const auto& [reference, made] : charges_) {
    for (const SimCharge& c : made) {
      if (c.created_at_ms >= gte_ms && c.created_at_ms < lt_ms && c.listed_at_ms <= now) {
        all.push_back(c);
      }
    }
  }
  std::sort(all.begin(), all.end(), [](const SimCharge& a, const SimCharge& b) {
    return a.created_at_ms != b.created_at_ms ? a.created_at_ms < b.created_at_ms : a.id < b.id;
  });
  auto from = all.begin();
  if (!starting_after.empty()) {
    from = std::find_if(all.begin(), all.end(),
                        [&](const SimCharge& c) { return c.id == starting_after; });
    if (from != all.end()) ++from;
  }
  if (fault == ListFault::kRepeats) {
    const auto back = std::min<std::ptrdiff_t>(from - all.begin(), 1 + rng_() % 2);
    from -= back;
    if (back > 0) {
      log_("provider: " + page_of + " starts " + std::to_string(back) + " charges before it");
    }
  }
  idemd::ChargePage page;
  for (; from != all.end() && static_cast<int>(page.data.size()) < limit; ++from) {
    page.data.push_back(ToCharge(*from));
  }
  page.has_more = from != all.end();
  co_await delays_.Wait(delays_.Below(options_.call_timeout));
  co_return page;
}

http::Async<Result<idemd::Refund>> SimProvider::RefundCharge(const std::string& key,
                                                             const std::string& charge,
                                                             const std::string& amount,
                                                             const std::string&) {
  Tick();
  if (options_.honours_keys) {
    if (auto it = refunds_.find(key); it != refunds_.end()) {
      log_("provider: a repeated refund " + key + " answers its first");
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return it->second;
    }
    if (std::any_of(pending_refunds_.begin(), pending_refunds_.end(),
                    [&](const PendingRefund& p) { return p.key == key; })) {
      log_("provider: a refund " + key + " while its first still executes: 409");
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return MakeError(Errc::kUnavailable, "409 conflict");
    }
  }
  SimCharge* c = Find(charge);
  if (c == nullptr) co_return MakeError(Errc::kNotFound, "no such charge");
  if (c->refunded || c->status != "succeeded" || amount != c->amount) {
    log_("provider: a refund of " + charge + " refused: more than is left to refund");
    co_await delays_.Wait(delays_.Below(options_.call_timeout));
    co_return MakeError(Errc::kInvalidArgument, "more than is left to refund");
  }
  RefundFault fault = RefundFault::kRefunded;
  if (faults_) {
    static constexpr RefundFault kFaults[] = {
        RefundFault::kRefunded,        RefundFault::kRefunded,
        RefundFault::kFailedNothing,   RefundFault::kFailedRefunded,
        RefundFault::kTimeoutRefunded, RefundFault::kTimeoutLandsLate};
    fault = kFaults[rng_() % std::size(kFaults)];
  }
  log_("provider: a refund of " + charge + ": " + RefundFaultName(fault));
  const idemd::Refund made{"re_" + std::to_string(++next_id_), charge, amount, "succeeded"};
  if (fault == RefundFault::kTimeoutLandsLate) {
    pending_refunds_.push_back({clock_.Now() + delays_.Below(options_.lands_within), key, made});
  } else if (fault != RefundFault::kFailedNothing) {
    Refund(*c);
    refunds_[key] = made;
  }
  switch (fault) {
    case RefundFault::kRefunded:
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return made;
    case RefundFault::kFailedNothing:
    case RefundFault::kFailedRefunded:
      co_await delays_.Wait(delays_.Below(options_.call_timeout));
      co_return MakeError(Errc::kUnavailable, "502");
    case RefundFault::kTimeoutRefunded:
    case RefundFault::kTimeoutLandsLate:
      co_await delays_.Wait(options_.call_timeout);
      co_return MakeError(Errc::kDeadlineExceeded, "no answer in time");
  }
  co_return MakeError(Errc::kInternal, "unreachable");
}

}  // namespace idem::sim
