// server/idemd/payments/charge.h — the steps of a charge: what each answer of the store and of
// the provider decides, apart from the awaits between them (Payments::Execute, TakeOver).
// Synchronous: a step takes what was read or answered and returns the execution to finish with,
// or nothing to go on; the coroutines only await between them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "http/message.h"
#include "idem/clock.h"
#include "idem/engine.h"
#include "idem/heartbeat.h"
#include "idem/result.h"
#include "server/idemd/filter/filter.h"
#include "server/idemd/metrics.h"
#include "server/idemd/payments/provider.h"
#include "server/idemd/payments/table.h"

namespace idem::idemd {

// What a valid POST /v1/payments asks for.
struct PaymentRequest {
  std::string merchant_order_no;
  int64_t amount_minor = 0;
  std::string currency;
};

// `status` (201 or 200) with PaymentBody and the payment's Location.
http::Response PaymentCreated(const Payment& payment, int status);

// What a charge's lease must cover when the charge is sent: the provider call's deadline, and a
// margin for the covered advance's store round trip and the time from it to the send. A send
// whose covered advance took longer than the margin to answer is not made (BeforeSend).
struct ChargeCover {
  Millis call_timeout;
  Millis margin;
};

// What the steps follow: the cover, and what the provider declares.
// `provider_deduplicates_by_key` ([provider] deduplicates_by_key): a repeated charge with the
// same reference charges at most once, so a charge whose outcome is unknown may be sent again at
// once. Otherwise an unknown outcome is sent again only once `settle` ([provider] settle_ms) has
// passed since the last send (Record::sent_at) and a lookup by reference still finds nothing;
// until then a retry gets the in-progress answer and the record stays PROCESSING for the
// takeover loop. Zero settles at once.
struct ChargeRules {
  ChargeCover cover;
  bool provider_deduplicates_by_key = false;
  Millis settle{0};
};

// Thread-safe. Borrows the clocks: `clock` stamps the payment rows, `monotonic` times the cover;
// and `metrics`, which counts the payment events written, when not null.
class ChargeSteps {
 public:
  ChargeSteps(Clock& clock, MonotonicClock& monotonic, ChargeRules rules,
              Metrics* metrics = nullptr);

  const ChargeRules& Rules() const { return rules_; }

  // After the claim, with the record's payment as read (`loaded`) and, for a key that answers
  // from another key's payment (kExisting), what this request asks for: an answer, or nothing
  // with the payment to charge in *out.
  std::optional<Execution> Prepared(const Ticket& ticket, Result<std::optional<Payment>> loaded,
                                    const std::optional<PaymentRequest>& asked, Payment* out) const;
  // Whether an execution asks the provider for its charge before sending one: a resumed one
  // whose charge may have left, or whose attempt was abandoned (in case that charge landed).
  static bool LooksUpFirst(const Ticket& ticket);
  // Whether this execution's claim inserted its payment and made the covered advance to
  // charge_sent in its own transaction (Payments::OnClaim): a new operation, not resumed.
  static bool ClaimedAfresh(const Ticket& ticket);
  // What the lookup found: an answer, or nothing when the charge is to be sent. Nothing found
  // after a send whose outcome is unknown proves nothing while that send has not settled.
  std::optional<Execution> Found(const Ticket& ticket, const Payment& payment,
                                 Result<std::optional<Charge>> found) const;
  // What must hold before the charge is sent (on the pool): the lease, the covered advance
  // within the margin, the after_charge_sent failpoint. An answer when the charge must not go.
  // `covered`: the claim made the covered advance (OnClaim), no earlier than *advanced; unless
  // half the margin has gone since, it serves; otherwise the advance is made here and *advanced
  // is set to when it was asked for.
  std::optional<Execution> BeforeSend(Ticket& ticket, const Payment& payment, Engine& engine,
                                      Heartbeat& heartbeat, bool covered,
                                      SteadyTime* advanced) const;
  // Whether the charge may go at once, on the calling (I/O) thread, without BeforeSend: exactly
  // when BeforeSend would neither call the store nor stop the send. The claim made the covered
  // advance (`covered`, no earlier than `advanced`) at most half the margin ago, the heartbeat
  // holds the lease with no renewal due (`held`: Heartbeat::CheckIfNothingDue), and no failpoint
  // is armed. Otherwise BeforeSend runs on the pool first, and waits there in the queue with the
  // claims and completions. Counts the send's cover when it answers true.
  bool SendsUnderTheClaimsCover(bool covered, SteadyTime advanced,
                                const std::optional<Status>& held) const;
  // How long the send may still take to leave, counted from the covered advance at `advanced`.
  Millis SendWithin(SteadyTime advanced) const;
  // What the charge's answer (and the after_provider_charge failpoint's status) settles.
  Execution AfterSend(const Ticket& ticket, Payment payment, Status failpoint,
                      Result<ChargeResult> charged) const;
  // The takeover loop, with the record's payment as read: an answer, or nothing when the charge is
  // to be looked up (the record is at charge_sent).
  std::optional<Execution> TakeOverLoaded(const Ticket& ticket,
                                          const Result<std::optional<Payment>>& loaded) const;
  // The takeover loop, with what the lookup found.
  Execution TakeOverFound(const Ticket& ticket, const Payment& payment,
                          Result<std::optional<Charge>> found) const;

 private:
  // How long until the last send of `record` has settled, or nothing when it has, or when the
  // provider deduplicates by key.
  std::optional<Millis> Unsettled(const Record& record) const;
  // Whether a claim's covered advance made at `advanced` still serves a send: at most half the
  // margin has gone since (BeforeSend and SendsUnderTheClaimsCover ask the same question).
  bool CoverIsFresh(SteadyTime advanced) const;
  // idem_charge_covers_total{cover}, when metrics are counted.
  void CountCover(SendCover cover) const;
  // The 201, with the payment row marked succeeded and payment.succeeded in the outbox, in the
  // completion's transaction (events.h).
  Execution Succeeded(Payment payment, const Charge& charge) const;
  // The final 402, with the payment row marked declined and payment.failed in the outbox, in the
  // completion's transaction.
  Execution Declined(const Ticket& ticket, Payment payment) const;
  // A retryable failure that gives the attempt up: the payment row becomes `abandoned` (it no
  // longer holds its merchant order) and the record resumes at `abandoned`, in the completion's
  // transaction. Only for an attempt that charged nothing: before the send, after a send that
  // provably never left or a declared 5xx, or after a lookup found nothing once the send was
  // settled.
  Execution Abandoned(const Payment& payment, http::Response response) const;
  // Whether an earlier send of this payment's charge, whose outcome was unknown when this
  // attempt was claimed, may still land: the ticket resumed at charge_sent, its send not settled
  // by `settle` — whether or not the provider deduplicates by key, which protects a second send
  // of this payment's reference, never a charge of another payment of the same order.
  bool EarlierSendMayLand(const Ticket& ticket) const;
  // An attempt that charged nothing itself: Abandoned, unless an earlier send may still land;
  // then retryable at charge_sent with the payment still pending, so its order stays held and no
  // other payment of the order is charged meanwhile.
  Execution NothingSent(const Ticket& ticket, const Payment& payment,
                        http::Response response) const;
  // What a charge that the provider found by the payment's reference settles: success only for
  // this payment's succeeded charge, the final 402 for its declined one, an unresolved outcome
  // for anything else.
  Execution FromFoundCharge(const Ticket& ticket, Payment payment, const Charge& charge) const;

  Clock& clock_;
  MonotonicClock& monotonic_;
  const ChargeRules rules_;
  Metrics* metrics_;
};

}  // namespace idem::idemd
