// tests/sim/sim_upstream.cc — the simulator's gateway upstream.
#include "tests/sim/sim_upstream.h"

#include <algorithm>
#include <boost/json.hpp>

#include "http/async.h"

namespace idem::sim {
namespace {

namespace json = boost::json;

// Whether `op`'s answer is large: that of every operation whose number ends in 3, larger than the
// simulator's route keeps (SimUpstream::Options::large_body).
bool AnswersLarge(const std::string& op) { return !op.empty() && op.back() == '3'; }

}  // namespace

SimUpstream::SimUpstream(Options options, const MonotonicClock& clock, const MonotonicClock& caller,
                         std::mt19937_64& rng, std::function<void(const std::string&)> log)
    : options_(options), clock_(clock), caller_(caller), rng_(rng), log_(std::move(log)) {}

bool SimUpstream::Landing(const std::string& key) const {
  return std::any_of(pending_.begin(), pending_.end(),
                     [&](const Pending& p) { return p.key == key; });
}

void SimUpstream::Tick() {
  const SteadyTime now = clock_.Now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->at <= now) {
      log_("upstream: a late execution lands for " + it->op);
      (void)Execute(it->key, it->op);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void SimUpstream::LandAll() {
  for (Pending& p : pending_) p.at = clock_.Now();
  Tick();
}

int SimUpstream::ExecutionsOf(const std::string& op) const {
  auto it = executions_.find(op);
  return it == executions_.end() ? 0 : it->second;
}

http::Response SimUpstream::AnswerOf(const std::string& op, const std::string& order) const {
  json::object o;
  o["op"] = op;
  o["order"] = order;
  if (AnswersLarge(op)) o["receipt"] = std::string(options_.large_body, 'r');
  http::Response r{201, {}, json::serialize(o)};
  r.headers.Set("Content-Type", "application/json");
  r.headers.Set("Location", "/v1/orders/" + order);
  return r;
}

http::Response SimUpstream::Execute(const std::string& key, const std::string& op,
                                    const std::optional<http::Response>& kept) {
  auto known = by_key_.find(key);
  if (options_.honours_keys && known != by_key_.end()) {
    log_("upstream: the key was executed before: its first answer again");
    return known->second;
  }
  ++executions_[op];
  http::Response answer = AnswerOf(op, "ord_" + std::to_string(++next_order_));
  if (known == by_key_.end()) by_key_.emplace(key, kept ? *kept : answer);
  return answer;
}

http::Async<Result<http::Response>> SimUpstream::Exchange(http::Request request,
                                                          http::CallOptions options) {
  Tick();  // what landed by now, however time moved since the last step
  constexpr std::string_view kStatusPrefix = "/v1/orders/by-key/";
  if (request.method == "GET" && request.target.rfind(kStatusPrefix, 0) == 0) {
    co_return co_await Status(request.target.substr(kStatusPrefix.size()));
  }
  co_return co_await Forward(std::move(request), options);
}

http::Async<Result<http::Response>> SimUpstream::Forward(http::Request request,
                                                         http::CallOptions options) {
  const std::string key(request.headers.Get(kUpstreamKeyHeader).value_or(""));
  // How the trace names an operation: its id and the first digits of its upstream key.
  const std::string op = StringMember(request.body, "op");
  const std::string named = op + " (key " + key.substr(0, 8) + ")";
  // As the HTTP client: the request leaves by send_by or not at all.
  if (options.send_by && caller_.Now() > *options.send_by) {
    log_("upstream: a forward of " + named + " is not sent: its time to leave has passed");
    co_return MakeError(Errc::kUnavailable, "the request did not leave in time");
  }
  enum class F {
    kAnswered,
    kBusy,
    kFailedNothing,
    kFailedAfter,
    kResetAfter,
    kTimeoutAfter,
    kTimeoutLandsLate,
    kNeverLeft
  };
  F fault = F::kAnswered;
  if (faults_) {
    static constexpr F kFaults[] = {F::kAnswered,   F::kAnswered,      F::kAnswered,
                                    F::kBusy,       F::kFailedNothing, F::kFailedAfter,
                                    F::kResetAfter, F::kTimeoutAfter,  F::kTimeoutLandsLate,
                                    F::kNeverLeft};
    fault = kFaults[rng_() % std::size(kFaults)];
  }
  if (options_.honours_keys && Landing(key) && fault != F::kNeverLeft) {
    log_("upstream: a forward of " + named + " while its first still executes: 409");
    co_await delays_.Wait(delays_.Below(options_.timeout));
    co_return http::Response{409, {}, "{\"error\":\"in progress\"}"};
  }
  switch (fault) {
    case F::kAnswered: {
      log_("upstream: executes " + named);
      http::Response answer = Execute(key, op);
      co_await delays_.Wait(delays_.Below(options_.timeout));
      co_return answer;
    }
    case F::kBusy:
      log_("upstream: " + named + " answered 503, nothing done");
      co_await delays_.Wait(delays_.Below(options_.timeout));
      co_return http::Response{503, {}, "{\"error\":\"busy\"}"};
    case F::kFailedNothing:
      log_("upstream: " + named + " answered 500, nothing done");
      co_await delays_.Wait(delays_.Below(options_.timeout));
      co_return http::Response{500, {}, "{\"error\":\"oops\"}"};
    case F::kFailedAfter: {
      // Some upstreams keep the 500 as the key's answer (a repeat gets it again, the status URL
      // reports it); others keep what the work made.
      const http::Response failed{500, {}, "{\"error\":\"oops\"}"};
      const bool keeps_failure = rng_() % 2 == 0;
      log_("upstream: executes " + named + ", then answers 500" +
           (keeps_failure ? " (and keeps the 500 as its answer)" : ""));
      (void)Execute(key, op, keeps_failure ? std::optional<http::Response>(failed) : std::nullopt);
      co_await delays_.Wait(delays_.Below(options_.timeout));
      co_return failed;
    }
    case F::kResetAfter:
      log_("upstream: executes " + named + ", then the connection resets");
      (void)Execute(key, op);
      co_await delays_.Wait(delays_.Below(options_.timeout));
      co_return MakeError(Errc::kDataLoss, "connection reset by peer");
    case F::kTimeoutAfter:
      log_("upstream: executes " + named + ", no answer by the deadline");
      (void)Execute(key, op);
      co_await delays_.Wait(options_.timeout);
      co_return MakeError(Errc::kDeadlineExceeded, "no answer in time");
    case F::kTimeoutLandsLate:
      log_("upstream: " + named + ": no answer by the deadline, it executes later");
      pending_.push_back({clock_.Now() + delays_.Below(options_.lands_within), key, op});
      co_await delays_.Wait(options_.timeout);
      co_return MakeError(Errc::kDeadlineExceeded, "no answer in time");
    case F::kNeverLeft:
      log_("upstream: a forward of " + named + " never left");
      co_return MakeError(Errc::kUnavailable, "connection refused");
  }
  co_return MakeError(Errc::kInternal, "unreachable");
}

http::Async<Result<http::Response>> SimUpstream::Status(std::string key) {
  enum class F { kAnswered, kFailed, kUnauthorized, kTimeout };
  F fault = F::kAnswered;
  if (faults_) {
    static constexpr F kFaults[] = {F::kAnswered, F::kAnswered,     F::kAnswered,
                                    F::kFailed,   F::kUnauthorized, F::kTimeout};
    fault = kFaults[rng_() % std::size(kFaults)];
  }
  switch (fault) {
    case F::kAnswered:
      break;
    case F::kFailed:
      log_("upstream: its status URL answers 500");
      co_await delays_.Wait(delays_.Below(options_.timeout));
      co_return http::Response{500, {}, "oops"};
    case F::kUnauthorized:
      log_("upstream: its status URL answers 401");
      co_await delays_.Wait(delays_.Below(options_.timeout));
      co_return http::Response{401, {}, "<html>sign in</html>"};
    case F::kTimeout:
      log_("upstream: its status URL gives no answer by the deadline");
      co_await delays_.Wait(options_.timeout);
      co_return MakeError(Errc::kDeadlineExceeded, "no answer in time");
  }
  auto it = by_key_.find(key);
  if (it == by_key_.end()) {
    log_(std::string("upstream: its status URL has no request under the key") +
         (Landing(key) ? " (one is still to land)" : ""));
    co_await delays_.Wait(delays_.Below(options_.timeout));
    co_return http::Response{404, {}, "{\"error\":\"not found\"}"};
  }
  log_("upstream: its status URL reports the answer it gave");
  http::Response report{200, it->second.headers, it->second.body};
  report.headers.Set("Original-Status", std::to_string(it->second.status));
  co_await delays_.Wait(delays_.Below(options_.timeout));
  co_return report;
}

}  // namespace idem::sim
