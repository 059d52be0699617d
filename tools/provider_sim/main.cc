// tools/provider_sim/main.cc — a downstream payment provider for tests, demos and benchmarks:
// the provider calls idemd makes (docs/idemd.md), its own idempotency keys, and an admin API to
// inject faults.
//
//   POST /v1/charges               Idempotency-Key + {"amount","currency","reference"} → 201 | 402
//   | 5xx GET  /v1/charges?reference=R   → 200 charge | 404 POST /admin/faults {"fault":
//   "decline"|"error"|"hang"|"slow"|"succeed_then_timeout"|"none",
//                                   "reference": R (optional; else global), "delay_ms": N, "times":
//                                   N}
//   DELETE /admin/faults           clears every fault
//   POST /admin/mode               {"ignore_idempotency_keys": true|false}
//   GET  /admin/stats              {"total": N, "charges_by_reference": {R: N}}
//
// State lives in memory; the process is a test double, restarted per test run.
#include <signal.h>

#include <boost/json.hpp>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>

#include "include/idem/key.h"
#include "server/http/server.h"

namespace {

using namespace idem;
namespace json = boost::json;

struct Fault {
  std::string kind;  // decline, error, hang, slow, succeed_then_timeout
  Millis delay{0};
  int times = -1;  // -1: until cleared
};

http::Response Json(int status, const json::value& v) {
  http::Response r{status, {}, json::serialize(v)};
  r.headers.Set("Content-Type", "application/json");
  return r;
}

class ProviderSim final : public http::Handler {
 public:
  http::Response Handle(const http::Request& request, http::RequestContext& context) override {
    const std::string_view path = request.Path();
    context.route = std::string(path);
    if (path == "/v1/charges" && request.method == "POST") return CreateCharge(request, context);
    if (path == "/v1/charges" && request.method == "GET") return FindCharge(request);
    if (path == "/admin/faults" && request.method == "POST") return SetFault(request);
    if (path == "/admin/faults" && request.method == "DELETE") {
      std::lock_guard lock(mu_);
      faults_.clear();
      global_.reset();
      return Json(200, json::object{{"faults", "cleared"}});
    }
    if (path == "/admin/mode" && request.method == "POST") return SetMode(request);
    if (path == "/admin/stats" && request.method == "GET") return Stats();
    if (path == "/healthz") return Json(200, json::object{{"status", "ok"}});
    return Json(404, json::object{{"error", "not_found"}});
  }

 private:
  // The fault that applies to `reference` now (consuming one use), if any. Caller holds mu_.
  std::optional<Fault> TakeFault(const std::string& reference) {
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

  http::Response CreateCharge(const http::Request& request, http::RequestContext& context) {
    boost::system::error_code ec;
    json::value body = json::parse(request.body, ec);
    const json::object* o = ec ? nullptr : body.if_object();
    auto text = [&](const char* k) -> std::string {
      const json::value* v = o ? o->if_contains(k) : nullptr;
      return v && v->is_string() ? std::string(v->as_string()) : std::string();
    };
    const std::string reference = text("reference");
    const std::string amount = text("amount");
    const std::string currency = text("currency");
    if (reference.empty() || amount.empty() || currency.empty()) {
      return Json(400, json::object{{"error", "invalid_request"}});
    }
    const std::string key = std::string(request.headers.Get("idempotency-key").value_or(""));

    std::lock_guard lock(mu_);
    std::optional<Fault> fault = TakeFault(reference);
    if (fault && fault->kind == "decline")
      return Json(402, json::object{{"error", "card_declined"}});
    if (fault && fault->kind == "error") return Json(503, json::object{{"error", "unavailable"}});
    if (fault && fault->kind == "hang") {
      context.delay = fault->delay.count() > 0 ? fault->delay : Millis(60000);
      context.drop = true;
      return {};
    }
    if (fault && fault->kind == "slow") context.delay = fault->delay;

    json::object charge;
    auto existing = by_key_.find(key);
    if (!ignore_keys_ && !key.empty() && existing != by_key_.end()) {
      charge = charges_[existing->second];  // a repeat: the same charge
    } else {
      std::array<uint8_t, 8> id;
      random_.Fill(id);
      charge["id"] = "ch_" + ToHex(id);
      charge["reference"] = reference;
      charge["amount"] = amount;
      charge["currency"] = currency;
      charge["status"] = "succeeded";
      charges_.push_back(charge);
      if (!key.empty()) by_key_[key] = charges_.size() - 1;
      ++count_by_reference_[reference];
    }
    if (fault && fault->kind == "succeed_then_timeout") {
      context.delay = fault->delay.count() > 0 ? fault->delay : Millis(60000);
      context.drop = true;
      return {};
    }
    return Json(201, charge);
  }

  http::Response FindCharge(const http::Request& request) {
    const std::string reference = std::string(request.QueryParam("reference").value_or(""));
    std::lock_guard lock(mu_);
    for (const json::object& c : charges_) {
      if (c.at("reference").as_string() == reference) return Json(200, c);
    }
    return Json(404, json::object{{"error", "not_found"}});
  }

  http::Response SetFault(const http::Request& request) {
    boost::system::error_code ec;
    json::value body = json::parse(request.body, ec);
    const json::object* o = ec ? nullptr : body.if_object();
    const json::value* kind = o ? o->if_contains("fault") : nullptr;
    static const std::vector<std::string> kKinds = {
        "decline", "error", "hang", "slow", "succeed_then_timeout", "none"};
    if (kind == nullptr || !kind->is_string() ||
        std::find(kKinds.begin(), kKinds.end(), std::string(kind->as_string())) == kKinds.end()) {
      return Json(400, json::object{{"error",
                                     "fault must be one of decline, error, hang, slow, "
                                     "succeed_then_timeout, none"}});
    }
    Fault f;
    f.kind = std::string(kind->as_string());
    if (const json::value* d = o->if_contains("delay_ms"); d && d->is_int64()) {
      f.delay = Millis(d->as_int64());
    }
    if (const json::value* t = o->if_contains("times"); t && t->is_int64()) {
      f.times = static_cast<int>(t->as_int64());
    }
    std::optional<Fault> value = f.kind == "none" ? std::nullopt : std::optional<Fault>(f);
    std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
    ignore_keys_ = v->as_bool();
    return Json(200, json::object{{"ignore_idempotency_keys", ignore_keys_}});
  }

  http::Response Stats() {
    std::lock_guard lock(mu_);
    json::object by_reference;
    for (const auto& [reference, n] : count_by_reference_) by_reference[reference] = n;
    return Json(200, json::object{{"total", charges_.size()},
                                  {"charges_by_reference", std::move(by_reference)}});
  }

  std::mutex mu_;
  std::vector<json::object> charges_;
  std::map<std::string, std::size_t> by_key_;
  std::map<std::string, int64_t> count_by_reference_;
  std::map<std::string, std::optional<Fault>> faults_;
  std::optional<Fault> global_;
  bool ignore_keys_ = false;
  Random& random_ = SystemRandom();
};

class StderrLog final : public http::AccessLog {
 public:
  void Write(const Entry&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  http::ServerOptions options;
  options.port = 8090;
  options.worker_threads = 4;
  options.drain_timeout = Millis(2000);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--listen" && i + 1 < argc) {
      std::string value = argv[++i];
      const std::size_t colon = value.rfind(':');
      if (colon == std::string::npos) {
        std::fprintf(stderr, "provider-sim: --listen HOST:PORT\n");
        return 2;
      }
      options.host = value.substr(0, colon);
      options.port = static_cast<uint16_t>(std::stoi(value.substr(colon + 1)));
    } else {
      std::fprintf(stderr, "usage: provider-sim [--listen HOST:PORT]\n");
      return 2;
    }
  }
  http::BlockStopSignals();

  ProviderSim sim;
  auto server = http::Server::Start(options, sim, nullptr);
  if (!server) {
    std::fprintf(stderr, "provider-sim: %s\n", server.error().message.c_str());
    return 1;
  }
  std::printf("provider-sim listening on http://%s:%u\n", options.host.c_str(),
              static_cast<unsigned>((*server)->port()));
  std::fflush(stdout);
  http::WaitForStopSignal();
  (*server)->Drain();
  return 0;
}
