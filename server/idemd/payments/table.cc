// server/idemd/payments/table.cc — the payments table and its values (table.h).
#include "server/idemd/payments/table.h"

#include <algorithm>
#include <array>
#include <boost/json.hpp>

#include "http/message.h"
#include "idem/canonical.h"
#include "idem/key.h"

namespace idem::idemd {
namespace {

constexpr int64_t kMaxMinorUnits = 1'000'000'000'000'000LL;  // 10^18: fits int64 with room

}  // namespace

const std::vector<Migration>& PaymentsMigrations() {
  static const std::vector<Migration> kMigrations = {
      {1, R"sql(
CREATE TABLE payments (
  id                 TEXT PRIMARY KEY,
  tenant             TEXT NOT NULL,
  merchant_order_no  TEXT NOT NULL,
  amount_minor       BIGINT NOT NULL CHECK (amount_minor > 0),
  currency           TEXT NOT NULL,
  status             TEXT NOT NULL
                     CHECK (status IN ('pending', 'succeeded', 'declined')),
  provider_charge_id TEXT,
  created_at         BIGINT NOT NULL,
  updated_at         BIGINT NOT NULL,
  UNIQUE (tenant, merchant_order_no)
);
)sql"},
      // An abandoned attempt (no charge found after its lease ended) stops holding its merchant
      // order: one live payment per order, any number of abandoned ones. The table is rebuilt,
      // the one way to drop a UNIQUE constraint on SQLite too.
      {2, R"sql(
CREATE TABLE payments_v2 (
  id                 TEXT PRIMARY KEY,
  tenant             TEXT NOT NULL,
  merchant_order_no  TEXT NOT NULL,
  amount_minor       BIGINT NOT NULL CHECK (amount_minor > 0),
  currency           TEXT NOT NULL,
  status             TEXT NOT NULL
                     CHECK (status IN ('pending', 'succeeded', 'declined', 'abandoned')),
  provider_charge_id TEXT,
  created_at         BIGINT NOT NULL,
  updated_at         BIGINT NOT NULL
);
INSERT INTO payments_v2 (id, tenant, merchant_order_no, amount_minor, currency, status,
                         provider_charge_id, created_at, updated_at)
  SELECT id, tenant, merchant_order_no, amount_minor, currency, status, provider_charge_id,
         created_at, updated_at FROM payments;
DROP TABLE payments;
ALTER TABLE payments_v2 RENAME TO payments;
CREATE UNIQUE INDEX payments_live_order ON payments (tenant, merchant_order_no)
  WHERE status <> 'abandoned';
)sql"},
      // Version 3 made the books' tables, which are now the books' own migrations
      // (BooksMigrations, books.cc); a database that has them keeps them.
      // A payment's id is derived from its merchant order and how many payments the order had
      // (PaymentIdFor): the claim counts them, abandoned ones included, through this index.
      // The database's payment namespace, drawn once (PaymentsNamespace), travels with its
      // backups and replicas.
      {4, R"sql(
CREATE INDEX payments_order ON payments (tenant, merchant_order_no);
CREATE TABLE payments_namespace (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  id        TEXT NOT NULL
);
)sql"},
  };
  return kMigrations;
}

Result<std::string> PaymentsNamespace(Store& store, Random& random) {
  std::array<uint8_t, 16> drawn;
  random.Fill(drawn);
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store.Begin());
  IDEM_RETURN_IF_ERROR(txn->Exec(
      "INSERT INTO payments_namespace (singleton, id) VALUES (1, ?) ON CONFLICT DO NOTHING",
      {ToHex(drawn)}));
  IDEM_ASSIGN_OR_RETURN(auto rows, txn->Exec("SELECT id FROM payments_namespace", {}));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  if (rows.size() != 1 || Text(rows[0][0]).empty()) {
    return MakeError(Errc::kDataLoss, "payments_namespace holds no id");
  }
  return Text(rows[0][0]);
}

std::vector<std::string> PaymentsSentPoints() { return {std::string(kChargeSent)}; }

// Exact decimal text (CanonicalDecimal output) → minor units, or an error message. Zero only
// when `allow_zero`.
std::optional<std::string> ToMinor(const std::string& canonical, int digits, int64_t* out,
                                   bool allow_zero) {
  if (canonical.find('e') != std::string::npos) return "amount is out of range";
  if (!canonical.empty() && canonical[0] == '-') return "amount must be greater than 0";
  const std::size_t point = canonical.find('.');
  const std::string whole = canonical.substr(0, point);
  const std::string frac = point == std::string::npos ? "" : canonical.substr(point + 1);
  if (static_cast<int>(frac.size()) > digits) {
    return "amount has more than " + std::to_string(digits) + " decimal places for this currency";
  }
  if (whole.size() > 15) return "amount is out of range";
  int64_t minor = 0;
  for (char c : whole + frac + std::string(static_cast<std::size_t>(digits) - frac.size(), '0')) {
    minor = minor * 10 + (c - '0');
  }
  if (minor < 0 || (minor == 0 && !allow_zero)) return "amount must be greater than 0";
  if (minor >= kMaxMinorUnits) return "amount is out of range";
  *out = minor;
  return std::nullopt;
}

// The id of the `n`-th payment (from 0) of a merchant order in the database's namespace, derived
// from the business unique number, never drawn at random: the guide's downstream key (§2, §8). A
// claim lost after its charge left — a restored backup, a failover to a replica the commit had
// not reached — leaves the order with as many payments as before it, so the retry makes the
// same id again, and the provider, which gets the id as the charge's reference and idempotency
// key, recognises the charge instead of making another. The namespace keeps two databases
// (a second region, a staging copy started afresh) on one provider account apart. 96 bits of
// SHA-256 over a versioned, separated text.
std::string PaymentIdFor(std::string_view space, std::string_view tenant, std::string_view order,
                         int64_t n) {
  const std::string count = std::to_string(n);
  std::string text = "idem.payment.v1";
  for (std::string_view part : {space, tenant, order, std::string_view(count)}) {
    text += '\x1f';
    text += part;
  }
  return "pay_" + ToHex(Sha256({text}).data(), 12);
}

std::optional<int64_t> AmountInMinorUnits(std::string_view amount, std::string_view currency) {
  auto canonical = CanonicalDecimal(amount);
  int64_t minor = 0;
  if (!canonical || ToMinor(*canonical, MinorDigits(currency), &minor, true)) return std::nullopt;
  return minor;
}

std::string_view PaymentStatusName(PaymentStatus status) {
  switch (status) {
    case PaymentStatus::kPending:
      return "pending";
    case PaymentStatus::kSucceeded:
      return "succeeded";
    case PaymentStatus::kDeclined:
      return "declined";
    case PaymentStatus::kAbandoned:
      return "abandoned";
  }
  return "unknown";
}

Result<PaymentStatus> ParsePaymentStatus(std::string_view name) {
  for (PaymentStatus status : {PaymentStatus::kPending, PaymentStatus::kSucceeded,
                               PaymentStatus::kDeclined, PaymentStatus::kAbandoned}) {
    if (name == PaymentStatusName(status)) return status;
  }
  return MakeError(Errc::kDataLoss,
                   "a payment's status is none of the four: " + std::string(name.substr(0, 32)));
}

bool IsPaymentId(std::string_view reference) {
  constexpr std::string_view kPrefix = "pay_";
  return reference.size() == kPrefix.size() + 24 &&
         reference.substr(0, kPrefix.size()) == kPrefix &&
         std::all_of(reference.begin() + kPrefix.size(), reference.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

int MinorDigits(std::string_view currency) {
  return currency == "JPY" || currency == "KRW" ? 0 : 2;
}

std::string PaymentBody(const Payment& p) {
  namespace json = boost::json;
  json::object o;
  o["id"] = p.id;
  o["merchant_order_no"] = p.merchant_order_no;
  o["amount"] = FormatAmount(p.amount_minor, MinorDigits(p.currency));
  o["currency"] = p.currency;
  o["status"] = PaymentStatusName(p.status);
  o["provider_charge_id"] =
      p.provider_charge_id.empty() ? json::value(nullptr) : json::value(p.provider_charge_id);
  o["created_at"] = http::Rfc3339(p.created_at_ms);
  return json::serialize(o);
}

std::string FormatAmount(int64_t minor, int digits) {
  std::string s = std::to_string(minor);
  if (digits == 0) return s;
  if (static_cast<int>(s.size()) <= digits) {
    s.insert(0, static_cast<std::size_t>(digits) + 1 - s.size(), '0');
  }
  s.insert(s.size() - static_cast<std::size_t>(digits), ".");
  return s;
}

}  // namespace idem::idemd
