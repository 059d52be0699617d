// server/idemd/outbox/relay.cc — the outbox relay (relay.h).
#include "server/idemd/outbox/relay.h"

#include <algorithm>
#include <vector>

#include "idem/failpoint.h"
#include "server/idemd/config/config.h"
#include "server/idemd/job_lease.h"
#include "server/idemd/metrics.h"

namespace idem::idemd {

Result<std::unique_ptr<EventSink>> OpenEventSink(const OutboxConfig& config) {
  if (config.broker == "redis") return OpenRedisEventSink(config.url, config.stream);
  if (config.broker == "rabbitmq") {
    return OpenRabbitEventSink(config.url, config.exchange, config.routing_key);
  }
  return MakeError(Errc::kInvalidArgument, "outbox: no broker to relay to (broker = \"off\")");
}

Relay::Relay(Store& store, EventSink& sink, Clock& clock, RelayOptions options, Metrics* metrics)
    : store_(store), sink_(sink), clock_(clock), options_(options), metrics_(metrics) {}

Result<RelayPass> Relay::RunOnce(int64_t max_events) {
  IDEM_ASSIGN_OR_RETURN(JobLease lease,
                        JobLease::Take(store_, "relay", kRelayJob, "relay", options_.lease));
  RelayPass pass;
  Status stopped = [&]() -> Status {
    while (pass.published < max_events) {
      const int64_t left = max_events - pass.published;
      const int page = static_cast<int>(std::min<int64_t>(options_.batch, left));
      {  // the lease covers the page's publication
        IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
        IDEM_RETURN_IF_ERROR(lease.Renew(*txn));
        IDEM_RETURN_IF_ERROR(txn->Commit());
      }
      IDEM_ASSIGN_OR_RETURN(std::vector<OutboxEvent> events, UnpublishedOutboxEvents(store_, page));
      if (events.empty()) return Ok();
      std::optional<Error> failed;
      const std::size_t confirmed = std::min(sink_.Publish(events, &failed), events.size());
      if (confirmed > 0) {
        IDEM_RETURN_IF_ERROR(IDEM_FAILPOINT("outbox_after_publish"));
        std::vector<std::string> ids;
        ids.reserve(confirmed);
        for (std::size_t i = 0; i < confirmed; ++i) ids.push_back(events[i].id);
        IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
        IDEM_RETURN_IF_ERROR(lease.Renew(*txn));
        IDEM_RETURN_IF_ERROR(MarkOutboxPublished(*txn, ids, clock_.Now()));
        IDEM_RETURN_IF_ERROR(txn->Commit());
        // An event marked before is published again on a replay (ReplayOutboxEvents).
        const auto republished = static_cast<int64_t>(
            std::count_if(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(confirmed),
                          [](const OutboxEvent& e) { return e.publications > 0; }));
        pass.published += static_cast<int64_t>(confirmed);
        pass.republished += republished;
        if (metrics_ != nullptr) {
          metrics_->CountOutboxPublished(static_cast<int64_t>(confirmed), republished);
        }
      }
      if (failed) return std::move(*failed);
      if (confirmed < events.size()) {
        return MakeError(Errc::kUnavailable, sink_.Describe() + " confirmed " +
                                                 std::to_string(confirmed) + " of " +
                                                 std::to_string(events.size()) + " events");
      }
      if (static_cast<int>(events.size()) < page) return Ok();
    }
    return Ok();
  }();
  if (stopped) {
    const Timestamp before = clock_.Now() - options_.retention;
    for (int i = 0; i < options_.sweep_batches && stopped; ++i) {
      Result<int64_t> swept = SweepOutbox(store_, before, 500);
      if (!swept) {
        stopped = std::move(swept).error();
        break;
      }
      pass.swept += *swept;
      if (*swept < 500) break;
    }
  }
  lease.Release(store_);
  if (!stopped) return std::move(stopped).error();
  return pass;
}

}  // namespace idem::idemd
