// server/idemd/consumers/consumers.cc — the consumers built from their config.
#include "server/idemd/consumers/consumers.h"

#include "server/idemd/consumers/rabbitmq.h"
#include "server/idemd/consumers/redis_stream.h"

namespace idem::idemd {

Result<std::unique_ptr<Consumers>> Consumers::Make(const std::vector<ConsumerRoute>& routes,
                                                   const GatewayDeps& deps,
                                                   const GatewayConfig& gateway,
                                                   const PaymentsTarget& payments,
                                                   const std::string& instance) {
  std::unique_ptr<Consumers> out(new Consumers());
  out->metrics_ = &deps.metrics;
  for (const ConsumerRoute& route : routes) {
    auto fail = [&](const Error& error) {
      return MakeError(Errc::kInvalidArgument, "consumer " + route.name + ": " + error.message);
    };
    One one;
    one.route = &route;
    // A message key is a business key: as short as the business makes it, in the key charset.
    KeyPolicy keys = deps.keys;
    keys.min_length = 1;
    FilterPolicy policy;
    Operation* operation = &payments.operation;
    if (route.IsPayments()) {
      policy = payments.policy;
      policy.route.key_policy = keys;
    } else {
      auto url = http::ParseHttpUrl(route.target.upstream);
      if (!url) return fail(url.error());
      auto pool = http::ClientPool::Make(
          *url, {.max_connections = gateway.max_connections, .tls = {.ca_file = gateway.ca_file}});
      if (!pool) return fail(pool.error());
      one.upstream = std::move(*pool);
      one.proxy = std::make_unique<ProxyOperation>(route.target, *one.upstream, deps.pool,
                                                   deps.monotonic, deps.metrics, deps.lease_margin);
      operation = one.proxy.get();
      policy = GatewayPolicy(route.target, keys, deps.max_processing,
                             limits::kMaxRetainedPerPrincipal, deps.wait_max);
    }
    policy.route.route = route.RouteId();
    policy.route_label = route.RouteId();
    policy.operations_suffix = "?route=" + route.RouteId();
    // The broker paces the consumer; its own threads bound what it has in hand.
    policy.max_new_keys_per_second = 0;
    one.filter =
        std::make_unique<IdempotencyFilter>(deps.engine, deps.pool, deps.monotonic, deps.metrics,
                                            std::move(policy), *operation, &deps.reads);
    Consumer::OpenSource open = [&route, instance, &monotonic = deps.monotonic](int i) {
      return route.IsRabbitMq()
                 ? OpenRabbitQueue(route, monotonic)
                 : OpenRedisStream(route, instance + "/" + std::to_string(i), monotonic);
    };
    auto sampler = route.IsRabbitMq() ? OpenRabbitQueue(route, deps.monotonic, /*consume=*/false)
                                      : OpenRedisStream(route, instance + "/lag", deps.monotonic);
    if (!sampler) return fail(sampler.error());
    one.sampler = std::move(*sampler);
    one.consumer = std::make_unique<Consumer>(route, *one.filter, deps.engine, deps.metrics,
                                              deps.monotonic, std::move(open));
    out->consumers_.push_back(std::move(one));
  }
  return out;
}

Consumers::~Consumers() {
  Stop();
  if (metrics_ != nullptr) metrics_->WatchConsumers({});
}

Status Consumers::Start() {
  for (One& one : consumers_) IDEM_RETURN_IF_ERROR(one.consumer->Start());
  if (!consumers_.empty()) {
    metrics_->WatchConsumers([this] {
      std::vector<Metrics::ConsumerLoad> loads;
      for (const One& one : consumers_) loads.push_back(one.consumer->Load());
      return loads;
    });
  }
  return Ok();
}

void Consumers::SampleLag() {
  for (One& one : consumers_) {
    Result<int64_t> lag = one.sampler->Backlog();
    metrics_->SetConsumerLag(one.route->name, lag ? std::optional<int64_t>(*lag) : std::nullopt);
  }
}

void Consumers::Stop() {
  for (One& one : consumers_) one.consumer->Stop();
}

bool Consumers::Serves(std::string_view route_id) const {
  for (const One& one : consumers_) {
    if (one.route->RouteId() == route_id) return true;
  }
  return false;
}

void Consumers::TakeOverOnce(int limit) const {
  RunConcurrently(consumers_.size(), 32, [&](std::size_t i) {
    consumers_[i].filter->TakeOverOnce(limit, [](const std::string&) {});
  });
}

}  // namespace idem::idemd
