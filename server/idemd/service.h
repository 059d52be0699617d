// server/idemd/service.h — idemd's HTTP handler: routing, authentication, health and metrics.
#pragma once

#include <map>
#include <string>

#include "server/http/server.h"
#include "server/idemd/config.h"
#include "server/idemd/filter.h"
#include "server/idemd/metrics.h"
#include "server/idemd/payments.h"
#include "server/idemd/proxy.h"

namespace idem::idemd {

// How long /readyz waits for the store's answer (Store::Ping): a probe gets its answer within a
// second whatever the database does, 503 not-ready when the database does not answer in time.
inline constexpr Millis kReadyTimeout{800};

// A gateway route as the service serves it: the filter in front of its proxy.
struct GatewayEndpoint {
  const GatewayRoute* route;
  IdempotencyFilter* filter;
  ProxyOperation* proxy;
};

// Thread-safe. Borrows everything. Store calls run on `pool`; reads (GETs) on `reads` (default:
// `pool`), so that with threads of their own they never queue behind claims.
class Service final : public http::Handler {
 public:
  Service(const std::vector<PrincipalEntry>& principals, Store& store, http::BlockingPool& pool,
          Metrics& metrics, IdempotencyFilter& payments_filter, Payments& payments,
          std::vector<GatewayEndpoint> gateway = {}, http::BlockingPool* reads = nullptr);

  http::Async<http::Response> Handle(const http::Request& request,
                                     http::RequestContext& context) override;

 private:
  // The principal of a bearer API key, or nullopt. Keys are compared by SHA-256, so no key is
  // kept in memory and lookups do not depend on the key's bytes.
  std::optional<Principal> Authenticate(const http::Request& request) const;
  // 401 with WWW-Authenticate, counted under context.route.
  http::Response Unauthorized(http::RequestContext& context);

  std::map<std::string, Principal> principals_;  // by hex SHA-256 of the API key
  Store& store_;
  http::BlockingPool& pool_;
  http::BlockingPool& reads_;
  Metrics& metrics_;
  IdempotencyFilter& payments_filter_;
  Payments& payments_;
  std::vector<GatewayEndpoint> gateway_;
  std::vector<GatewayRoute> gateway_routes_;  // gateway_'s routes, for MatchGatewayRoute
};

// One JSON line per request on stderr: route, outcome, status, latency, request id.
class JsonAccessLog final : public http::AccessLog {
 public:
  void Write(const Entry& entry) override;
};

}  // namespace idem::idemd
