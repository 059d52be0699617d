// server/idemd/payments/table.h — the payments table and the values in it, apart from the
// route that writes them: its migrations, the database's payment namespace, payment ids, amounts
// in minor units, the recovery points past a charge. The books (books.h) and idemctl read the
// table through these without the route (the filter, the provider's charges).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "idem/clock.h"
#include "idem/store.h"

namespace idem::idemd {

// The payments table, an application migration of the store ("payments" component).
const std::vector<Migration>& PaymentsMigrations();

// The database's payment namespace, part of every payment id (see PaymentIdFor in payments.cc):
// drawn from `random` the first time, then read. Errors: the store's.
Result<std::string> PaymentsNamespace(Store& store, Random& random);

// The payments route's recovery points past the charge (RoutePolicy::sent_points), which the
// sweeper must leave to the takeover loop (Store::Sweep).
std::vector<std::string> PaymentsSentPoints();

// The recovery points of a payment's record. `claimed`: the payment row exists, nothing sent.
// `charge_sent`: the charge may have left (the route's one point past the send). `abandoned`:
// a lookup found no charge after the attempt's lease ended (or the provider declared its 5xx a
// proof), the payment row is `abandoned` and no longer holds its merchant order; a retry of the
// key takes the order back if it is still free. `existing`: the order belongs to another
// payment, which this key answers from.
inline constexpr std::string_view kClaimed = "claimed";
inline constexpr std::string_view kChargeSent = "charge_sent";
// (kAbandonedPoint: the point, apart from PaymentStatus::kAbandoned, the row's status.)
inline constexpr std::string_view kAbandonedPoint = "abandoned";
inline constexpr std::string_view kExisting = "existing";

// The status column of a payment: `pending` (holds its merchant order while it is charged),
// `succeeded`, `declined`, or `abandoned` (its attempt charged nothing and gave the order up).
enum class PaymentStatus : uint8_t { kPending, kSucceeded, kDeclined, kAbandoned };
// The stored spelling, also the `status` member of a payment's JSON: "pending", ...
std::string_view PaymentStatusName(PaymentStatus status);
// Errors: kDataLoss for a spelling that is none of the four (the table holds something foreign).
Result<PaymentStatus> ParsePaymentStatus(std::string_view name);

// A row of the payments table.
struct Payment {
  std::string id;
  std::string merchant_order_no;
  int64_t amount_minor = 0;
  std::string currency;
  PaymentStatus status = PaymentStatus::kPending;
  std::string provider_charge_id;
  int64_t created_at_ms = 0;
};

// A payment as POST and GET answer it (docs/openapi.yaml), and as its events carry it.
std::string PaymentBody(const Payment& payment);

// The id of the `n`-th payment (from 0) of a merchant order in the database's namespace `space`
// (PaymentsNamespace).
std::string PaymentIdFor(std::string_view space, std::string_view tenant, std::string_view order,
                         int64_t n);

// Exact decimal text (CanonicalDecimal output) → minor units with `digits` decimal places in
// *out, or an error message for the client. Zero only when `allow_zero`.
std::optional<std::string> ToMinor(const std::string& canonical, int digits, int64_t* out,
                                   bool allow_zero = false);

// A business column's text or integer; "" or 0 for NULL or another type.
inline std::string Text(const SqlValue& v) {
  const std::string* s = std::get_if<std::string>(&v);
  return s ? *s : std::string();
}
inline int64_t Integer(const SqlValue& v) {
  const int64_t* n = std::get_if<int64_t>(&v);
  return n ? *n : 0;
}

// Whether `reference` has the shape of a payment id idemd makes: "pay_" and 24 lower-case hex
// digits.
bool IsPaymentId(std::string_view reference);

// Minor-unit digits of a currency (0 for JPY and KRW, 2 otherwise).
int MinorDigits(std::string_view currency);
// "100.00" ← 10000 with 2 digits.
std::string FormatAmount(int64_t minor, int digits);
// "100.00" CNY → 10000, exactly; "0" → 0; nullopt for anything else (not a decimal, negative,
// more decimal places than the currency has).
std::optional<int64_t> AmountInMinorUnits(std::string_view amount, std::string_view currency);

}  // namespace idem::idemd
