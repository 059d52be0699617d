// server/idemd/provider.h — the downstream payment provider, behind an interface so tests, the
// simulator and other providers slot in.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "include/idem/result.h"
#include "server/http/client.h"

namespace idem::idemd {

struct Charge {
  std::string id;  // "ch_…"
  std::string reference;
  std::string amount;
  std::string currency;
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
};

Result<std::unique_ptr<Provider>> MakeHttpProvider(const std::string& base_url, Millis timeout);

}  // namespace idem::idemd
