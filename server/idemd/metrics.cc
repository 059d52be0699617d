// server/idemd/metrics.cc — Prometheus text exposition (version 0.0.4).
#include "server/idemd/metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "http/log.h"
#include "http/server.h"
#include "idem/outbox.h"

namespace idem::idemd {
namespace {

std::string Number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.15g", v);
  return text;
}

void Header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n");
  out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void Sample(std::string& out, std::string_view name, std::string_view labels,
            const std::string& value) {
  out.append(name);
  if (!labels.empty()) out.append("{").append(labels).append("}");
  out.append(" ").append(value).append("\n");
}

void Sample(std::string& out, std::string_view name, std::string_view labels, uint64_t value) {
  Sample(out, name, labels, std::to_string(value));
}

std::string Label(std::string_view name, std::string_view value) {
  return std::string(name) + "=\"" + std::string(value) + "\"";
}

// One sample of `name` per entry of `counts`, labelled `first` and `second` by its key.
void SampleByTwo(std::string& out, std::string_view name, std::string_view first,
                 std::string_view second,
                 const std::map<std::pair<std::string, std::string>, uint64_t>& counts) {
  for (const auto& [labels, n] : counts) {
    Sample(out, name, Label(first, labels.first) + "," + Label(second, labels.second), n);
  }
}

// The text of a /proc file, or "" when it cannot be read.
std::string ReadProc(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

bool IsTimedStoreOperation(StoreOperation operation) {
  return std::find(kTimedStoreOperations.begin(), kTimedStoreOperations.end(), operation) !=
         kTimedStoreOperations.end();
}

std::string_view ProviderOperationName(ProviderOperation operation) {
  static constexpr std::array<std::string_view, kProviderOperations> kNames = {
      "charge", "lookup", "list_charges", "refund"};
  return kNames[static_cast<std::size_t>(operation)];
}

std::string_view SendCoverName(SendCover cover) {
  static constexpr std::array<std::string_view, kSendCovers> kNames = {"claim", "made_again", "own",
                                                                       "too_late"};
  return kNames[static_cast<std::size_t>(cover)];
}

std::vector<double> LatencyBuckets(Millis longest_timeout) {
  const double top = std::max(10.0, 2.0 * static_cast<double>(longest_timeout.count()) / 1000.0);
  std::vector<double> bounds;
  for (double decade = 0.0001;; decade *= 10) {
    for (double step : {1.0, 2.5, 5.0}) {
      const double bound = decade * step;
      if (bound < 0.0005) continue;
      bounds.push_back(bound);
      if (bound >= top) return bounds;
    }
  }
}

Metrics::Histogram::Histogram(std::size_t buckets)
    : buckets_(std::make_unique<std::atomic<uint64_t>[]>(buckets + 1)), size_(buckets) {}

void Metrics::Histogram::Observe(const std::vector<double>& bounds, double seconds) {
  const auto at = std::lower_bound(bounds.begin(), bounds.end(), seconds);
  ++buckets_[static_cast<std::size_t>(at - bounds.begin())];
  ++count_;
  sum_micros_ += static_cast<uint64_t>(std::max(0.0, seconds) * 1e6);
}

void Metrics::Histogram::Render(const std::string& name, const std::string& labels,
                                const std::vector<double>& bounds, std::string& out) const {
  const std::string before_le = labels.empty() ? "" : labels + ",";
  uint64_t cumulative = 0;
  for (std::size_t i = 0; i < size_; ++i) {
    cumulative += buckets_[i].load();
    Sample(out, name + "_bucket", before_le + Label("le", Number(bounds[i])), cumulative);
  }
  // The count is read after the buckets: a concurrent observation may have reached the buckets
  // only, never the count only, so +Inf never falls below the last bucket.
  cumulative += buckets_[size_].load();
  Sample(out, name + "_bucket", before_le + Label("le", "+Inf"), cumulative);
  Sample(out, name + "_sum", labels, Number(static_cast<double>(sum_micros_.load()) / 1e6));
  Sample(out, name + "_count", labels, cumulative);
}

Metrics::Metrics(MetricsOptions options)
    : options_(std::move(options)), bounds_(LatencyBuckets(options_.longest_timeout)) {
  for (std::size_t i = 0; i < kStoreOperations; ++i)
    store_.push_back(std::make_unique<Histogram>(bounds_.size()));
  for (std::size_t i = 0; i < kProviderOperations; ++i)
    provider_.push_back(std::make_unique<Histogram>(bounds_.size()));
}

std::string_view RequestOutcomeName(RequestOutcome outcome) {
  switch (outcome) {
    case RequestOutcome::kAccepted:
      return "accepted";
    case RequestOutcome::kError:
      return "error";
    case RequestOutcome::kExecuted:
      return "executed";
    case RequestOutcome::kInProgress:
      return "in_progress";
    case RequestOutcome::kInvalid:
      return "invalid";
    case RequestOutcome::kMismatch:
      return "mismatch";
    case RequestOutcome::kQuota:
      return "quota";
    case RequestOutcome::kReplayed:
      return "replayed";
    case RequestOutcome::kUnauthorized:
      return "unauthorized";
    case RequestOutcome::kPassedThrough:
      return "passed_through";
    case RequestOutcome::kForwardedWithoutKey:
      return "forwarded_without_key";
  }
  return "unknown";  // no RequestOutcome: never counted as one
}

void Metrics::DeclareRoute(const std::string& route) {
  MutexLock lock(mu_);
  for (std::size_t i = 0; i < kFilterOutcomes; ++i) {
    requests_.try_emplace({route, std::string(RequestOutcomeName(static_cast<RequestOutcome>(i)))},
                          0);
  }
}

void Metrics::DeclareUpstream(const std::string& route) {
  MutexLock lock(mu_);
  upstream_.try_emplace(route, bounds_.size());
}

void Metrics::CountRequest(const std::string& route, RequestOutcome outcome) {
  MutexLock lock(mu_);
  ++requests_[{route, std::string(RequestOutcomeName(outcome))}];
}

void Metrics::CountRequest(http::RequestContext& context, RequestOutcome outcome) {
  context.outcome = RequestOutcomeName(outcome);
  CountRequest(context.route, outcome);
}

void Metrics::ObserveHttpRequest(std::string_view route, int code, double seconds) {
  MutexLock lock(mu_);
  http_.try_emplace({std::string(route.empty() ? "unknown" : route), code}, bounds_.size())
      .first->second.Observe(bounds_, seconds);
}

void Metrics::ObserveStore(StoreOperation operation, double seconds) {
  store_[static_cast<std::size_t>(operation)]->Observe(bounds_, seconds);
}

void Metrics::ObserveProvider(ProviderOperation operation, double seconds) {
  provider_[static_cast<std::size_t>(operation)]->Observe(bounds_, seconds);
}

void Metrics::ObserveUpstream(const std::string& route, double seconds) {
  MutexLock lock(mu_);
  upstream_.try_emplace(route, bounds_.size()).first->second.Observe(bounds_, seconds);
}

void Metrics::DeclareUnknownOutcomes(const std::string& route) {
  MutexLock lock(mu_);
  unknown_outcomes_.try_emplace(route, 0);
}

void Metrics::CountUnknownOutcome(const std::string& route) {
  MutexLock lock(mu_);
  ++unknown_outcomes_[route];
}

namespace {
// The buckets of idem_consumer_deliveries (then +Inf).
constexpr std::array<int64_t, 5> kDeliveryBounds = {1, 2, 3, 5, 10};
constexpr std::array<std::string_view, 5> kConsumerOutcomes = {"duplicate", "executed", "held",
                                                               "quarantined", "retried"};
}  // namespace

void Metrics::DeclareConsumer(const std::string& consumer) {
  MutexLock lock(mu_);
  for (std::string_view outcome : kConsumerOutcomes) {
    consumer_messages_.try_emplace({consumer, std::string(outcome)}, 0);
  }
  consumer_deliveries_.try_emplace(consumer);
  consumer_takeovers_.try_emplace(consumer, 0);
}

void Metrics::CountConsumerMessage(const std::string& consumer, std::string_view outcome) {
  MutexLock lock(mu_);
  ++consumer_messages_[{consumer, std::string(outcome)}];
}

void Metrics::ObserveConsumerDeliveries(const std::string& consumer, int64_t deliveries) {
  MutexLock lock(mu_);
  Deliveries& d = consumer_deliveries_[consumer];
  std::size_t i = 0;
  while (i < kDeliveryBounds.size() && deliveries > kDeliveryBounds[i]) ++i;
  ++d.buckets[i];
  d.sum += static_cast<uint64_t>(std::max<int64_t>(deliveries, 0));
}

void Metrics::CountConsumerTakeover(const std::string& consumer) {
  MutexLock lock(mu_);
  ++consumer_takeovers_[consumer];
}

void Metrics::SetConsumerLag(const std::string& consumer, std::optional<int64_t> lag) {
  MutexLock lock(mu_);
  if (lag) {
    consumer_lag_[consumer] = *lag;
  } else {
    consumer_lag_.erase(consumer);
  }
}

void Metrics::WatchConsumers(std::function<std::vector<ConsumerLoad>()> read) {
  MutexLock lock(mu_);
  consumer_load_ = std::move(read);
}

void Metrics::CountTakeoverResult(const std::string& result) {
  MutexLock lock(mu_);
  ++reconciled_[result];
}

void Metrics::CountTakeoverPass(bool failed) {
  ++reconciler_runs_;
  if (failed) ++reconciler_failures_;
}

void Metrics::CountBooksRun(bool failed) {
  ++books_runs_;
  if (failed) ++books_failures_;
}

void Metrics::CountReconcileFinding(const std::string& finding_class) {
  MutexLock lock(mu_);
  ++findings_[finding_class];
}

void Metrics::CountCompensation(const std::string& outcome) {
  MutexLock lock(mu_);
  ++compensations_[outcome];
}

void Metrics::SetRecords(const RecordCensus& census, Timestamp taken) {
  MutexLock lock(mu_);
  census_ = census;
  census_taken_ = taken;
}

std::map<std::string, int64_t> Metrics::SetUnserved(std::map<std::string, int64_t> unserved) {
  MutexLock lock(mu_);
  std::map<std::string, int64_t> changed;
  for (const auto& [route, n] : unserved) {
    auto was = unserved_.find(route);
    if (was == unserved_.end() || was->second != n) changed[route] = n;
  }
  for (const auto& [route, n] : unserved_) {
    if (!unserved.contains(route)) changed[route] = 0;
  }
  unserved_ = std::move(unserved);
  return changed;
}

void Metrics::WatchServer(std::function<ServerLoad()> read) {
  MutexLock lock(mu_);
  server_load_ = std::move(read);
}

std::string Metrics::Render() const {
  std::string out;
  out.reserve(32 * 1024);
  MutexLock lock(mu_);

  Header(out, "idem_build_info", "gauge",
         "Always 1; the labels name idemd's version and the store it runs on.");
  Sample(out, "idem_build_info",
         Label("version", options_.version) + "," + Label("store", options_.store), 1);

  Header(out, "idem_requests_total", "counter", "Requests by route and outcome.");
  SampleByTwo(out, "idem_requests_total", "route", "outcome", requests_);
  Header(out, "idem_http_request_duration_seconds", "histogram",
         "Time from a request's first byte read to its answer's last byte written, by route and "
         "status code (a parked request's wait included).");
  for (const auto& [labels, histogram] : http_) {
    histogram.Render(
        "idem_http_request_duration_seconds",
        Label("route", labels.first) + "," + Label("code", std::to_string(labels.second)), bounds_,
        out);
  }
  const ServerLoad load = server_load_ ? server_load_() : ServerLoad{};
  Header(out, "idem_http_requests_in_flight", "gauge",
         "Requests being handled now, work running on after a 202 included, parked ones not.");
  Sample(out, "idem_http_requests_in_flight", "", std::to_string(load.in_flight));
  Header(out, "idem_http_requests_parked", "gauge",
         "Requests parked now on Prefer: wait for a running operation to finish.");
  Sample(out, "idem_http_requests_parked", "", std::to_string(load.parked));

  Header(out, "idem_upstream_request_duration_seconds", "histogram",
         "Latency of gateway routes' exchanges with their upstream, by route (\"unmatched\": "
         "passed through).");
  for (const auto& [route, histogram] : upstream_) {
    histogram.Render("idem_upstream_request_duration_seconds", Label("route", route), bounds_, out);
  }
  Header(out, "idem_gateway_unknown_outcomes_total", "counter",
         "Gateway operations whose outcome stays unknown (the status URL could not tell, or the "
         "route can neither ask nor forward again): answered 502 upstream-outcome-unknown, "
         "finally, and left for an operator.");
  for (const auto& [route, n] : unknown_outcomes_) {
    Sample(out, "idem_gateway_unknown_outcomes_total", Label("route", route), n);
  }

  Header(out, "idem_consumer_messages_total", "counter",
         "Queue consumers' messages by consumer and outcome: executed, duplicate (answered from "
         "its record, nothing ran), held (outcome unknown, for an operator), quarantined (moved "
         "to the dead-letter stream), retried (left to the broker's redelivery).");
  SampleByTwo(out, "idem_consumer_messages_total", "consumer", "outcome", consumer_messages_);
  Header(out, "idem_consumer_deliveries", "histogram",
         "How often a message had been delivered when its consumer acknowledged or quarantined "
         "it (1: the first delivery).");
  for (const auto& [consumer, d] : consumer_deliveries_) {
    const std::string name = Label("consumer", consumer);
    uint64_t cumulative = 0;
    for (std::size_t i = 0; i < kDeliveryBounds.size(); ++i) {
      cumulative += d.buckets[i];
      Sample(out, "idem_consumer_deliveries_bucket",
             name + "," + Label("le", std::to_string(kDeliveryBounds[i])), cumulative);
    }
    cumulative += d.buckets.back();
    Sample(out, "idem_consumer_deliveries_bucket", name + "," + Label("le", "+Inf"), cumulative);
    Sample(out, "idem_consumer_deliveries_sum", name, d.sum);
    Sample(out, "idem_consumer_deliveries_count", name, cumulative);
  }
  Header(out, "idem_consumer_takeovers_total", "counter",
         "Messages a consumer took over from another that left them unanswered for "
         "redeliver_after_ms.");
  for (const auto& [consumer, n] : consumer_takeovers_) {
    Sample(out, "idem_consumer_takeovers_total", Label("consumer", consumer), n);
  }

  Header(out, "idem_consumer_lag", "gauge",
         "Messages the broker holds for a consumer that no consumer of its group has been given "
         "yet (a stream's lag, a queue's ready messages), at the last census; absent while the "
         "broker cannot tell.");
  for (const auto& [consumer, n] : consumer_lag_) {
    Sample(out, "idem_consumer_lag", Label("consumer", consumer), std::to_string(n));
  }
  const std::vector<ConsumerLoad> loads =
      consumer_load_ ? consumer_load_() : std::vector<ConsumerLoad>{};
  Header(out, "idem_consumer_in_flight", "gauge",
         "Messages this process's consumers have in hand now, acknowledged or given back by none "
         "yet.");
  for (const ConsumerLoad& consumer : loads) {
    Sample(out, "idem_consumer_in_flight", Label("consumer", consumer.consumer),
           std::to_string(consumer.in_flight));
  }
  Header(out, "idem_consumer_oldest_in_flight_seconds", "gauge",
         "How long the oldest message this process's consumer has in hand has been in hand (0: "
         "none): a message waiting on a running duplicate, a store that is down, or a stuck "
         "upstream shows here first.");
  for (const ConsumerLoad& consumer : loads) {
    Sample(out, "idem_consumer_oldest_in_flight_seconds", Label("consumer", consumer.consumer),
           Number(consumer.oldest_seconds));
  }

  Header(out, "idem_records", "gauge",
         "Unfinished records in the store, by state, at the last census (every instance on one "
         "database reports the same records).");
  Sample(out, "idem_records", Label("state", "PROCESSING"), std::to_string(census_.processing));
  Sample(out, "idem_records", Label("state", "FAILED_RETRYABLE"),
         std::to_string(census_.failed_retryable));
  Header(out, "idem_records_unserved", "gauge",
         "PROCESSING records of routes this instance does not serve (a gateway route removed or "
         "renamed), by route id, at the last census: nothing resolves them (docs/gateway.md).");
  for (const auto& [route, n] : unserved_) {
    Sample(out, "idem_records_unserved", Label("route", route), std::to_string(n));
  }
  Header(out, "idem_records_retained", "gauge",
         "Records in the store in every state, not yet swept, at the last census.");
  Sample(out, "idem_records_retained", "", std::to_string(census_.retained));
  Header(out, "idem_oldest_processing_record_age_seconds", "gauge",
         "How long ago the oldest PROCESSING record was first claimed, at the last census; 0 "
         "when none is PROCESSING.");
  Sample(out, "idem_oldest_processing_record_age_seconds", "",
         Number(static_cast<double>(census_.oldest_processing_age.value_or(Millis(0)).count()) /
                1000.0));
  Header(out, "idem_records_census_timestamp_seconds", "gauge",
         "When the records gauges were last read from the store (Unix time); 0 before the first "
         "census.");
  Sample(out, "idem_records_census_timestamp_seconds", "",
         Number(static_cast<double>(ToUnixMillis(census_taken_)) / 1000.0));

  Header(out, "idem_reconciler_records_total", "counter",
         "Stale records the reconciler took over, by result (resolved; unknown: tried again "
         "later).");
  for (const auto& [result, n] : reconciled_) {
    Sample(out, "idem_reconciler_records_total", Label("result", result), n);
  }
  Header(out, "idem_reconcile_findings_total", "counter",
         "Charges and payments the reconciliation of the books found not to match, by class.");
  for (const auto& [finding_class, n] : findings_) {
    Sample(out, "idem_reconcile_findings_total", Label("class", finding_class), n);
  }
  Header(out, "idem_reconcile_refunds_total", "counter", "Refunds of extra charges, by outcome.");
  for (const auto& [outcome, n] : compensations_) {
    Sample(out, "idem_reconcile_refunds_total", Label("outcome", outcome), n);
  }
  lock.Unlock();

  Header(out, "idem_store_operation_duration_seconds", "histogram",
         "Latency of store calls, by operation (a method of the store interface).");
  for (StoreOperation operation : kTimedStoreOperations) {
    store_[static_cast<std::size_t>(operation)]->Render(
        "idem_store_operation_duration_seconds", Label("operation", StoreOperationName(operation)),
        bounds_, out);
  }
  Header(out, "idem_provider_request_duration_seconds", "histogram",
         "Latency of payment provider calls, by operation.");
  for (std::size_t i = 0; i < kProviderOperations; ++i) {
    provider_[i]->Render(
        "idem_provider_request_duration_seconds",
        Label("operation", ProviderOperationName(static_cast<ProviderOperation>(i))), bounds_, out);
  }
  auto counter = [&](std::string_view name, std::string_view help, const std::atomic<uint64_t>& v) {
    Header(out, name, "counter", help);
    Sample(out, name, "", v.load());
  };
  counter("idem_lease_takeovers_total",
          "Executions resumed after a lease expired or a retryable failure.", takeovers_);
  Header(out, "idem_charge_covers_total", "counter",
         "Charges about to be sent, by what covered the call with the lease: the claim's covered "
         "advance (claim), that advance made again because the claim's was older than half the "
         "lease margin (made_again: the store's queue is deep), a resumed attempt's own (own), "
         "or nothing in time (too_late: the store answered later than the margin, not sent).");
  for (std::size_t i = 0; i < kSendCovers; ++i) {
    Sample(out, "idem_charge_covers_total",
           Label("cover", SendCoverName(static_cast<SendCover>(i))), charge_covers_[i].load());
  }
  Header(out, "idem_replays_total", "counter",
         "Stored answers replayed, by where the record was read: memory (the replay cache, on "
         "the I/O thread) or store (a snapshot read on the store's read threads).");
  Sample(out, "idem_replays_total", Label("source", "memory"), replays_from_memory_.load());
  Sample(out, "idem_replays_total", Label("source", "store"), replays_from_store_.load());
  counter("idem_fencing_rejections_total",
          "Completions refused because another executor had taken the record over (its fence "
          "moved on).",
          fenced_);
  counter("idem_redis_fallbacks_total",
          "Redis errors (replay cache or in-flight markers) that fell back to the store.",
          redis_fallbacks_);
  counter("idem_store_notifications_total",
          "Completions announced by the store (LISTEN/NOTIFY) that woke waiting requests.",
          store_notifications_);
  counter("idem_reconciler_runs_total",
          "Passes of the stale-records reconciler, one per route per reconcile interval.",
          reconciler_runs_);
  counter("idem_reconciler_run_failures_total",
          "Reconciler passes in which the store refused to list or settle stale records.",
          reconciler_failures_);
  counter("idem_reconcile_runs_total", "Runs of the reconciliation of the books on this instance.",
          books_runs_);
  counter("idem_reconcile_run_failures_total",
          "Runs of the reconciliation of the books that could not complete.", books_failures_);
  counter("idem_outbox_written_total",
          "Outbox events this instance's transactions wrote (payment.succeeded, payment.failed, "
          "payment.refunded), each counted once its transaction committed.",
          outbox_written_);
  counter("idem_outbox_published_total",
          "Outbox events this instance's relay published, each confirmed by the broker (a copy "
          "published again after a crash counts again).",
          outbox_published_);
  counter("idem_outbox_republished_total",
          "Outbox events this instance's relay published again because an operator replayed "
          "them (a replay's confirmations; also counted in idem_outbox_published_total).",
          outbox_republished_);
  Header(out, "idem_log_lines_dropped_total", "counter",
         "Log lines dropped because the log buffer was full (stderr did not keep up); requests "
         "never wait for the log.");
  Sample(out, "idem_log_lines_dropped_total", "", http::LogLinesDropped());
  counter("idem_outbox_relay_passes_total", "Passes of the outbox relay on this instance.",
          relay_passes_);
  counter("idem_outbox_relay_failures_total",
          "Passes of the outbox relay that the broker or the store stopped.", relay_failures_);
  counter("idem_sweep_deleted_total",
          "Expired finished records this instance's sweeper deleted: over time, the rate it "
          "keeps up with.",
          sweep_deleted_);
  counter("idem_sweep_failures_total", "Rounds of the sweeper that the store stopped.",
          sweep_failures_);
  Header(out, "idem_outbox_oldest_unpublished_seconds", "gauge",
         "How long the oldest outbox event not yet published has waited, at the last census (0: "
         "none waits): the relay's lag.");
  Sample(out, "idem_outbox_oldest_unpublished_seconds", "",
         Number(static_cast<double>(outbox_lag_ms_.load()) / 1000.0));
  RenderProcessMetrics(out);
  return out;
}

void TakeCensus(Store& store, Metrics& metrics, Clock& clock,
                const std::function<bool(std::string_view)>& served) {
  auto census = store.Census();
  if (!census) {
    http::Log(http::LogLevel::kWarn, "records census failed",
              {{"code", ErrcName(census.error().code)}, {"error", census.error().message}});
    return;
  }
  metrics.SetRecords(*census, clock.Now());
  // A store without the outbox's table (no payments) leaves the relay's lag at 0.
  if (auto lag = OldestUnpublishedAge(store, clock.Now())) metrics.SetOutboxLag(*lag);
  if (!served) return;
  std::map<std::string, int64_t> unserved;
  for (const auto& [route, n] : census->processing_by_route) {
    if (!served(route)) unserved[route] = n;
  }
  for (const auto& [route, n] : metrics.SetUnserved(std::move(unserved))) {
    http::Log(n > 0 ? http::LogLevel::kError : http::LogLevel::kInfo,
              "records of a route this instance does not serve",
              {{"route", route},
               {"processing", n},
               {"detail", n > 0 ? "no retry and no reconciler pass resolves them while the route "
                                  "is not configured; configure the route again, or settle them "
                                  "(docs/gateway.md, \"Changing routes without a restart\")"
                                : "none left"}});
  }
}

void RenderProcessMetrics(std::string& out) {
  const std::string stat = ReadProc("/proc/self/stat");
  // The fields after the command's closing parenthesis, from the state (field 3) on.
  std::vector<std::string> fields;
  if (const std::size_t close = stat.rfind(')'); close != std::string::npos) {
    std::istringstream rest(stat.substr(close + 1));
    for (std::string field; rest >> field;) fields.push_back(field);
  }
  auto field = [&](std::size_t number) -> double {  // numbered as in proc(5)
    return fields.size() > number - 3 ? std::strtod(fields[number - 3].c_str(), nullptr) : 0.0;
  };
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  double boot_time = 0;
  {
    std::istringstream proc_stat(ReadProc("/proc/stat"));
    for (std::string line; std::getline(proc_stat, line);) {
      if (line.rfind("btime ", 0) == 0) boot_time = std::strtod(line.c_str() + 6, nullptr);
    }
  }
  int open_fds = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++open_fds;
  }
  rlimit files{};
  const double max_fds = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                             ? static_cast<double>(files.rlim_cur)
                             : 0.0;

  auto gauge = [&](std::string_view name, std::string_view type, std::string_view help, double v) {
    Header(out, name, type, help);
    Sample(out, name, "", Number(v));
  };
  gauge("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
        (field(14) + field(15)) / ticks);
  gauge("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
        field(24) * page);
  gauge("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", field(23));
  gauge("process_open_fds", "gauge", "Number of open file descriptors.", open_fds);
  gauge("process_max_fds", "gauge", "Maximum number of open file descriptors.", max_fds);
  gauge("process_start_time_seconds", "gauge",
        "Start time of the process since unix epoch in seconds.", boot_time + field(22) / ticks);
}

}  // namespace idem::idemd
