// server/idemd/service.cc — idemd's routes (docs/openapi.yaml).
#include "server/idemd/service.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cstdio>
#include <utility>

#include "http/log.h"
#include "http/problem.h"
#include "idem/key.h"
#include "server/idemd/routes.h"

namespace idem::idemd {
namespace {

http::Response Json(int status, std::string body) {
  http::Response r{status, {}, std::move(body)};
  r.headers.Set("Content-Type", "application/json");
  return r;
}

http::Response MethodNotAllowed(const char* allow) {
  auto r = http::Problem(http::ProblemKind::kMethodNotAllowed, std::string("allowed: ") + allow);
  r.headers.Set("Allow", allow);
  return r;
}

}  // namespace

Service::Service(const std::vector<PrincipalEntry>& principals, Store& store,
                 http::BlockingPool& pool, Metrics& metrics, IdempotencyFilter& payments_filter,
                 Payments& payments, std::shared_ptr<const Gateway> gateway,
                 http::BlockingPool* reads)
    : store_(store),
      pool_(pool),
      reads_(reads != nullptr ? *reads : pool),
      metrics_(metrics),
      payments_filter_(payments_filter),
      payments_(payments),
      gateway_(std::move(gateway)) {
  for (const PrincipalEntry& p : principals) principals_[p.api_key_sha256] = {p.tenant, p.user};
}

void Service::SetGateway(std::shared_ptr<const Gateway> gateway) {
  std::shared_ptr<const Gateway> before;
  {
    MutexLock lock(gateway_mu_);
    before = std::exchange(gateway_, std::move(gateway));
  }
  // `before` is released here, outside the lock: its last request may have ended already.
}

std::shared_ptr<const Gateway> Service::CurrentGateway() const {
  MutexLock lock(gateway_mu_);
  return gateway_;
}

std::optional<Principal> Service::Authenticate(const http::Request& request) const {
  auto header = request.headers.Get("authorization");
  if (!header || request.headers.Count("authorization") != 1) return std::nullopt;
  constexpr std::string_view kScheme = "bearer ";
  if (header->size() <= kScheme.size() ||
      http::ToLower(header->substr(0, kScheme.size())) != kScheme) {
    return std::nullopt;
  }
  std::string_view key = header->substr(kScheme.size());
  while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
  if (key.empty() || key.size() > 512) return std::nullopt;
  auto it = principals_.find(ToHex(Sha256({key})));
  if (it == principals_.end()) return std::nullopt;
  return it->second;
}

std::optional<Principal> Service::GatewayPrincipal(const http::Request& request,
                                                   const Gateway& gateway) const {
  const std::string& header = gateway.Settings().principal_header;
  if (header.empty()) return Authenticate(request);
  auto value = request.headers.Get(header);
  if (!value || request.headers.Count(header) != 1 || value->empty() ||
      value->size() > kMaxPrincipalHeaderBytes ||
      value->find('\x1f') != std::string_view::npos) {  // the scope's separator (Scope::Hash)
    return std::nullopt;
  }
  return Principal{"header", std::string(*value)};
}

http::Response Service::Unauthorized(http::RequestContext& context, const std::string& detail) {
  metrics_.CountRequest(context, RequestOutcome::kUnauthorized);
  auto r = http::Problem(http::ProblemKind::kUnauthorized, detail);
  r.headers.Set("WWW-Authenticate", "Bearer");
  return r;
}

http::Async<http::Response> Service::Handle(const http::Request& request,
                                            http::RequestContext& context) {
  const std::string_view path = request.Path();
  // A request keeps the gateway it was first routed with, also across the calls of a parked
  // request: a reload meanwhile does not route it elsewhere.
  if (context.attempt == 1) context.Pin(CurrentGateway());
  const std::shared_ptr<const Gateway> gateway = context.Pinned<Gateway>();
  // idemd's own routes first: no gateway route can match them (the config refuses one that
  // could), so a payment never looks through the gateway's table.
  if (const std::optional<OwnMatch> own = MatchOwnRoute(path)) {
    co_return co_await HandleOwn(request, context, gateway, *own);
  }
  if (const GatewayEndpoint* endpoint = gateway ? gateway->Match(request.method, path) : nullptr) {
    co_return co_await HandleRoute(request, context, gateway, *endpoint);
  }
  if (gateway && gateway->ForwardsUnmatched()) {
    context.route = "unmatched";
    if (request.method == "CONNECT" || request.method == "TRACE") {
      // A tunnel or an echo of the request (its credentials included) through idemd, which
      // does not authenticate what it passes through: never forwarded.
      metrics_.CountRequest(context, RequestOutcome::kInvalid);
      co_return MethodNotAllowed("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS");
    }
    metrics_.CountRequest(context, RequestOutcome::kPassedThrough);
    co_return co_await gateway->PassThrough(request);
  }
  context.route = "unknown";
  co_return http::Problem(http::ProblemKind::kNotFound, "no such resource");
}

http::Async<http::Response> Service::HandleOwn(const http::Request& request,
                                               http::RequestContext& context,
                                               std::shared_ptr<const Gateway> gateway,
                                               OwnMatch own) {
  context.route = std::string(own.entry->label);
  const OwnRoute route = own.entry->route;
  if (route == OwnRoute::kHealthz || route == OwnRoute::kReadyz) {
    if (request.method != "GET" && request.method != "HEAD")
      co_return MethodNotAllowed("GET, HEAD");
    if (route == OwnRoute::kHealthz) co_return Json(200, R"({"status":"ok"})");
    // Answered even when every store thread is held (by a stalled database): the ping has its own
    // bound, and the probe waits for it at most twice that, then answers 503 while it runs on.
    auto ping = std::make_shared<Status>(Ok());
    // Named, not a temporary in the co_await expression: GCC 12 destroys the by-value captures
    // of a lambda there twice (docs/design.md, "Coroutines").
    std::function<void()> work = [&store = store_, ping] { *ping = store.Ping(kReadyTimeout); };
    const bool answered = co_await pool_.RunWithin(std::move(work), 2 * kReadyTimeout);
    if (!answered || !*ping) {
      co_return http::Problem(
          http::ProblemKind::kNotReady,
          "the store did not answer within " + std::to_string(kReadyTimeout.count()) + " ms");
    }
    co_return Json(200, R"({"status":"ready"})");
  }
  if (route == OwnRoute::kMetrics) {
    if (request.method != "GET") co_return MethodNotAllowed("GET");
    http::Response r{200, {}, metrics_.Render()};
    r.headers.Set("Content-Type", "text/plain; version=0.0.4");
    co_return r;
  }
  // Keys are per route: ?route= names a gateway route's operation (its Location says so), whose
  // principal comes as that route's do; without it, the payments route's.
  const std::optional<std::string_view> route_name =
      route == OwnRoute::kOperationGet ? request.QueryParam("route") : std::nullopt;
  const GatewayEndpoint* named = route_name && gateway ? gateway->Named(*route_name) : nullptr;
  auto principal = named ? GatewayPrincipal(request, *gateway) : Authenticate(request);
  if (!principal) {
    co_return Unauthorized(context);
  }
  if (route == OwnRoute::kPaymentsCreate) {
    if (request.method != "POST") co_return MethodNotAllowed("POST");
    co_return co_await payments_filter_.Handle(request, *principal, context);
  }
  if (route == OwnRoute::kPaymentEventsReplay) {
    if (request.method != "POST") co_return MethodNotAllowed("POST");
    co_return co_await pool_.Call([&] { return payments_.Events(own.id, *principal, true); });
  }
  if (request.method != "GET") co_return MethodNotAllowed("GET");
  if (route == OwnRoute::kPaymentEvents)
    co_return co_await reads_.Call([&] { return payments_.Events(own.id, *principal, false); });
  if (route == OwnRoute::kPaymentGet)
    co_return co_await reads_.Call([&] { return payments_.Get(own.id, *principal); });
  if (route_name && named == nullptr) {
    co_return http::Problem(http::ProblemKind::kNotFound, "no gateway route with this name");
  }
  IdempotencyFilter& filter = named != nullptr ? *named->filter : payments_filter_;
  co_return co_await reads_.Call([&] { return filter.GetOperation(own.id, *principal); });
}

http::Async<http::Response> Service::HandleRoute(const http::Request& request,
                                                 http::RequestContext& context,
                                                 std::shared_ptr<const Gateway> gateway,
                                                 const GatewayEndpoint& endpoint) {
  context.route = endpoint.route->name;
  auto principal = GatewayPrincipal(request, *gateway);
  if (!principal) {
    // The trusted header is not named: a caller who could reach idemd without the
    // authentication layer would learn what to forge.
    co_return gateway->Settings().principal_header.empty()
        ? Unauthorized(context)
        : Unauthorized(context, "this route needs an authenticated principal");
  }
  // Work the filter leaves running apart from the request (202 Accepted) keeps this gateway, as
  // the request does, however many reloads come meanwhile.
  if (context.spawn && context.attempt == 1) {
    context.spawn = [spawn = std::move(context.spawn),
                     gateway](std::function<http::Async<void>()> task) {
      spawn([task = std::move(task), gateway] { return task(); });
    };
  }
  if (!AmbiguousParameterSegment(*endpoint.route, request.Path()).empty()) {
    // An upstream that normalises the path would act on another resource than the one the
    // route's pattern (and the record) names.
    metrics_.CountRequest(context, RequestOutcome::kInvalid);
    co_return http::Problem(http::ProblemKind::kInvalidRequest,
                            "a path parameter must not be '.' or '..' or hold an encoded '/' or "
                            "'\\' (%2F, %5C) or a '\\'");
  }
  if (!endpoint.route->key_required && request.headers.Count("idempotency-key") == 0) {
    context.outcome = RequestOutcomeName(RequestOutcome::kForwardedWithoutKey);  // not counted
    co_return co_await endpoint.proxy->ForwardWithoutKey(request);
  }
  co_return co_await endpoint.filter->Handle(request, *principal, context);
}

void JsonAccessLog::Write(const Entry& e) {
  if (metrics_ != nullptr) metrics_->ObserveHttpRequest(e.route, e.status, e.latency_ms / 1000.0);
  // The fields live on the stack: a request's line allocates nothing for them.
  unsigned char storage[1024];
  boost::json::monotonic_resource arena(storage, sizeof storage);
  const boost::json::object fields(
      {{"request_id", e.request_id},
       {"trace_id", e.trace_id},
       {"span_id", e.span_id},
       {"method", e.method},
       {"route", e.route.empty() ? std::string_view("unknown") : std::string_view(e.route)},
       {"outcome", e.outcome},
       {"status", e.status},
       {"latency_us", static_cast<int64_t>(e.latency_ms * 1000)}},
      &arena);
  http::Log(http::LogLevel::kInfo, "request", fields);
}

}  // namespace idem::idemd
