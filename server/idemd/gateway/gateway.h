// server/idemd/gateway/gateway.h — the gateway as idemd serves it (docs/gateway.md): each route's
// filter in front of its proxy, with a keep-alive pool per upstream, and the pool for requests no
// route matches. Built whole from a GatewayConfig, never changed after: SIGHUP builds another and
// the service swaps it in, while requests that began on this one finish on it.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "http/client.h"
#include "server/idemd/filter/filter.h"
#include "server/idemd/gateway/proxy.h"
#include "server/idemd/gateway/routes.h"

namespace idem::idemd {

// A gateway route as the service serves it: the filter in front of its proxy.
struct GatewayEndpoint {
  const GatewayRoute* route;
  IdempotencyFilter* filter;
  ProxyOperation* proxy;
};

// What every route's filter shares with the rest of idemd; borrowed.
struct GatewayDeps {
  Engine& engine;
  http::BlockingPool& pool;   // claims and completions
  http::BlockingPool& reads;  // snapshot reads
  MonotonicClock& monotonic;
  Metrics& metrics;
  KeyPolicy keys;
  int64_t max_processing;
  int64_t max_retained;
  int64_t max_waiters_per_principal;
  int64_t max_new_keys_per_second;
  Millis wait_max;
  Millis lease_margin;
};

// Thread-safe; immutable once made.
class Gateway {
 public:
  // Errors: kInvalidArgument for an upstream URL or CA file the pools refuse.
  // `previous` (the gateway a SIGHUP replaces, or null): a kept route (the same name) whose
  // fingerprint rules changed keeps verifying its existing records under the rules they were
  // made with (the newest kMaxKeptRules versions).
  static Result<std::shared_ptr<const Gateway>> Make(GatewayConfig config, const GatewayDeps& deps,
                                                     const Gateway* previous = nullptr);

  // The endpoint of the route `method` and `path` (no query) belong to, or nullptr.
  const GatewayEndpoint* Match(std::string_view method, std::string_view path) const;
  // The endpoint of the route named `name`, or nullptr.
  const GatewayEndpoint* Named(std::string_view name) const;
  // Whether `route_id` (GatewayRoute::RouteId: "gw." + name) is one of these routes.
  bool Serves(std::string_view route_id) const;
  // Whether requests no route matches pass through (else they are answered 404).
  bool ForwardsUnmatched() const { return unmatched_ != nullptr; }
  // A request no route matches, forwarded as it is but for hop-by-hop headers, with the
  // upstream's answer likewise: 503 `unavailable` if the upstream cannot be reached, 504
  // `timeout` if it gives no usable answer in time (none, a lone 1xx, a body over 1 MiB). Only
  // when ForwardsUnmatched().
  http::Async<http::Response> PassThrough(const http::Request& request) const;
  const GatewayConfig& Settings() const { return config_; }

  // Resolves stale records of every route (the takeover loop).
  void TakeOverOnce(int limit, const std::function<void(const std::string&)>& notify) const;

 private:
  Gateway(GatewayConfig config, const GatewayDeps& deps)
      : config_(std::move(config)), monotonic_(deps.monotonic), metrics_(deps.metrics) {}

  GatewayConfig config_;  // never changed: the endpoints point into its routes
  MonotonicClock& monotonic_;
  Metrics& metrics_;
  std::vector<std::unique_ptr<http::ClientPool>> upstreams_;
  std::vector<std::unique_ptr<ProxyOperation>> proxies_;
  std::vector<std::unique_ptr<IdempotencyFilter>> filters_;
  std::vector<GatewayEndpoint> endpoints_;  // one per route, in config_.routes' order
  std::unique_ptr<http::ClientPool> unmatched_;
};

}  // namespace idem::idemd
