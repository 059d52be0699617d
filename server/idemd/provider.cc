// server/idemd/provider.cc — the provider over HTTP (the provider calls in docs/idemd.md).
#include "server/idemd/provider.h"

#include <boost/json.hpp>

namespace idem::idemd {
namespace {

namespace json = boost::json;

Result<Charge> ParseCharge(const std::string& body) {
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  const json::object* o = ec ? nullptr : v.if_object();
  auto text = [&](const char* k) -> std::string {
    const json::value* f = o ? o->if_contains(k) : nullptr;
    return f && f->is_string() ? std::string(f->as_string()) : std::string();
  };
  Charge c{text("id"), text("reference"), text("amount"), text("currency"), text("status")};
  if (c.id.empty())
    return MakeError(Errc::kDataLoss, "provider: charge without an id: " + body.substr(0, 200));
  return c;
}

class HttpProvider final : public Provider {
 public:
  HttpProvider(http::Url url, Millis timeout) : url_(std::move(url)) { options_.timeout = timeout; }

  Result<ChargeResult> CreateCharge(const std::string& reference, const std::string& amount,
                                    const std::string& currency) override {
    json::object body;
    body["amount"] = amount;
    body["currency"] = currency;
    body["reference"] = reference;
    http::Request req;
    req.method = "POST";
    req.target = url_.base_path + "/v1/charges";
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Idempotency-Key", reference);
    req.body = json::serialize(body);
    IDEM_ASSIGN_OR_RETURN(http::Response res, http::Call(url_, std::move(req), options_));
    if (res.status == 200 || res.status == 201) {
      IDEM_ASSIGN_OR_RETURN(Charge charge, ParseCharge(res.body));
      return ChargeResult{false, std::move(charge)};
    }
    if (res.status == 402) return ChargeResult{true, {}};
    if (res.status >= 500) {
      return MakeError(Errc::kUnavailable, "provider answered " + std::to_string(res.status));
    }
    return MakeError(Errc::kDataLoss,
                     "provider answered an unexpected " + std::to_string(res.status));
  }

  Result<std::optional<Charge>> FindCharge(const std::string& reference) override {
    http::Request req;
    req.method = "GET";
    req.target = url_.base_path + "/v1/charges?reference=" + reference;
    IDEM_ASSIGN_OR_RETURN(http::Response res, http::Call(url_, std::move(req), options_));
    if (res.status == 404) return std::optional<Charge>();
    if (res.status == 200) {
      IDEM_ASSIGN_OR_RETURN(Charge charge, ParseCharge(res.body));
      return std::optional<Charge>(std::move(charge));
    }
    return MakeError(Errc::kUnavailable, "provider lookup answered " + std::to_string(res.status));
  }

 private:
  http::Url url_;
  http::CallOptions options_;
};

}  // namespace

Result<std::unique_ptr<Provider>> MakeHttpProvider(const std::string& base_url, Millis timeout) {
  IDEM_ASSIGN_OR_RETURN(http::Url url, http::ParseHttpUrl(base_url));
  return std::unique_ptr<Provider>(std::make_unique<HttpProvider>(std::move(url), timeout));
}

}  // namespace idem::idemd
