// fuzz/canonical_fuzz.cc — canonical JSON (Canonicalize, CanonicalScalar, CanonicalDecimal) on
// arbitrary bytes, under no rules, idemd's payments rules and rules that reach nested paths.
//
// Properties:
// - canonical output is a fixed point: canonicalised again under the same rules, it is unchanged;
// - CanonicalScalar succeeds exactly when Canonicalize does;
// - member order does not matter: a document and the same document with every object's members
//   reversed canonicalise alike (or are refused alike);
// - CanonicalDecimal keeps the value (a correctly rounded strtod of input and output agree), its
//   output is a fixed point, and a bare number canonicalises to its CanonicalDecimal.
#include <boost/json.hpp>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz.h"
#include "idem/canonical.h"

namespace {

namespace json = boost::json;
using idem::CanonicalRules;

CanonicalRules Payments() {  // as server/idemd/payments/payments.cc sets them
  CanonicalRules r;
  r.money_fields = {"amount"};
  r.removed_fields = {"trace_id"};
  r.defaults = {{"description", "\"\""}, {"metadata", "{}"}};
  return r;
}

CanonicalRules Nested() {
  CanonicalRules r;
  r.version = 7;
  r.money_fields = {"a.b", "x", "payer.amount"};
  r.removed_fields = {"payer.trace_id", "a.c", "z"};
  r.defaults = {{"metadata.source", "\"api\""},
                {"payer", R"({"trace_id":1,"n":[1,2.50,"x"],"amount":"1e3"})"},
                {"a.b", "\"0.10\""}};
  return r;
}

void CheckRules(std::string_view text, const CanonicalRules& rules) {
  auto canonical = idem::Canonicalize(text, rules);
  auto scalar = idem::CanonicalScalar(text, "amount", rules);
  IDEM_FUZZ_CHECK(canonical.has_value() == scalar.has_value());
  if (!canonical) {
    const auto code = canonical.error().code;
    IDEM_FUZZ_CHECK(code == idem::Errc::kInvalidArgument || code == idem::Errc::kTooLarge);
    return;
  }
  auto again = idem::Canonicalize(*canonical, rules);
  IDEM_FUZZ_CHECK(again && *again == *canonical);
}

json::value Reversed(const json::value& v) {
  if (const json::object* o = v.if_object()) {
    json::object out;
    for (auto it = o->end(); it != o->begin();) {
      --it;
      out.emplace(it->key(), Reversed(it->value()));
    }
    return out;
  }
  if (const json::array* a = v.if_array()) {
    json::array out;
    for (const json::value& e : *a) out.push_back(Reversed(e));
    return out;
  }
  return v;
}

void CheckMemberOrder(std::string_view text) {
  json::error_code ec;
  const json::value v = json::parse(json::string_view(text.data(), text.size()), ec);
  if (ec) return;
  const CanonicalRules rules;
  auto forward = idem::Canonicalize(json::serialize(v), rules);
  auto backward = idem::Canonicalize(json::serialize(Reversed(v)), rules);
  IDEM_FUZZ_CHECK(forward.has_value() == backward.has_value());
  if (forward) IDEM_FUZZ_CHECK(*forward == *backward);
}

void CheckDecimal(std::string_view text) {
  auto decimal = idem::CanonicalDecimal(text);
  if (!decimal) return;
  auto again = idem::CanonicalDecimal(*decimal);
  IDEM_FUZZ_CHECK(again && *again == *decimal);
  const std::string in(text);
  IDEM_FUZZ_CHECK(std::strtod(in.c_str(), nullptr) == std::strtod(decimal->c_str(), nullptr));
  auto document = idem::Canonicalize(text, CanonicalRules{});
  IDEM_FUZZ_CHECK(document && *document == *decimal);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static const CanonicalRules kNone;
  static const CanonicalRules kPayments = Payments();
  static const CanonicalRules kNested = Nested();
  const std::string_view text = idem::fuzz::AsText(data, size);
  CheckRules(text, kNone);
  CheckRules(text, kPayments);
  CheckRules(text, kNested);
  CheckMemberOrder(text);
  CheckDecimal(text);
  return 0;
}
