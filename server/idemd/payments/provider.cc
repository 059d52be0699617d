// server/idemd/payments/provider.cc — the provider over HTTP (the provider calls in docs/idemd.md).
#include "server/idemd/payments/provider.h"

#include <algorithm>
#include <boost/json.hpp>
#include <boost/url/encode.hpp>
#include <boost/url/rfc/unreserved_chars.hpp>
#include <chrono>

namespace idem::idemd {
namespace {

namespace json = boost::json;

std::string Text(const json::object* o, const char* key) {
  const json::value* f = o ? o->if_contains(key) : nullptr;
  return f && f->is_string() ? std::string(f->as_string()) : std::string();
}

std::string Encoded(std::string_view s) {
  return boost::urls::encode(s, boost::urls::unreserved_chars);
}

Result<json::value> ParseBody(const std::string& body) {
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec) return MakeError(Errc::kDataLoss, "provider: not JSON: " + body.substr(0, 200));
  return v;
}

Result<Charge> ChargeOf(const json::value& v) {
  const json::object* o = v.if_object();
  Charge c;
  c.id = Text(o, "id");
  c.reference = Text(o, "reference");
  c.amount = Text(o, "amount");
  c.currency = Text(o, "currency");
  c.status = Text(o, "status");
  if (c.id.empty()) {
    return MakeError(Errc::kDataLoss,
                     "provider: charge without an id: " + json::serialize(v).substr(0, 200));
  }
  if (auto created = http::ParseRfc3339(Text(o, "created_at"))) c.created_at_ms = *created;
  c.amount_refunded = Text(o, "amount_refunded");
  return c;
}

Result<Charge> ParseCharge(const std::string& body) {
  IDEM_ASSIGN_OR_RETURN(json::value v, ParseBody(body));
  return ChargeOf(v);
}

// What each call's answer means. Each takes the exchange's result; transport errors pass through.

// `took` is how long the exchange took and `timeout` its deadline: a transport error after the
// send that came before the deadline is a lost connection (an unknown outcome the provider
// answered, in effect), not a timeout.
Result<ChargeResult> ChargeAnswer(Result<http::Response> sent, const ProviderConfig& options,
                                  Millis took) {
  if (!sent && sent.error().code == Errc::kDeadlineExceeded && took < options.timeout) {
    return ChargeResult::Unknown("the connection was lost after the charge was sent (" +
                                 sent.error().message + ")");
  }
  IDEM_ASSIGN_OR_RETURN(http::Response res, std::move(sent));
  if (res.status == 200 || res.status == 201) {
    IDEM_ASSIGN_OR_RETURN(Charge charge, ParseCharge(res.body));
    return ChargeResult::Charged(std::move(charge));
  }
  if (res.status == 402) return ChargeResult::Declined();
  if (res.status >= 500) {
    const std::vector<int>& declared = options.nothing_charged_statuses;
    if (std::find(declared.begin(), declared.end(), res.status) != declared.end()) {
      return MakeError(Errc::kUnavailable, "provider answered " + std::to_string(res.status) +
                                               ", which it declares as nothing charged");
    }
    return ChargeResult::Unknown("the provider answered " + std::to_string(res.status) +
                                 " after the charge was sent");
  }
  return MakeError(Errc::kDataLoss,
                   "provider answered an unexpected " + std::to_string(res.status));
}

Result<std::optional<Charge>> LookupAnswer(Result<http::Response> sent) {
  IDEM_ASSIGN_OR_RETURN(http::Response res, std::move(sent));
  if (res.status == 404) return std::optional<Charge>();
  if (res.status == 200) {
    IDEM_ASSIGN_OR_RETURN(Charge charge, ParseCharge(res.body));
    return std::optional<Charge>(std::move(charge));
  }
  return MakeError(Errc::kUnavailable, "provider lookup answered " + std::to_string(res.status));
}

Result<ChargePage> PageAnswer(Result<http::Response> sent) {
  IDEM_ASSIGN_OR_RETURN(http::Response res, std::move(sent));
  if (res.status != 200) {
    return MakeError(Errc::kUnavailable, "provider listing answered " + std::to_string(res.status));
  }
  IDEM_ASSIGN_OR_RETURN(json::value v, ParseBody(res.body));
  const json::object* o = v.if_object();
  const json::value* data = o ? o->if_contains("data") : nullptr;
  const json::value* more = o ? o->if_contains("has_more") : nullptr;
  if (data == nullptr || !data->is_array() || more == nullptr || !more->is_bool()) {
    return MakeError(Errc::kDataLoss, "provider listing: not a page: " + res.body.substr(0, 200));
  }
  ChargePage page;
  page.has_more = more->as_bool();
  for (const json::value& item : data->as_array()) {
    IDEM_ASSIGN_OR_RETURN(Charge c, ChargeOf(item));
    page.data.push_back(std::move(c));
  }
  return page;
}

Result<Refund> RefundAnswer(Result<http::Response> sent, const std::string& charge) {
  IDEM_ASSIGN_OR_RETURN(http::Response res, std::move(sent));
  if (res.status == 200 || res.status == 201) {
    IDEM_ASSIGN_OR_RETURN(json::value v, ParseBody(res.body));
    const json::object* o = v.if_object();
    Refund r{Text(o, "id"), Text(o, "charge"), Text(o, "amount"), Text(o, "status")};
    if (r.id.empty()) return MakeError(Errc::kDataLoss, "provider: refund without an id");
    return r;
  }
  if (res.status == 404) return MakeError(Errc::kNotFound, "provider: no charge " + charge);
  if (res.status == 400) {
    return MakeError(Errc::kInvalidArgument,
                     "provider refused the refund: " + res.body.substr(0, 200));
  }
  if (res.status >= 500) {
    return MakeError(Errc::kUnavailable, "provider answered " + std::to_string(res.status));
  }
  return MakeError(Errc::kDataLoss,
                   "provider answered an unexpected " + std::to_string(res.status));
}

class HttpProvider final : public Provider {
 public:
  HttpProvider(http::Url url, std::unique_ptr<http::ClientPool> pool, const ProviderConfig& o)
      : url_(std::move(url)), pool_(std::move(pool)), provider_options_(o) {
    options_.timeout = o.timeout;
    options_.connect_timeout = o.connect_timeout;
  }

  http::Async<Result<ChargeResult>> CreateCharge(const std::string& reference,
                                                 const std::string& amount,
                                                 const std::string& currency, Millis send_within,
                                                 const std::string& traceparent) override {
    json::object body;
    body["amount"] = amount;
    body["currency"] = currency;
    body["reference"] = reference;
    http::Request req;
    req.method = "POST";
    req.target = url_.base_path + "/v1/charges";
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Idempotency-Key", reference);
    if (!traceparent.empty()) req.headers.Set("traceparent", traceparent);
    req.body = json::serialize(body);
    http::CallOptions options = options_;
    options.send_by = std::chrono::steady_clock::now() + send_within;
    const auto began = std::chrono::steady_clock::now();
    Result<http::Response> sent = co_await pool_->Call(std::move(req), options);
    const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - began);
    co_return ChargeAnswer(std::move(sent), provider_options_, took);
  }

  http::Async<Result<std::optional<Charge>>> FindCharge(const std::string& reference,
                                                        const std::string& traceparent) override {
    http::Request req;
    req.method = "GET";
    req.target = url_.base_path + "/v1/charges?reference=" + Encoded(reference);
    if (!traceparent.empty()) req.headers.Set("traceparent", traceparent);
    co_return LookupAnswer(co_await Send(std::move(req)));
  }

  http::Async<Result<ChargePage>> ListCharges(int64_t gte_ms, int64_t lt_ms, int limit,
                                              const std::string& starting_after) override {
    http::Request req;
    req.method = "GET";
    req.target = url_.base_path + "/v1/charges?created_gte=" + Encoded(http::Rfc3339(gte_ms)) +
                 "&created_lt=" + Encoded(http::Rfc3339(lt_ms)) + "&limit=" + std::to_string(limit);
    if (!starting_after.empty()) req.target += "&starting_after=" + Encoded(starting_after);
    co_return PageAnswer(co_await Send(std::move(req)));
  }

  http::Async<Result<Refund>> RefundCharge(const std::string& key, const std::string& charge,
                                           const std::string& amount,
                                           const std::string& reason) override {
    http::Request req;
    req.method = "POST";
    req.target = url_.base_path + "/v1/refunds";
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Idempotency-Key", key);
    req.body =
        json::serialize(json::object{{"charge", charge}, {"amount", amount}, {"reason", reason}});
    co_return RefundAnswer(co_await Send(std::move(req)), charge);
  }

 private:
  http::Async<Result<http::Response>> Send(http::Request req) {
    return pool_->Call(std::move(req), options_);
  }

  http::Url url_;
  std::unique_ptr<http::ClientPool> pool_;
  ProviderConfig provider_options_;
  http::CallOptions options_;
};

}  // namespace

Result<std::unique_ptr<Provider>> MakeHttpProvider(const ProviderConfig& options) {
  IDEM_ASSIGN_OR_RETURN(http::Url url, http::ParseHttpUrl(options.url));
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<http::ClientPool> pool,
                        http::ClientPool::Make(url, {.max_connections = options.max_connections,
                                                     .tls = {.ca_file = options.ca_file}}));
  return std::unique_ptr<Provider>(
      std::make_unique<HttpProvider>(std::move(url), std::move(pool), options));
}

}  // namespace idem::idemd
