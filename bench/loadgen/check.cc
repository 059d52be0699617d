// bench/loadgen/check.cc — see check.h.
#include "bench/loadgen/check.h"

#include <boost/json.hpp>
#include <unordered_map>

namespace idem::bench {

namespace json = boost::json;

namespace {

// Enough failures to see the pattern; the counters hold the totals.
constexpr std::size_t kMaxFailures = 20;

std::string_view View(const json::string& s) { return {s.data(), s.size()}; }

int64_t CountOf(const ChargeCounts& counts, std::string_view reference) {
  const auto it = counts.find(reference);
  return it == counts.end() ? 0 : it->second;
}

bool IsFinalStatus(int status) {
  if (status == 200 || status == 201) return true;
  // 409 (in progress), 429 (quota) and 408/425 say "later"; other 4xx are verdicts.
  return status >= 400 && status < 500 && status != 408 && status != 409 && status != 425 &&
         status != 429;
}

Result<int64_t> Integer(const json::object& o, std::string_view name) {
  const json::value* v = o.if_contains(name);
  if (v == nullptr || !v->is_number()) {
    return MakeError(Errc::kInvalidArgument, "'" + std::string(name) + "' is not a number");
  }
  boost::system::error_code ec;
  const auto n = v->to_number<int64_t>(ec);
  if (ec) return MakeError(Errc::kInvalidArgument, "'" + std::string(name) + "' is no integer");
  return n;
}

Result<ChargeCounts> CountsFrom(const json::value* v, std::string_view what) {
  if (v == nullptr || !v->is_object()) {
    return MakeError(Errc::kInvalidArgument, std::string(what) + " is not an object");
  }
  ChargeCounts out;
  for (const auto& [reference, n] : v->as_object()) {
    boost::system::error_code ec;
    const auto count = n.to_number<int64_t>(ec);
    if (ec) return MakeError(Errc::kInvalidArgument, std::string(what) + " holds a non-count");
    out.emplace(std::string(reference.data(), reference.size()), count);
  }
  return out;
}

}  // namespace

bool IntentRecord::Final() const { return successes > 0 || IsFinalStatus(last_status); }

std::optional<std::string> PaymentIdInBody(std::string_view body, std::string_view order) {
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  const json::object* o = ec ? nullptr : v.if_object();
  const json::value* id = o != nullptr ? o->if_contains("id") : nullptr;
  const json::value* order_no = o != nullptr ? o->if_contains("merchant_order_no") : nullptr;
  if (id == nullptr || !id->is_string() || order_no == nullptr || !order_no->is_string() ||
      View(order_no->as_string()) != order) {
    return std::nullopt;
  }
  return std::string(View(id->as_string()));
}

Result<ChargeCounts> ParseProviderStats(std::string_view body) {
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) {
    return MakeError(Errc::kInvalidArgument, "provider stats are not a JSON object");
  }
  return CountsFrom(v.as_object().if_contains("charges_by_reference"), "charges_by_reference");
}

CheckResult CheckExactlyOnce(const std::vector<IntentRecord>& intents, const ChargeCounts& before,
                             const ChargeCounts& after, uint64_t replay_violations) {
  CheckResult r;
  r.intents = intents.size();
  r.replay_violations = replay_violations;
  const auto fail = [&r](std::string message) {
    if (r.failures.size() < kMaxFailures) r.failures.push_back(std::move(message));
  };
  // Payment id -> the intent whose success named it first.
  std::unordered_map<std::string_view, const IntentRecord*> owner;
  for (const IntentRecord& in : intents) {
    if (!in.Final()) ++r.unresolved;
    if (in.successes == 0) continue;
    ++r.succeeded;
    if (!in.other_payment_ids.empty()) {
      ++r.split_intents;
      fail("key " + in.key + " was answered with payment " + in.payment_id + " and with " +
           in.other_payment_ids.front());
    }
    if (in.executions > 1) {
      ++r.multiple_executions;
      fail("key " + in.key + " got " + std::to_string(in.executions) +
           " successes not marked as replays");
    }
    if (in.body_mismatches > 0) {
      r.body_mismatches += in.body_mismatches;
      fail("key " + in.key + ": " + std::to_string(in.body_mismatches) +
           " successes differ from its first (a replay is byte-identical)");
    }
    if (!owner.emplace(in.payment_id, &in).second) {
      ++r.shared_payment_ids;
      fail("payment " + in.payment_id + " was answered to key " + owner[in.payment_id]->key +
           " and to key " + in.key);
      continue;
    }
    ++r.charges_checked;
    const int64_t made = CountOf(after, in.payment_id) - CountOf(before, in.payment_id);
    if (made < 1) {
      ++r.missing_charges;
      fail("payment " + in.payment_id + " (key " + in.key + ") succeeded but was never charged");
    } else if (made > 1) {
      ++r.duplicate_charges;
      fail("payment " + in.payment_id + " (key " + in.key + ") was charged " +
           std::to_string(made) + " times");
    }
  }
  // Whatever was charged since the run began and no success names: a charge for an intent that
  // never succeeded (its payment id was never answered), or one made behind idemd's back.
  for (const auto& [reference, count] : after) {
    const int64_t made = count - CountOf(before, reference);
    if (made > 0 && !owner.contains(reference)) {
      r.unexpected_charges += static_cast<uint64_t>(made);
      fail(std::to_string(made) + " charge(s) under reference " + reference +
           ", which no success of this run names");
    }
  }
  if (replay_violations > 0) {
    fail(std::to_string(replay_violations) +
         " retries of created payments were not answered 200/201 with Idempotent-Replayed: true");
  }
  if (r.succeeded == 0) fail("no intent succeeded: there was nothing to verify");
  r.pass = r.succeeded > 0 && r.split_intents == 0 && r.shared_payment_ids == 0 &&
           r.multiple_executions == 0 && r.body_mismatches == 0 && r.missing_charges == 0 &&
           r.duplicate_charges == 0 && r.unexpected_charges == 0 && r.replay_violations == 0;
  return r;
}

std::string IntentsToJson(const IntentsFile& file) {
  json::object before;
  for (const auto& [reference, n] : file.provider_before) before[reference] = n;
  json::array intents;
  intents.reserve(file.intents.size());
  for (const IntentRecord& in : file.intents) {
    json::array others;
    for (const std::string& id : in.other_payment_ids) others.emplace_back(id);
    intents.emplace_back(json::object{{"key", in.key},
                                      {"sent", in.sent},
                                      {"answered", in.answered},
                                      {"successes", in.successes},
                                      {"executions", in.executions},
                                      {"payment_id", in.payment_id},
                                      {"other_payment_ids", std::move(others)},
                                      {"body_mismatches", in.body_mismatches},
                                      {"last_status", in.last_status}});
  }
  return json::serialize(json::object{{"format", "idem-bench intents 1"},
                                      {"provider_before", std::move(before)},
                                      {"replay_violations", file.replay_violations},
                                      {"intents", std::move(intents)}});
}

Result<IntentsFile> IntentsFromJson(std::string_view text) {
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  const json::object* root = ec ? nullptr : v.if_object();
  const json::value* format = root != nullptr ? root->if_contains("format") : nullptr;
  if (format == nullptr || !format->is_string() ||
      View(format->as_string()) != "idem-bench intents 1") {
    return MakeError(Errc::kInvalidArgument, "not an idem-bench intents file");
  }
  IntentsFile file;
  auto before = CountsFrom(root->if_contains("provider_before"), "provider_before");
  if (!before) return before.error();
  file.provider_before = std::move(*before);
  auto violations = Integer(*root, "replay_violations");
  if (!violations) return violations.error();
  file.replay_violations = static_cast<uint64_t>(*violations);
  const json::value* list = root->if_contains("intents");
  if (list == nullptr || !list->is_array()) {
    return MakeError(Errc::kInvalidArgument, "'intents' is not an array");
  }
  for (const json::value& item : list->as_array()) {
    const json::object* o = item.if_object();
    if (o == nullptr) return MakeError(Errc::kInvalidArgument, "an intent is not an object");
    IntentRecord in;
    const json::value* key = o->if_contains("key");
    const json::value* id = o->if_contains("payment_id");
    const json::value* others = o->if_contains("other_payment_ids");
    if (key == nullptr || !key->is_string() || id == nullptr || !id->is_string() ||
        others == nullptr || !others->is_array()) {
      return MakeError(Errc::kInvalidArgument, "an intent lacks key, payment_id or other ids");
    }
    in.key = std::string(View(key->as_string()));
    in.payment_id = std::string(View(id->as_string()));
    for (const json::value& other : others->as_array()) {
      if (!other.is_string()) return MakeError(Errc::kInvalidArgument, "a payment id not a string");
      in.other_payment_ids.emplace_back(View(other.as_string()));
    }
    for (auto [name, field] :
         {std::pair{"sent", &in.sent}, std::pair{"answered", &in.answered},
          std::pair{"successes", &in.successes}, std::pair{"executions", &in.executions},
          std::pair{"body_mismatches", &in.body_mismatches}}) {
      auto n = Integer(*o, name);
      if (!n) return n.error();
      *field = static_cast<uint32_t>(*n);
    }
    auto status = Integer(*o, "last_status");
    if (!status) return status.error();
    in.last_status = static_cast<int>(*status);
    file.intents.push_back(std::move(in));
  }
  return file;
}

}  // namespace idem::bench
