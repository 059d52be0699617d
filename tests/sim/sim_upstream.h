// tests/sim/sim_upstream.h — the simulator's gateway upstream: an orders service behind a gateway
// route, as an http::Upstream in simulated time, failing in every way docs/gateway.md allows: a
// 503 that did nothing (declared: nothing_done_statuses); a 500 that did nothing, or that came
// after it executed; a timeout or a reset connection after it executed; an execution that
// lands after the caller gave up; an answer larger than the route keeps; a request that never
// left. It executes POST /v1/orders ({"op": id}) and answers its status URL
// (GET /v1/orders/by-key/{key}) with 404 before an execution has landed, or with a 5xx, a 401 or
// nothing. It honours the forwarded key or not, as the schedule says. Each fault is drawn from
// the schedule's random stream.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "http/client.h"
#include "idem/clock.h"
#include "tests/sim/sim_common.h"

namespace idem::sim {

inline constexpr std::string_view kUpstreamKeyHeader = "idem-upstream-key";
inline constexpr std::string_view kStatusPath = "/v1/orders/by-key/{key}";

// Single-threaded: the simulator's one thread calls it. Borrows the clocks, `rng` and `log`.
class SimUpstream final : public http::Upstream {
 public:
  struct Options {
    bool honours_keys = false;
    Millis timeout{1000};           // the route's timeout_ms
    Millis lands_within{2400};      // the longest an execution takes to land after the request left
    std::size_t large_body = 4096;  // the size of the answers of operations whose answer is large
  };
  // `clock`: the world's time, by which executions land; `caller`: the clock of the instance
  // that calls, by which its deadlines (CallOptions::send_by) are set.
  SimUpstream(Options options, const MonotonicClock& clock, const MonotonicClock& caller,
              std::mt19937_64& rng, std::function<void(const std::string&)> log);

  void SetFaults(bool on) { faults_ = on; }
  void SetAtOnce(bool at_once) { delays_.SetAtOnce(at_once); }
  // Lands the executions due by now; LandAll lands every one still to land.
  void Tick();
  void LandAll();
  // Executions of operation `op` so far.
  int ExecutionsOf(const std::string& op) const;
  const std::map<std::string, int>& Executions() const { return executions_; }

  http::Async<Result<http::Response>> Exchange(http::Request request,
                                               http::CallOptions options) override;

 private:
  struct Pending {
    SteadyTime at;
    std::string key;
    std::string op;
  };
  // Whether an execution under `key` has been asked for and not landed yet.
  bool Landing(const std::string& key) const;
  // Executes `op` under `key` (honouring keys: at most once per key) and returns its answer.
  // `kept`, when given, is the answer it keeps for the key instead (a repeat gets it again, and
  // the status URL reports it): a 500 it gave after the work, say.
  http::Response Execute(const std::string& key, const std::string& op,
                         const std::optional<http::Response>& kept = std::nullopt);
  http::Response AnswerOf(const std::string& op, const std::string& order) const;
  http::Async<Result<http::Response>> Forward(http::Request request, http::CallOptions options);
  http::Async<Result<http::Response>> Status(std::string key);

  Options options_;
  const MonotonicClock& clock_;
  const MonotonicClock& caller_;
  std::mt19937_64& rng_;
  std::function<void(const std::string&)> log_;
  bool faults_ = true;
  SimDelays delays_{rng_};
  int next_order_ = 0;
  std::map<std::string, int> executions_;         // by operation
  std::map<std::string, http::Response> by_key_;  // the answer of each key's first execution
  std::vector<Pending> pending_;
};

}  // namespace idem::sim
