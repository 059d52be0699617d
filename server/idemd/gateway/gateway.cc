// server/idemd/gateway/gateway.cc — the gateway's routes built from their config.
#include "server/idemd/gateway/gateway.h"

#include <algorithm>

#include "http/problem.h"

namespace idem::idemd {
namespace {

Result<std::unique_ptr<http::ClientPool>> PoolOf(const std::string& upstream,
                                                 const GatewayConfig& config) {
  auto url = http::ParseHttpUrl(upstream);
  if (!url) return url.error();
  return http::ClientPool::Make(
      *url, {.max_connections = config.max_connections, .tls = {.ca_file = config.ca_file}});
}

// The rules `before` verified records with, newest first, kept in `after` beside its own, up to
// kMaxKeptRules versions in all.
void KeepEarlierRules(const RoutePolicy& before, RoutePolicy& after) {
  constexpr std::size_t kMaxKeptRules = 8;
  std::vector<CanonicalRules> kept;
  auto keep = [&](const CanonicalRules& rules) {
    const bool known = rules.version == after.rules.version ||
                       std::any_of(kept.begin(), kept.end(), [&](const CanonicalRules& k) {
                         return k.version == rules.version;
                       });
    if (!known && kept.size() < kMaxKeptRules) kept.push_back(rules);
  };
  keep(before.rules);
  for (const CanonicalRules& rules : before.previous_rules) keep(rules);
  for (const CanonicalRules& rules : after.previous_rules) keep(rules);
  after.previous_rules = std::move(kept);
}

}  // namespace

Result<std::shared_ptr<const Gateway>> Gateway::Make(GatewayConfig config, const GatewayDeps& deps,
                                                     const Gateway* previous) {
  std::shared_ptr<Gateway> g(new Gateway(std::move(config), deps));
  for (const GatewayRoute& route : g->config_.routes) {
    auto pool = PoolOf(route.upstream, g->config_);
    if (!pool) {
      return MakeError(Errc::kInvalidArgument, "route " + route.name + ": " + pool.error().message);
    }
    g->upstreams_.push_back(std::move(*pool));
    g->proxies_.push_back(std::make_unique<ProxyOperation>(
        route, *g->upstreams_.back(), deps.pool, deps.monotonic, deps.metrics, deps.lease_margin));
    FilterPolicy policy =
        GatewayPolicy(route, deps.keys, deps.max_processing, deps.max_retained, deps.wait_max);
    policy.max_waiters_per_principal = deps.max_waiters_per_principal;
    policy.max_new_keys_per_second = deps.max_new_keys_per_second;
    if (const GatewayEndpoint* kept = previous ? previous->Named(route.name) : nullptr) {
      KeepEarlierRules(kept->filter->policy().route, policy.route);
    }
    g->filters_.push_back(
        std::make_unique<IdempotencyFilter>(deps.engine, deps.pool, deps.monotonic, deps.metrics,
                                            std::move(policy), *g->proxies_.back(), &deps.reads));
    g->endpoints_.push_back({&route, g->filters_.back().get(), g->proxies_.back().get()});
  }
  if (g->config_.forward_unmatched) {
    auto pool = PoolOf(g->config_.unmatched_upstream, g->config_);
    if (!pool)
      return MakeError(Errc::kInvalidArgument, "gateway.upstream: " + pool.error().message);
    g->unmatched_ = std::move(*pool);
    deps.metrics.DeclareUpstream("unmatched");
  }
  return std::shared_ptr<const Gateway>(std::move(g));
}

const GatewayEndpoint* Gateway::Match(std::string_view method, std::string_view path) const {
  const GatewayRoute* route = MatchGatewayRoute(config_.routes, method, path);
  if (route == nullptr) return nullptr;
  return &endpoints_[static_cast<std::size_t>(route - config_.routes.data())];
}

const GatewayEndpoint* Gateway::Named(std::string_view name) const {
  auto it = std::find_if(endpoints_.begin(), endpoints_.end(),
                         [&](const GatewayEndpoint& e) { return e.route->name == name; });
  return it == endpoints_.end() ? nullptr : &*it;
}

bool Gateway::Serves(std::string_view route_id) const {
  constexpr std::string_view kPrefix = "gw.";
  return route_id.substr(0, kPrefix.size()) == kPrefix &&
         Named(route_id.substr(kPrefix.size())) != nullptr;
}

void Gateway::TakeOverOnce(int limit, const std::function<void(const std::string&)>& notify) const {
  // Routes' passes side by side (up to 32 at once): one route's stalled upstream holds up no
  // other route.
  RunConcurrently(filters_.size(), 32,
                  [&](std::size_t i) { filters_[i]->TakeOverOnce(limit, notify); });
}

http::Async<http::Response> Gateway::PassThrough(const http::Request& request) const {
  http::Request out{request.method, request.target,
                    ForwardableHeaders(request.headers, IsHopByHopHeader), request.body};
  http::CallOptions options;
  options.timeout = config_.unmatched_timeout;
  const SteadyTime sent = monotonic_.Now();
  Result<http::Response> answer = Usable(co_await unmatched_->Call(std::move(out), options));
  metrics_.ObserveUpstream("unmatched", monotonic_.SecondsSince(sent));
  if (!answer) {
    // No record stands behind a passed-through request, so no kind that names a record's expiry
    // (upstream-unavailable, upstream-timeout): the answers of ForwardWithoutKey.
    co_return UpstreamFailure("unmatched", request.method, answer.error());
  }
  co_return http::Response{answer->status, ForwardableHeaders(answer->headers, IsHopByHopHeader),
                           std::move(answer->body)};
}

}  // namespace idem::idemd
