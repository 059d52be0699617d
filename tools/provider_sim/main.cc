// tools/provider_sim/main.cc — a downstream payment provider for tests, demos and benchmarks:
// the provider calls idemd makes (docs/idemd.md), its own idempotency keys, and an admin API to
// inject faults and charges.
//
// A charge is {"id","reference","amount","currency","status","created_at","amount_refunded"}
// wherever it is returned: created_at is RFC 3339 UTC with milliseconds, amount_refunded a
// decimal string with as many fractional digits as the amount ("0.00" before any refund).
//
//   POST /v1/charges               Idempotency-Key + {"amount","currency","reference"}
//                                   → 201 charge | 402 | 5xx
//   GET  /v1/charges?reference=R   → 200 charge | 404
//   GET  /v1/charges?created_gte=T&created_lt=T&limit=N&starting_after=ID
//                                   → 200 {"data":[charge, …],"has_more":bool} | 400
//   POST /v1/refunds               Idempotency-Key + {"charge","amount","reason"}
//                                   → 201 {"id","charge","amount","status"} | 400 | 404 | 503
//   POST /admin/faults             {"fault": "decline"|"error"|"hang"|"slow"|
//                                   "succeed_then_timeout"|"late"|"long_id"|"none",
//                                   "reference": R (optional; else global), "delay_ms": N,
//                                   "times": N, "status": 5xx, "charge_after_ms": N (error)}
//
// Listing: every parameter is optional. The window is created_gte <= created_at < created_lt
// (RFC 3339, `Z` or a numeric offset, optional fraction; absent: unbounded), oldest first and
// ties in creation order; a page holds `limit` charges (1..100, default 10) after the charge
// `starting_after`, and has_more says whether more match after it. A malformed value, an unknown
// starting_after, or `reference` together with any listing parameter is 400.
//
// Refunds: `amount` is a positive decimal string with no more fractional digits than the
// charge's amount; `reason` is "duplicate", "fraudulent" or "requested_by_customer". 404 for an
// unknown charge; 400 for an invalid field or an amount above what is left to refund. A key is
// honoured as for charges: a repeat answers the refund it made (201, the same body) and refunds
// nothing more, even if nothing is left.
//
// Faults: `decline` answers 402, `error` 503 (or its `status`, 500..599), both charging nothing
// — unless `error` has `charge_after_ms`: then the charge is made that long after the request
// arrived, as a provider's back end goes on after its front end failed (lookups find nothing
// until then). `hang` charges nothing and
// drops the connection after delay_ms (default 60 s). `slow` charges at once and answers after
// delay_ms. `succeed_then_timeout` charges at once and drops the connection after delay_ms.
// `late` models a provider that executes a request after its caller gave up: the charge is
// created delay_ms after the request arrived, whether or not the caller still waits (a closed
// connection does not cancel it); a caller still waiting gets the answer then. Until then a
// lookup by reference or a listing finds nothing. `long_id` charges at once under an id of over
// 20 KiB. Faults apply to charges, not refunds.
//   DELETE /admin/faults           clears every fault
//   POST /admin/mode               {"ignore_idempotency_keys": true|false} (charges and refunds)
//   POST /admin/charges            {"reference","amount","currency","created_at" (optional;
//                                   default now)} → 201 charge: one made outside idemd, such as
//                                   a duplicate; counted like any other
//   GET  /admin/stats              {"total": N, "charges_by_reference": {R: N},
//                                   "refunds_by_charge": {ID: N}, "refunded_total": N,
//                                   "traceparent_by_reference": {R: the W3C traceparent the
//                                   last charge request for R came with}}
//
// State lives in memory; the process is a test double, restarted per test run. It holds at most
// --max-records charges and as many refunds (default 1,000,000) and answers 503 for more, so a
// runaway test cannot exhaust memory. It serves at most --max-connections connections at once
// (default 2,048, the HTTP server's), each with its call in flight; more are closed as they
// arrive, as a real provider's limit would, so a load of more concurrent calls must raise it.
#include <signal.h>

#include <algorithm>
#include <boost/json.hpp>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stop_token>
#include <thread>
#include <unordered_map>

#include "http/server.h"
#include "idem/key.h"
#include "idem/mutex.h"

namespace {

using namespace idem;
namespace json = boost::json;

constexpr std::size_t kDefaultMaxRecords = 1'000'000;
constexpr int kDefaultPageSize = 10;
constexpr int kMaxPageSize = 100;
// Digits in an amount: below 10^18 fits int64_t at any scale.
constexpr std::size_t kMaxAmountDigits = 18;

struct Fault {
  std::string kind;  // decline, error, hang, slow, succeed_then_timeout, late
  Millis delay{0};
  int times = -1;    // -1: until cleared
  int status = 503;  // error: the status answered (500..599)
  // error: the charge is made this long after the request arrived (a front end that fails while
  // its back end goes on); nullopt: nothing is charged.
  std::optional<Millis> charge_after;
};

http::Response Json(int status, const json::value& v) {
  http::Response r{status, {}, json::serialize(v)};
  r.headers.Set("Content-Type", "application/json");
  return r;
}
http::Response Error(int status, std::string_view message) {
  return Json(status, json::object{{"error", message}});
}

// A decimal amount in integer minor units: "12.30" is {1230, 2}. Money is never a double here.
struct Decimal {
  int64_t units = 0;
  int scale = 0;  // fractional digits
};

// Digits with an optional '.' and at least one digit after it; no sign, no exponent.
std::optional<Decimal> ParseDecimal(std::string_view s) {
  const std::size_t dot = s.find('.');
  const std::string_view whole = s.substr(0, dot);
  const std::string_view fraction = dot == std::string_view::npos ? "" : s.substr(dot + 1);
  if (whole.empty() || (dot != std::string_view::npos && fraction.empty()) ||
      whole.size() + fraction.size() > kMaxAmountDigits) {
    return std::nullopt;
  }
  Decimal d{0, static_cast<int>(fraction.size())};
  for (std::string_view part : {whole, fraction}) {
    for (char c : part) {
      if (c < '0' || c > '9') return std::nullopt;
      d.units = d.units * 10 + (c - '0');
    }
  }
  return d;
}

std::string FormatDecimal(int64_t units, int scale) {
  std::string digits = std::to_string(units);
  if (scale == 0) return digits;
  if (digits.size() <= static_cast<std::size_t>(scale)) {
    digits.insert(0, static_cast<std::size_t>(scale) + 1 - digits.size(), '0');
  }
  digits.insert(digits.size() - static_cast<std::size_t>(scale), 1, '.');
  return digits;
}

// `d` in units of `scale` (>= d.scale) fractional digits; nullopt if that overflows int64_t.
std::optional<int64_t> Rescale(Decimal d, int scale) {
  int64_t units = d.units;
  for (int i = d.scale; i < scale; ++i) {
    if (units > std::numeric_limits<int64_t>::max() / 10) return std::nullopt;
    units *= 10;
  }
  return units;
}

// Query values arrive percent-encoded or not ("+08:00" raw or as "%2B08%3A00"); '+' is kept,
// since an offset is the only place it appears. nullopt for a broken escape.
std::optional<std::string> PercentDecode(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    const int hi = i + 2 < s.size() ? hex(s[i + 1]) : -1;
    const int lo = i + 2 < s.size() ? hex(s[i + 2]) : -1;
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

struct Charge {
  std::string id;
  std::string reference;
  std::string amount;  // as the caller wrote it
  std::string currency;
  int64_t created_ms = 0;
  int64_t refunded_units = 0;  // at the precision of `amount`
};

json::object ToJson(const Charge& c) {
  const std::optional<Decimal> amount = ParseDecimal(c.amount);
  return json::object{
      {"id", c.id},
      {"reference", c.reference},
      {"amount", c.amount},
      {"currency", c.currency},
      {"status", "succeeded"},
      {"created_at", http::Rfc3339(c.created_ms)},
      {"amount_refunded", FormatDecimal(c.refunded_units, amount ? amount->scale : 0)}};
}

// The string member `k` of `o`, or empty.
std::string Text(const json::object* o, const char* k) {
  const json::value* v = o ? o->if_contains(k) : nullptr;
  return v && v->is_string() ? std::string(v->as_string()) : std::string();
}

// Thread-safe: every member is guarded by mu_; late charges land on their own threads, joined
// (and cut short) when the simulator is destroyed.
class ProviderSim final : public http::Handler {
 public:
  explicit ProviderSim(std::size_t max_records) : max_records_(max_records) {}
  ~ProviderSim() override {
    for (std::jthread& t : late_) t.request_stop();
    late_cv_.notify_all();
  }

  // Decides at once, on the I/O thread (the simulator's state is in memory); a slow answer then
  // waits out its delay on a timer, without a thread.
  http::Async<http::Response> Handle(const http::Request& request,
                                     http::RequestContext& context) override {
    Millis delay{0};
    http::Response response = Serve(request, context, delay);
    if (delay.count() > 0) co_await http::SleepFor(delay);
    co_return response;
  }

 private:
  // `delay`: how long to wait before answering (or, with context.drop, before closing).
  http::Response Serve(const http::Request& request, http::RequestContext& context, Millis& delay) {
    const std::string_view path = request.Path();
    context.route = std::string(path);
    if (path == "/v1/charges" && request.method == "POST") {
      return CreateCharge(request, context, delay);
    }
    if (path == "/v1/charges" && request.method == "GET") return GetCharges(request);
    if (path == "/v1/refunds" && request.method == "POST") return CreateRefund(request);
    if (path == "/admin/charges" && request.method == "POST") return InjectCharge(request);
    if (path == "/admin/faults" && request.method == "POST") return SetFault(request);
    if (path == "/admin/faults" && request.method == "DELETE") {
      MutexLock lock(mu_);
      faults_.clear();
      global_.reset();
      return Json(200, json::object{{"faults", "cleared"}});
    }
    if (path == "/admin/mode" && request.method == "POST") return SetMode(request);
    if (path == "/admin/stats" && request.method == "GET") return Stats();
    if (path == "/healthz") return Json(200, json::object{{"status", "ok"}});
    return Json(404, json::object{{"error", "not_found"}});
  }

  // The fault that applies to `reference` now (consuming one use), if any.
  std::optional<Fault> TakeFault(const std::string& reference) IDEM_REQUIRES(mu_) {
    auto take = [](std::optional<Fault>& f) -> std::optional<Fault> {
      if (!f) return std::nullopt;
      Fault out = *f;
      if (f->times > 0 && --f->times == 0) f.reset();
      return out;
    };
    if (auto it = faults_.find(reference); it != faults_.end()) {
      auto f = take(it->second);
      if (!it->second) faults_.erase(it);
      return f;
    }
    return take(global_);
  }

  // The charge a request body asks for (reference, amount, currency; empty when absent); `doc`
  // keeps the parsed body for the caller's other fields.
  static Charge Requested(const http::Request& request, json::value* doc) {
    boost::system::error_code ec;
    *doc = json::parse(request.body, ec);
    const json::object* o = ec ? nullptr : doc->if_object();
    return Charge{.id = "",
                  .reference = Text(o, "reference"),
                  .amount = Text(o, "amount"),
                  .currency = Text(o, "currency")};
  }

  http::Response Full() const {
    return Error(503, "provider-sim holds its maximum of " + std::to_string(max_records_) +
                          " records of this kind");
  }

  http::Response CreateCharge(const http::Request& request, http::RequestContext& context,
                              Millis& delay) {
    json::value body;
    Charge charge = Requested(request, &body);
    if (charge.reference.empty() || charge.amount.empty() || charge.currency.empty()) {
      return Json(400, json::object{{"error", "invalid_request"}});
    }
    const std::string key = std::string(request.headers.Get("idempotency-key").value_or(""));

    MutexLock lock(mu_);
    if (!context.trace.parent_id.empty()) {
      traceparent_by_reference_[charge.reference] = context.trace.CallerTraceparent();
    }
    std::optional<Fault> fault = TakeFault(charge.reference);
    if (fault && fault->kind == "decline")
      return Json(402, json::object{{"error", "card_declined"}});
    if (fault && fault->kind == "error" && !fault->charge_after) {
      return Json(fault->status, json::object{{"error", "unavailable"}});
    }
    if (fault && fault->kind == "hang") {
      delay = fault->delay.count() > 0 ? fault->delay : Millis(60000);
      context.drop = true;
      return {};
    }
    if (fault && fault->kind == "slow") delay = fault->delay;

    charge.id = NewId("ch_");
    // A provider whose ids outgrow what a client keeps: idemd's stored answer (16 KiB) included.
    if (fault && fault->kind == "long_id") charge.id += std::string(20 * 1024, 'x');
    charge.created_ms = ToUnixMillis(SystemClock().Now());
    if (fault && (fault->kind == "late" || fault->kind == "error")) {
      // Made at the landing time whatever the caller did; its slot is held from now, so a
      // landing never finds the simulator full. `late` answers then if the caller still waits;
      // `error` answers its 5xx at once.
      if (charges_.size() + landing_ >= max_records_) return Full();
      const Millis lands = fault->kind == "late" ? fault->delay : *fault->charge_after;
      charge.created_ms += lands.count();
      ++landing_;
      late_.emplace_back([this, lands, key, charge](std::stop_token stop) {
        MutexLock late_lock(mu_);
        late_cv_.wait_for(mu_, stop, lands, [] { return false; });
        if (stop.stop_requested()) return;
        --landing_;
        (void)AddCharge(key, charge);
      });
      if (fault->kind == "error")
        return Json(fault->status, json::object{{"error", "bad_gateway"}});
      delay = lands;
      return Json(201, ToJson(charge));
    }
    const std::optional<std::size_t> made = AddCharge(key, std::move(charge));
    if (!made) return Full();
    if (fault && fault->kind == "succeed_then_timeout") {
      delay = fault->delay.count() > 0 ? fault->delay : Millis(60000);
      context.drop = true;
      return {};
    }
    return Json(201, ToJson(charges_[*made]));
  }

  std::string NewId(const char* prefix) {
    std::array<uint8_t, 8> id;
    random_.Fill(id);
    return prefix + ToHex(id);
  }

  // Makes `charge` unless `key` was seen before and keys are honoured: then the earlier charge is
  // the answer. Returns its index in charges_, or nullopt when the simulator is full.
  std::optional<std::size_t> AddCharge(const std::string& key, Charge charge) IDEM_REQUIRES(mu_) {
    auto existing = by_key_.find(key);
    if (!ignore_keys_ && !key.empty() && existing != by_key_.end()) {
      return existing->second;  // a repeat: the same charge
    }
    if (charges_.size() + landing_ >= max_records_) return std::nullopt;
    const std::size_t index = charges_.size();
    if (!key.empty()) by_key_[key] = index;
    ++count_by_reference_[charge.reference];
    by_id_[charge.id] = index;
    by_time_.emplace(charge.created_ms, index);
    charges_.push_back(std::move(charge));
    return index;
  }

  http::Response GetCharges(const http::Request& request) {
    const std::optional<std::string_view> reference = request.QueryParam("reference");
    const bool listing = request.QueryParam("created_gte") || request.QueryParam("created_lt") ||
                         request.QueryParam("limit") || request.QueryParam("starting_after");
    if (reference && listing) {
      return Error(400,
                   "reference looks one charge up; it cannot be combined with created_gte, "
                   "created_lt, limit or starting_after");
    }
    return reference ? FindCharge(std::string(*reference)) : ListCharges(request);
  }

  http::Response FindCharge(const std::string& reference) {
    MutexLock lock(mu_);
    for (const Charge& c : charges_) {
      if (c.reference == reference) return Json(200, ToJson(c));
    }
    return Json(404, json::object{{"error", "not_found"}});
  }

  http::Response ListCharges(const http::Request& request) {
    // The percent-decoded query parameter `name`; "" (valid for none) if badly escaped.
    auto param = [&request](std::string_view name) {
      return PercentDecode(request.QueryParam(name).value_or("")).value_or("");
    };
    // Reads the bound `name` into `out`, which stays unbounded when the parameter is absent.
    auto bound = [&](std::string_view name, int64_t& out) {
      if (!request.QueryParam(name)) return true;
      const std::optional<int64_t> ms = http::ParseRfc3339(param(name));
      if (ms) out = *ms;
      return ms.has_value();
    };
    int64_t gte = std::numeric_limits<int64_t>::min();
    int64_t lt = std::numeric_limits<int64_t>::max();
    if (!bound("created_gte", gte) || !bound("created_lt", lt)) {
      return Error(400,
                   "created_gte and created_lt must be RFC 3339 date-times such as "
                   "2026-11-30T13:37:25.032Z or 2026-11-30T21:37:25+08:00");
    }
    int limit = kDefaultPageSize;
    if (request.QueryParam("limit")) {
      const std::string text = param("limit");
      const char* end = text.data() + text.size();
      const auto [ptr, err] = std::from_chars(text.data(), end, limit);
      if (err != std::errc() || ptr != end || limit < 1 || limit > kMaxPageSize) {
        return Error(400, "limit must be an integer from 1 to " + std::to_string(kMaxPageSize));
      }
    }

    MutexLock lock(mu_);
    auto it = by_time_.lower_bound({gte, 0});
    if (request.QueryParam("starting_after")) {
      const auto found = by_id_.find(param("starting_after"));
      if (found == by_id_.end()) return Error(400, "starting_after names no charge");
      const std::pair<int64_t, std::size_t> position{charges_[found->second].created_ms,
                                                     found->second};
      if (position >= std::pair<int64_t, std::size_t>{gte, 0}) {
        it = by_time_.upper_bound(position);
      }
    }
    json::array data;
    for (; it != by_time_.end() && it->first < lt && std::cmp_less(data.size(), limit); ++it) {
      data.push_back(ToJson(charges_[it->second]));
    }
    const bool has_more = it != by_time_.end() && it->first < lt;
    return Json(200, json::object{{"data", std::move(data)}, {"has_more", has_more}});
  }

  http::Response CreateRefund(const http::Request& request) {
    boost::system::error_code ec;
    json::value body = json::parse(request.body, ec);
    const json::object* o = ec ? nullptr : body.if_object();
    const std::string charge_id = Text(o, "charge");
    const std::optional<Decimal> amount = ParseDecimal(Text(o, "amount"));
    const std::string reason = Text(o, "reason");
    if (charge_id.empty()) return Error(400, "charge must be a charge id");
    if (!amount || amount->units == 0) {
      return Error(400, "amount must be a positive decimal string such as \"100.00\"");
    }
    if (reason != "duplicate" && reason != "fraudulent" && reason != "requested_by_customer") {
      return Error(400, "reason must be duplicate, fraudulent or requested_by_customer");
    }
    const std::string key = std::string(request.headers.Get("idempotency-key").value_or(""));

    MutexLock lock(mu_);
    if (auto it = refund_by_key_.find(key);
        !ignore_keys_ && !key.empty() && it != refund_by_key_.end()) {
      return Json(201, refunds_[it->second]);  // a repeat: the same refund
    }
    const auto found = by_id_.find(charge_id);
    if (found == by_id_.end()) return Error(404, "no such charge: " + charge_id);
    Charge& charge = charges_[found->second];
    const std::optional<Decimal> charged = ParseDecimal(charge.amount);
    if (!charged) return Error(400, "the charge's amount is not a decimal; it cannot be refunded");
    if (amount->scale > charged->scale) {
      return Error(400,
                   "amount has more fractional digits than the charge's amount " + charge.amount);
    }
    const std::optional<int64_t> units = Rescale(*amount, charged->scale);
    const int64_t left = charged->units - charge.refunded_units;
    if (!units || *units > left) {
      return Error(400,
                   "amount exceeds what is left to refund: " + FormatDecimal(left, charged->scale));
    }
    if (refunds_.size() >= max_records_) return Full();
    charge.refunded_units += *units;
    json::object refund{{"id", NewId("re_")},
                        {"charge", charge.id},
                        {"amount", FormatDecimal(*units, charged->scale)},
                        {"status", "succeeded"}};
    if (!key.empty()) refund_by_key_[key] = refunds_.size();
    ++refunds_by_charge_[charge.id];
    refunds_.push_back(refund);
    return Json(201, refund);
  }

  http::Response InjectCharge(const http::Request& request) {
    json::value body;
    Charge charge = Requested(request, &body);
    if (charge.reference.empty() || !ParseDecimal(charge.amount) || charge.currency.empty()) {
      return Error(400,
                   "expected {\"reference\", \"amount\" (a decimal string), \"currency\", "
                   "\"created_at\" (optional)}");
    }
    charge.created_ms = ToUnixMillis(SystemClock().Now());
    if (const json::value* at = body.as_object().if_contains("created_at")) {
      const std::optional<int64_t> ms =
          at->is_string() ? http::ParseRfc3339(at->as_string()) : std::nullopt;
      if (!ms || *ms < 0)
        return Error(400, "created_at must be an RFC 3339 date-time from 1970 on");
      charge.created_ms = *ms;
    }
    MutexLock lock(mu_);
    charge.id = NewId("ch_");
    const std::optional<std::size_t> made = AddCharge("", std::move(charge));
    if (!made) return Full();
    return Json(201, ToJson(charges_[*made]));
  }
  http::Response SetFault(const http::Request& request) {
    boost::system::error_code ec;
    json::value body = json::parse(request.body, ec);
    const json::object* o = ec ? nullptr : body.if_object();
    const json::value* kind = o ? o->if_contains("fault") : nullptr;
    static const std::vector<std::string> kKinds = {
        "decline", "error", "hang", "slow", "succeed_then_timeout", "late", "long_id", "none"};
    if (kind == nullptr || !kind->is_string() ||
        std::find(kKinds.begin(), kKinds.end(), std::string(kind->as_string())) == kKinds.end()) {
      return Json(400, json::object{{"error",
                                     "fault must be one of decline, error, hang, slow, "
                                     "succeed_then_timeout, late, long_id, none"}});
    }
    Fault f;
    f.kind = std::string(kind->as_string());
    if (const json::value* d = o->if_contains("delay_ms"); d && d->is_int64()) {
      f.delay = Millis(d->as_int64());
    }
    if (const json::value* t = o->if_contains("times"); t && t->is_int64()) {
      f.times = static_cast<int>(t->as_int64());
    }
    if (const json::value* st = o->if_contains("status"); st != nullptr) {
      if (!st->is_int64() || st->as_int64() < 500 || st->as_int64() > 599) {
        return Json(400, json::object{{"error", "status must be 500..599"}});
      }
      f.status = static_cast<int>(st->as_int64());
    }
    if (const json::value* after = o->if_contains("charge_after_ms"); after != nullptr) {
      if (!after->is_int64() || after->as_int64() < 0) {
        return Json(400, json::object{{"error", "charge_after_ms must be a non-negative integer"}});
      }
      f.charge_after = Millis(after->as_int64());
    }
    std::optional<Fault> value = f.kind == "none" ? std::nullopt : std::optional<Fault>(f);
    MutexLock lock(mu_);
    if (const json::value* r = o->if_contains("reference"); r && r->is_string()) {
      faults_[std::string(r->as_string())] = value;
    } else {
      global_ = value;
    }
    return Json(200, json::object{{"fault", f.kind}});
  }

  http::Response SetMode(const http::Request& request) {
    boost::system::error_code ec;
    json::value body = json::parse(request.body, ec);
    const json::value* v =
        ec || !body.is_object() ? nullptr : body.as_object().if_contains("ignore_idempotency_keys");
    if (v == nullptr || !v->is_bool()) {
      return Json(400, json::object{{"error", "expected {\"ignore_idempotency_keys\": bool}"}});
    }
    MutexLock lock(mu_);
    ignore_keys_ = v->as_bool();
    return Json(200, json::object{{"ignore_idempotency_keys", ignore_keys_}});
  }

  http::Response Stats() {
    MutexLock lock(mu_);
    json::object by_reference;
    for (const auto& [reference, n] : count_by_reference_) by_reference[reference] = n;
    json::object traceparents;
    for (const auto& [reference, tp] : traceparent_by_reference_) traceparents[reference] = tp;
    json::object by_charge;
    for (const auto& [charge, n] : refunds_by_charge_) by_charge[charge] = n;
    return Json(200, json::object{{"total", charges_.size()},
                                  {"charges_by_reference", std::move(by_reference)},
                                  {"refunds_by_charge", std::move(by_charge)},
                                  {"refunded_total", refunds_.size()},
                                  {"traceparent_by_reference", std::move(traceparents)}});
  }

  const std::size_t max_records_;  // charges, and separately refunds
  Mutex mu_;
  // In creation order: the index is the creation sequence.
  std::vector<Charge> charges_ IDEM_GUARDED_BY(mu_);
  std::size_t landing_ IDEM_GUARDED_BY(mu_) = 0;  // late charges not made yet, each holding a slot
  std::map<std::string, std::size_t> by_key_ IDEM_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::size_t> by_id_ IDEM_GUARDED_BY(mu_);
  // (created_ms, index): listing order.
  std::set<std::pair<int64_t, std::size_t>> by_time_ IDEM_GUARDED_BY(mu_);
  std::map<std::string, int64_t> count_by_reference_ IDEM_GUARDED_BY(mu_);
  std::map<std::string, std::string> traceparent_by_reference_ IDEM_GUARDED_BY(mu_);
  std::vector<json::object> refunds_ IDEM_GUARDED_BY(mu_);
  // Keys of refunds, apart from charges'.
  std::map<std::string, std::size_t> refund_by_key_ IDEM_GUARDED_BY(mu_);
  std::map<std::string, int64_t> refunds_by_charge_ IDEM_GUARDED_BY(mu_);
  std::map<std::string, std::optional<Fault>> faults_ IDEM_GUARDED_BY(mu_);
  std::optional<Fault> global_ IDEM_GUARDED_BY(mu_);
  bool ignore_keys_ IDEM_GUARDED_BY(mu_) = false;
  Random& random_ = SystemRandom();  // thread-safe of its own
  // Never notified but at destruction: a stoppable sleep, with mu_ (BasicLockable) as its lock.
  std::condition_variable_any late_cv_;
  // One per late charge; never pruned (a test double).
  std::vector<std::jthread> late_ IDEM_GUARDED_BY(mu_);
};

// Whether `value` is all of a number >= 1, then put in `out`.
template <class N>
bool PositiveNumber(std::string_view value, N& out) {
  N n{};
  const auto [ptr, err] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (err != std::errc() || ptr != value.data() + value.size() || n < 1) return false;
  out = n;
  return true;
}

class StderrLog final : public http::AccessLog {
 public:
  void Write(const Entry&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  http::ServerOptions options;
  options.port = 8090;
  options.io_threads = 2;
  options.drain_timeout = Millis(2000);
  std::size_t max_records = kDefaultMaxRecords;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--listen" && i + 1 < argc) {
      auto address = http::ParseListenAddress(argv[++i]);
      if (!address) {
        std::fprintf(stderr, "%s: %s\n", "provider-sim", address.error().message.c_str());
        return 2;
      }
      options.host = address->host;
      options.port = address->port;
    } else if (arg == "--max-connections" && i + 1 < argc) {
      if (!PositiveNumber(argv[++i], options.max_connections)) {
        std::fprintf(stderr, "provider-sim: --max-connections N (N >= 1)\n");
        return 2;
      }
    } else if (arg == "--max-records" && i + 1 < argc) {
      if (!PositiveNumber(argv[++i], max_records)) {
        std::fprintf(stderr, "provider-sim: --max-records N (N >= 1)\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: provider-sim [--listen HOST:PORT] [--max-connections N] "
                   "[--max-records N]\n");
      return 2;
    }
  }
  // Each connection may have its call in flight (a slow or late answer waits on a timer).
  options.max_in_flight = std::max(options.max_in_flight, options.max_connections);
  http::BlockSignals();

  ProviderSim sim(max_records);
  auto server = http::Server::Start(options, sim, nullptr);
  if (!server) {
    std::fprintf(stderr, "provider-sim: %s\n", server.error().message.c_str());
    return 1;
  }
  std::printf("provider-sim listening on http://%s\n",
              http::Authority(options.host, (*server)->port()).c_str());
  std::fflush(stdout);
  while (http::WaitForSignal() == SIGHUP) {
  }
  (*server)->Drain();
  return 0;
}
