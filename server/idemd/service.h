// server/idemd/service.h — idemd's HTTP handler: routing, authentication, health and metrics.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "http/server.h"
#include "idem/mutex.h"
#include "server/idemd/config/config.h"
#include "server/idemd/filter/filter.h"
#include "server/idemd/gateway/gateway.h"
#include "server/idemd/metrics.h"
#include "server/idemd/payments/payments.h"
#include "server/idemd/routes.h"

namespace idem::idemd {

// How long /readyz waits for the store's answer (Store::Ping): a probe gets its answer within a
// second whatever the database does, 503 not-ready when the database does not answer in time.
inline constexpr Millis kReadyTimeout{800};

// The longest value of a trusted principal header ([gateway] principal_header): the value is the
// user part of every record's scope, so no longer than a scope part may be (a longer one would
// pass authentication and fail at the claim).
inline constexpr std::size_t kMaxPrincipalHeaderBytes = limits::kPrincipalMaxLength;

// Thread-safe. Borrows everything but the gateway, which it shares with the requests that use
// it. Store calls run on `pool`; reads (GETs) on `reads` (default: `pool`), so that with threads
// of their own they never queue behind claims.
class Service final : public http::Handler {
 public:
  Service(const std::vector<PrincipalEntry>& principals, Store& store, http::BlockingPool& pool,
          Metrics& metrics, IdempotencyFilter& payments_filter, Payments& payments,
          std::shared_ptr<const Gateway> gateway = nullptr, http::BlockingPool* reads = nullptr);

  http::Async<http::Response> Handle(const http::Request& request,
                                     http::RequestContext& context) override;

  // The gateway requests start on from now on (SIGHUP). Requests that began on the one before
  // finish on it, work they left running apart (202 Accepted) included; it is destroyed after.
  void SetGateway(std::shared_ptr<const Gateway> gateway);
  std::shared_ptr<const Gateway> CurrentGateway() const;

 private:
  // The principal of a bearer API key, or nullopt. Keys are compared by SHA-256, so no key is
  // kept in memory and lookups do not depend on the key's bytes.
  std::optional<Principal> Authenticate(const http::Request& request) const;
  // A gateway route's principal: the API key's, or the trusted header's value when the gateway
  // names one ([gateway] principal_header).
  std::optional<Principal> GatewayPrincipal(const http::Request& request,
                                            const Gateway& gateway) const;
  // 401 with WWW-Authenticate, counted under context.route; `detail` says what to send.
  http::Response Unauthorized(http::RequestContext& context,
                              const std::string& detail = "send Authorization: Bearer <api key>");
  // A request on one of idemd's own routes (routes.h); `gateway` names the routes whose
  // operations GET /v1/operations/{key}?route= reads.
  http::Async<http::Response> HandleOwn(const http::Request& request, http::RequestContext& context,
                                        std::shared_ptr<const Gateway> gateway, OwnMatch own);
  // A request on `endpoint`'s route.
  http::Async<http::Response> HandleRoute(const http::Request& request,
                                          http::RequestContext& context,
                                          std::shared_ptr<const Gateway> gateway,
                                          const GatewayEndpoint& endpoint);

  std::map<std::string, Principal> principals_;  // by hex SHA-256 of the API key
  Store& store_;
  http::BlockingPool& pool_;
  http::BlockingPool& reads_;
  Metrics& metrics_;
  IdempotencyFilter& payments_filter_;
  Payments& payments_;
  mutable Mutex gateway_mu_;
  std::shared_ptr<const Gateway> gateway_ IDEM_GUARDED_BY(gateway_mu_);
};

// One JSON line per request on stderr: route, outcome, status, latency, request id; and, given
// `metrics` (borrowed), the request's idem_http_request_duration_seconds{route, code}.
class JsonAccessLog final : public http::AccessLog {
 public:
  explicit JsonAccessLog(Metrics* metrics = nullptr) : metrics_(metrics) {}
  void Write(const Entry& entry) override;

 private:
  Metrics* metrics_;
};

}  // namespace idem::idemd
