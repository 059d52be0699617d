// server/idemd/consumers/consumers.h — idemd's queue consumers as the service runs them
// (docs/consumers.md): for each [[consumers]] entry, its target's proxy behind a filter of its
// own (route id "mq." + name), or idemd's payments operation, and the threads that take its
// messages. Built once at start; a SIGHUP does not change them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "http/client.h"
#include "server/idemd/consumers/consumer.h"
#include "server/idemd/gateway/gateway.h"

namespace idem::idemd {

// What a consumer whose target is idemd's payments operation runs (payments_tenant): the
// operation POST /v1/payments runs, and that route's policy (PaymentsPolicy), which each such
// consumer takes under its own route id. Borrowed.
struct PaymentsTarget {
  Operation& operation;
  const FilterPolicy& policy;
};

// Thread-safe once started. Borrows `routes`, `payments` and what `deps` borrows.
class Consumers {
 public:
  // `gateway` gives the upstream pools' settings (max_connections, ca_file); `instance` names this
  // process among the group's consumers (each thread "instance/i"). Errors: kInvalidArgument for
  // an upstream or a broker URL the clients refuse.
  static Result<std::unique_ptr<Consumers>> Make(const std::vector<ConsumerRoute>& routes,
                                                 const GatewayDeps& deps,
                                                 const GatewayConfig& gateway,
                                                 const PaymentsTarget& payments,
                                                 const std::string& instance);
  ~Consumers();  // Stop()

  // Starts every consumer's threads, and renders their idem_consumer_in_flight and
  // idem_consumer_oldest_in_flight_seconds from then on. Errors: a source that could not be
  // opened.
  Status Start();
  // Takes no more messages and waits for those in hand (docs/consumers.md, "Stopping").
  void Stop();
  // Whether `route_id` is one of these consumers' ("mq." + name).
  bool Serves(std::string_view route_id) const;
  // Resolves stale records of every consumer (the takeover loop), as Gateway::TakeOverOnce.
  void TakeOverOnce(int limit) const;
  // Asks each consumer's broker for its lag (idem_consumer_lag), on a connection of its own that
  // takes no message: the census loop's.
  void SampleLag();

 private:
  Consumers() = default;

  struct One {
    const ConsumerRoute* route = nullptr;
    std::unique_ptr<http::ClientPool> upstream;  // none for a payments target
    std::unique_ptr<ProxyOperation> proxy;
    std::unique_ptr<IdempotencyFilter> filter;
    std::unique_ptr<Consumer> consumer;
    std::unique_ptr<MessageSource> sampler;  // SampleLag's: asked for its backlog only
  };
  std::vector<One> consumers_;
  Metrics* metrics_ = nullptr;
};

}  // namespace idem::idemd
