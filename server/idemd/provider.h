// server/idemd/provider.h — the downstream payment provider, behind an interface so tests, the
// simulator and other providers slot in.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "include/idem/result.h"
#include "server/http/client.h"

namespace idem::idemd {

struct Charge {
  std::string id;  // "ch_…"
  std::string reference;
  std::string amount;
  std::string currency;
  std::string status;
  int64_t created_at_ms = 0;    // by the provider's clock; 0 when it did not say
  std::string amount_refunded;  // "" when it did not say
};

// One page of GET /v1/charges by creation time.
struct ChargePage {
  std::vector<Charge> data;  // oldest first
  bool has_more = false;
};

struct Refund {
  std::string id;  // "re_…"
  std::string charge;
  std::string amount;
  std::string status;
};

struct ChargeResult {
  bool declined = false;  // the provider refused (402): final
  Charge charge;          // when not declined
};

// Thread-safe.
class Provider {
 public:
  virtual ~Provider() = default;
  // POST /v1/charges with Idempotency-Key = reference. Errors: kUnavailable when nothing was
  // charged (not sent, or a 5xx); kDeadlineExceeded when the request left and the outcome is
  // unknown; kDataLoss for an answer that is not the documented shape.
  virtual Result<ChargeResult> CreateCharge(const std::string& reference, const std::string& amount,
                                            const std::string& currency) = 0;
  // GET /v1/charges?reference=…: the charge, or nullopt if the provider has none.
  // Errors: kUnavailable / kDeadlineExceeded as above.
  virtual Result<std::optional<Charge>> FindCharge(const std::string& reference) = 0;
  // GET /v1/charges?created_gte=…&created_lt=…&limit=…[&starting_after=…]: charges created in
  // [gte_ms, lt_ms), oldest first, up to `limit` (1..100) after the charge `starting_after`.
  // Errors: kUnavailable / kDeadlineExceeded; kDataLoss for an answer of another shape.
  virtual Result<ChargePage> ListCharges(int64_t gte_ms, int64_t lt_ms, int limit,
                                         const std::string& starting_after) = 0;
  // POST /v1/refunds with Idempotency-Key = key: refunds `amount` of `charge`.
  // Errors: kNotFound (no such charge); kInvalidArgument (more than is left to refund);
  // kUnavailable (nothing refunded: not sent, or a 5xx); kDeadlineExceeded (outcome unknown);
  // kDataLoss.
  virtual Result<Refund> RefundCharge(const std::string& key, const std::string& charge,
                                      const std::string& amount, const std::string& reason) = 0;
};

Result<std::unique_ptr<Provider>> MakeHttpProvider(const std::string& base_url, Millis timeout);

}  // namespace idem::idemd
