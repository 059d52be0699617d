// tools/provider_sim/main.cc — a downstream payment provider for tests, demos and benchmarks:
// the provider calls idemd makes (docs/idemd.md), its own idempotency keys, and an admin API to
// inject faults.
//
//   POST /v1/charges               Idempotency-Key + {"amount","currency","reference"}
//                                   → 201 | 402 | 5xx
//   GET  /v1/charges?reference=R   → 200 charge | 404
//   POST /admin/faults             {"fault": "decline"|"error"|"hang"|"slow"|
//                                   "succeed_then_timeout"|"late"|"none",
//                                   "reference": R (optional; else global), "delay_ms": N,
//                                   "times": N}
//
// Faults: `decline` answers 402, `error` 503, both charging nothing. `hang` charges nothing and
// drops the connection after delay_ms (default 60 s). `slow` charges at once and answers after
// delay_ms. `succeed_then_timeout` charges at once and drops the connection after delay_ms.
// `late` models a provider that executes a request after its caller gave up: the charge is
// created delay_ms after the request arrived, whether or not the caller still waits (a closed
// connection does not cancel it); a caller still waiting gets the answer then. Until then a
// lookup by reference finds nothing.
//   DELETE /admin/faults           clears every fault
//   POST /admin/mode               {"ignore_idempotency_keys": true|false}
//   GET  /admin/stats              {"total": N, "charges_by_reference": {R: N}}
//
// State lives in memory; the process is a test double, restarted per test run.
#include <signal.h>

#include <boost/json.hpp>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <stop_token>
#include <thread>

#include "include/idem/key.h"
#include "server/http/server.h"

namespace {

using namespace idem;
namespace json = boost::json;

struct Fault {
  std::string kind;  // decline, error, hang, slow, succeed_then_timeout, late
  Millis delay{0};
  int times = -1;  // -1: until cleared
};

http::Response Json(int status, const json::value& v) {
  http::Response r{status, {}, json::serialize(v)};
  r.headers.Set("Content-Type", "application/json");
  return r;
}

// Thread-safe: every member is guarded by mu_; late charges land on their own threads, joined
// (and cut short) when the simulator is destroyed.
class ProviderSim final : public http::Handler {
 public:
  ~ProviderSim() override {
    for (std::jthread& t : late_) t.request_stop();
    late_cv_.notify_all();
  }

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

    if (fault && fault->kind == "late") {
      // Answered at the landing time if the caller still waits; made then whatever it did.
      const Millis delay = fault->delay;
      context.delay = delay;
      std::string id = NewChargeId();
      json::object answer = NewCharge(id, reference, amount, currency);
      late_.emplace_back([this, delay, key, id, reference, amount, currency](std::stop_token stop) {
        std::unique_lock late_lock(mu_);
        late_cv_.wait_for(late_lock, stop, delay, [] { return false; });
        if (stop.stop_requested()) return;
        (void)Charge(key, id, reference, amount, currency);
      });
      return Json(201, answer);
    }
    json::object charge = Charge(key, NewChargeId(), reference, amount, currency);
    if (fault && fault->kind == "succeed_then_timeout") {
      context.delay = fault->delay.count() > 0 ? fault->delay : Millis(60000);
      context.drop = true;
      return {};
    }
    return Json(201, charge);
  }

  std::string NewChargeId() {
    std::array<uint8_t, 8> id;
    random_.Fill(id);
    return "ch_" + ToHex(id);
  }
  static json::object NewCharge(const std::string& id, const std::string& reference,
                                const std::string& amount, const std::string& currency) {
    return json::object{{"id", id},
                        {"reference", reference},
                        {"amount", amount},
                        {"currency", currency},
                        {"status", "succeeded"}};
  }
  // Makes the charge `id` unless `key` was seen before and keys are honoured: then the earlier
  // charge is the answer. Caller holds mu_.
  json::object Charge(const std::string& key, const std::string& id, const std::string& reference,
                      const std::string& amount, const std::string& currency) {
    auto existing = by_key_.find(key);
    if (!ignore_keys_ && !key.empty() && existing != by_key_.end()) {
      return charges_[existing->second];  // a repeat: the same charge
    }
    json::object charge = NewCharge(id, reference, amount, currency);
    charges_.push_back(charge);
    if (!key.empty()) by_key_[key] = charges_.size() - 1;
    ++count_by_reference_[reference];
    return charge;
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
        "decline", "error", "hang", "slow", "succeed_then_timeout", "late", "none"};
    if (kind == nullptr || !kind->is_string() ||
        std::find(kKinds.begin(), kKinds.end(), std::string(kind->as_string())) == kKinds.end()) {
      return Json(400, json::object{{"error",
                                     "fault must be one of decline, error, hang, slow, "
                                     "succeed_then_timeout, late, none"}});
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
  std::condition_variable_any late_cv_;  // never notified but at destruction: a stoppable sleep
  std::vector<std::jthread> late_;       // one per late charge; never pruned (a test double)
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
