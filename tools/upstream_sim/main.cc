// tools/upstream_sim/main.cc — a service that is not idempotent, for the gateway's tests and demos
// (docs/gateway.md): every POST, PUT, PATCH or DELETE executes again, and it counts executions.
//
//   <METHOD> <any target but /admin/…>   → the status of X-Upstream-Status (default 201) after
//       X-Upstream-Delay-Ms (default 0, at most 60000), body
//       {"execution":N,"method":M,"target":T,"key":K|null,"body":B} where N counts every
//       execution, K is the Idempotency-Key it received and B the body as text; headers
//       Location: /things/N, X-Upstream-Execution: N and Set-Cookie (which a gateway must not
//       keep). X-Upstream-Drop: true executes, then closes the connection without an answer;
//       X-Upstream-Drop: unexecuted closes it without executing. X-Upstream-Body-Bytes: N (at
//       most 4 MiB) answers N bytes of 'x' instead of that body (an answer too large to pass on).
//       X-Upstream-Echo: NAME adds "echo": the value of the request's header NAME (or null).
//   GET /status/K → 404 if no request with Idempotency-Key K came, 503 while one executes, else
//       200 with the answer the last one got (its headers and body) and its status in
//       Original-Status: a status URL as the gateway's routes expect one (docs/gateway.md).
//   POST /admin/status {"status":S,"token":T} → from then on the status URL answers S (with an
//       empty body) to every question when S is set, and 401 to a question without
//       Authorization: Bearer T when T is set; {} turns both off.
//   GET /admin/executions  → {"total":N,"by_target":{T:N,…},"keys":{K:N,…},
//       "credentials_seen":N,"status_questions":N} — credentials_seen counts executions that
//       received an Authorization or Cookie header; status_questions the status URL's questions.
#include <atomic>
#include <boost/json.hpp>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <map>
#include <string>

#include "http/async.h"
#include "http/server.h"
#include "idem/mutex.h"

namespace idem {
namespace {

constexpr int64_t kMaxDelayMs = 60000;
constexpr int64_t kMaxBodyBytes = 4 << 20;

std::optional<int64_t> Number(std::optional<std::string_view> text, int64_t low, int64_t high) {
  if (!text) return std::nullopt;
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (error != std::errc() || end != text->data() + text->size() || value < low || value > high) {
    return std::nullopt;
  }
  return value;
}

class UpstreamSim final : public http::Handler {
 public:
  http::Async<http::Response> Handle(const http::Request& request,
                                     http::RequestContext& context) override {
    if (request.Path().rfind("/admin/", 0) == 0) co_return Admin(request);
    if (request.method == "GET" && request.Path().rfind("/status/", 0) == 0) {
      co_return StatusOf(request, std::string(request.Path().substr(8)));
    }
    if (request.headers.Get("x-upstream-drop") == "unexecuted") {
      context.drop = true;  // read, not executed: nothing counted, nothing kept
      co_return http::Response{500, {}, ""};
    }
    if (request.method == "GET" || request.method == "HEAD") {
      co_return http::Response{405, {}, "this upstream only executes\n"};
    }
    const int64_t status = Number(request.headers.Get("x-upstream-status"), 100, 599).value_or(201);
    const int64_t delay =
        Number(request.headers.Get("x-upstream-delay-ms"), 0, kMaxDelayMs).value_or(0);
    const std::optional<std::string_view> key = request.headers.Get("idempotency-key");
    int64_t n = 0;
    {
      MutexLock lock(mu_);
      n = ++total_;
      ++by_target_[request.target];
      if (key) {
        ++keys_[std::string(*key)];
        answers_.erase(std::string(*key));  // executing again
      }
      if (request.headers.Count("authorization") > 0 || request.headers.Count("cookie") > 0) {
        ++credentials_seen_;
      }
    }
    if (delay > 0) co_await http::SleepFor(Millis(delay));
    boost::json::object body{{"execution", n},
                             {"method", request.method},
                             {"target", request.target},
                             {"body", request.body}};
    if (key) {
      body["key"] = *key;
    } else {
      body["key"] = nullptr;
    }
    if (auto echo = request.headers.Get("x-upstream-echo")) {
      if (auto value = request.headers.Get(*echo)) {
        body["echo"] = *value;
      } else {
        body["echo"] = nullptr;
      }
    }
    // The traceparent the request came with (W3C Trace Context), before this hop's own span.
    if (context.trace.parent_id.empty()) {
      body["traceparent"] = nullptr;
    } else {
      body["traceparent"] = context.trace.CallerTraceparent();
    }
    if (auto state = request.headers.Get("tracestate")) {
      body["tracestate"] = *state;
    } else {
      body["tracestate"] = nullptr;
    }
    http::Response r{static_cast<int>(status), {}, boost::json::serialize(body)};
    if (auto size = Number(request.headers.Get("x-upstream-body-bytes"), 0, kMaxBodyBytes)) {
      r.body.assign(static_cast<std::size_t>(*size), 'x');
    }
    r.headers.Set("Content-Type", "application/json");
    r.headers.Set("Location", "/things/" + std::to_string(n));
    r.headers.Set("X-Upstream-Execution", std::to_string(n));
    r.headers.Set("Set-Cookie", "upstream-session=" + std::to_string(n));
    if (key) {
      MutexLock lock(mu_);
      answers_[std::string(*key)] = r;
    }
    if (request.headers.Get("x-upstream-drop") == "true") context.drop = true;  // executed
    co_return r;
  }

 private:
  // GET /status/K: 404 if no request with Idempotency-Key K came, 503 while one executes, else
  // the answer the last one got.
  http::Response StatusOf(const http::Request& request, const std::string& key) {
    MutexLock lock(mu_);
    ++status_questions_;
    if (!status_token_.empty() &&
        request.headers.Get("authorization") != "Bearer " + status_token_) {
      return http::Response{401, {}, "a credential is required\n"};
    }
    if (status_answer_ != 0) return http::Response{status_answer_, {}, ""};
    if (!keys_.contains(key)) return http::Response{404, {}, "no request with this key\n"};
    auto answer = answers_.find(key);
    if (answer == answers_.end()) return http::Response{503, {}, "still executing\n"};
    http::Response r = answer->second;
    r.headers.Set("Original-Status", std::to_string(r.status));
    r.status = 200;
    return r;
  }

  http::Response Admin(const http::Request& request) {
    if (request.Path() == "/admin/status" && request.method == "POST") {
      boost::system::error_code ec;
      const boost::json::value v = boost::json::parse(request.body, ec);
      if (ec || !v.is_object()) return http::Response{400, {}, "a JSON object expected\n"};
      const boost::json::object& o = v.as_object();
      MutexLock lock(mu_);
      const boost::json::value* status = o.if_contains("status");
      status_answer_ =
          status != nullptr && status->is_int64() ? static_cast<int>(status->as_int64()) : 0;
      const boost::json::value* token = o.if_contains("token");
      status_token_ = token != nullptr && token->is_string() ? std::string(token->as_string()) : "";
      return http::Response{200, {}, "ok\n"};
    }
    if (request.Path() != "/admin/executions" || request.method != "GET") {
      return http::Response{404, {}, "no such admin resource\n"};
    }
    boost::json::object by_target;
    boost::json::object keys;
    boost::json::object out;
    MutexLock lock(mu_);
    for (const auto& [target, count] : by_target_) by_target[target] = count;
    for (const auto& [key, count] : keys_) keys[key] = count;
    out["total"] = total_;
    out["by_target"] = std::move(by_target);
    out["keys"] = std::move(keys);
    out["credentials_seen"] = credentials_seen_;
    out["status_questions"] = status_questions_;
    http::Response r{200, {}, boost::json::serialize(out)};
    r.headers.Set("Content-Type", "application/json");
    return r;
  }

  Mutex mu_;
  int64_t total_ IDEM_GUARDED_BY(mu_) = 0;
  int64_t credentials_seen_ IDEM_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> by_target_ IDEM_GUARDED_BY(mu_);
  std::map<std::string, int64_t> keys_ IDEM_GUARDED_BY(mu_);
  // By key: the last execution's answer.
  std::map<std::string, http::Response> answers_ IDEM_GUARDED_BY(mu_);
  int status_answer_ IDEM_GUARDED_BY(mu_) = 0;     // 0: the status URL answers by its books
  std::string status_token_ IDEM_GUARDED_BY(mu_);  // "": the status URL wants no credential
  int64_t status_questions_ IDEM_GUARDED_BY(mu_) = 0;
};

}  // namespace
}  // namespace idem

int main(int argc, char** argv) {
  using namespace idem;
  http::ServerOptions options;
  options.port = 3000;
  options.io_threads = 2;
  options.drain_timeout = Millis(2000);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--listen" && i + 1 < argc) {
      auto address = http::ParseListenAddress(argv[++i]);
      if (!address) {
        std::fprintf(stderr, "upstream-sim: %s\n", address.error().message.c_str());
        return 2;
      }
      options.host = address->host;
      options.port = address->port;
    } else {
      std::fprintf(stderr, "usage: upstream-sim [--listen HOST:PORT]\n");
      return 2;
    }
  }
  http::BlockSignals();
  UpstreamSim sim;
  auto server = http::Server::Start(options, sim, nullptr);
  if (!server) {
    std::fprintf(stderr, "upstream-sim: %s\n", server.error().message.c_str());
    return 1;
  }
  std::printf("upstream-sim listening on http://%s\n",
              http::Authority(options.host, (*server)->port()).c_str());
  std::fflush(stdout);
  while (http::WaitForSignal() == SIGHUP) {
  }
  (*server)->Drain();
  return 0;
}
