// server/idemd/metrics.h — idemd's metrics in the Prometheus text format: counters, gauges and
// latency histograms named after Prometheus' conventions (docs/idemd.md, "Metrics", lists each).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/mutex.h"
#include "idem/store.h"

namespace idem::http {
struct RequestContext;
}  // namespace idem::http

namespace idem::idemd {

// The store calls idem_store_operation_duration_seconds{operation} times (TimedStore), in the
// order their series are rendered: every method of Store and StoreTxn that reaches the database
// but an operator's tool's (Settle, ListHeld). The label's value is StoreOperationName's.
inline constexpr std::array<StoreOperation, 17> kTimedStoreOperations = {
    StoreOperation::kBegin,  StoreOperation::kClaim,     StoreOperation::kReclaim,
    StoreOperation::kRenew,  StoreOperation::kAdvance,   StoreOperation::kAdvanceCovered,
    StoreOperation::kFinish, StoreOperation::kGet,       StoreOperation::kCount,
    StoreOperation::kExec,   StoreOperation::kCommit,    StoreOperation::kRead,
    StoreOperation::kQuery,  StoreOperation::kListStale, StoreOperation::kSweep,
    StoreOperation::kPing,   StoreOperation::kCensus,
};
// Whether `operation` is one of kTimedStoreOperations.
bool IsTimedStoreOperation(StoreOperation operation);

// What became of a request: its idem_requests_total{route, outcome} series and its access-log
// line's "outcome" (RequestOutcomeName). The first nine are the idempotency filter's, rendered
// for each declared route from the start (DeclareRoute).
enum class RequestOutcome : uint8_t {
  kAccepted,             // 202: executing in the background (respond-async)
  kError,                // the store or the operation failed before an answer of the protocol
  kExecuted,             // the first request's execution answered
  kInProgress,           // 409: another request of the key is executing (or parked and given up)
  kInvalid,              // refused before any record: a bad key, header or body
  kMismatch,             // 422: the key was used for another request
  kQuota,                // 429: the principal's quotas or claim rate
  kReplayed,             // the stored answer
  kUnauthorized,         // 401: no or an unknown API key
  kPassedThrough,        // a request no route matches, forwarded as it is (gateway.unmatched)
  kForwardedWithoutKey,  // a key-optional gateway route's request without a key (logged only)
};
inline constexpr std::size_t kFilterOutcomes = 9;  // kAccepted..kUnauthorized
std::string_view RequestOutcomeName(RequestOutcome outcome);

// What covered a charge about to be sent, its lease past the call (idem_charge_covers_total):
// the claim's own covered advance (a new payment's), the advance made again because the claim's
// was older than half the lease margin when the send came (a deep queue for the store's
// threads), an advance of its own (a resumed attempt's), or nothing — the store answered later
// than the margin and the charge was not sent.
enum class SendCover : uint8_t { kClaim, kMadeAgain, kOwn, kTooLate };
inline constexpr std::size_t kSendCovers = 4;
std::string_view SendCoverName(SendCover cover);

// The provider calls idem_provider_request_duration_seconds{operation} times (TimedProvider).
enum class ProviderOperation : uint8_t { kCharge, kLookup, kListCharges, kRefund };
inline constexpr std::size_t kProviderOperations = 4;
std::string_view ProviderOperationName(ProviderOperation operation);

// The upper bounds of every latency histogram's buckets: 0.5 ms, 1 ms, 2.5 ms, 5 ms, ... in
// 1-2.5-5 steps up to the first at or above twice `longest_timeout`, and never below 10 s, so
// that a call which ran into its timeout still lands in a bucket of its own, not only in +Inf.
std::vector<double> LatencyBuckets(Millis longest_timeout);

struct MetricsOptions {
  // LatencyBuckets(longest_timeout) (LongestTimeout of the config); fixed for the process's life (a
  // SIGHUP that lengthens a route's timeout keeps them).
  Millis longest_timeout{10000};
  // idem_build_info's labels.
  std::string version;
  std::string store;
};

// Thread-safe. Names and label values are fixed by the code or the configuration, never taken
// from requests. Every series whose labels are known in advance (the operations, the outcomes of
// each idempotent route declared through DeclareRoute, ...) is rendered from the start, as 0.
class Metrics {
 public:
  explicit Metrics(MetricsOptions options = {});

  // The outcomes a route protected by the idempotency filter counts: their
  // idem_requests_total{route, outcome} series are rendered from now on (0 until counted).
  void DeclareRoute(const std::string& route);
  // A gateway route's (or "unmatched") idem_upstream_request_duration_seconds{route} series.
  void DeclareUpstream(const std::string& route);

  // idem_requests_total{route, outcome}, the outcome by RequestOutcomeName.
  void CountRequest(const std::string& route, RequestOutcome outcome);
  // CountRequest on the request's route, and the outcome for its access-log line.
  void CountRequest(http::RequestContext& context, RequestOutcome outcome);
  // idem_http_request_duration_seconds{route, code}: every answered request, from its first byte
  // read to its last byte written ("unknown" for requests refused before routing, as in the log).
  void ObserveHttpRequest(std::string_view route, int code, double seconds);
  // One of kTimedStoreOperations; another is not rendered.
  void ObserveStore(StoreOperation operation, double seconds);
  void ObserveProvider(ProviderOperation operation, double seconds);
  // A gateway route's exchanges with its upstream, "unmatched" for requests passed through.
  void ObserveUpstream(const std::string& route, double seconds);
  // idem_gateway_unknown_outcomes_total{route}: operations of a gateway route whose outcome
  // stays unknown (its status URL could not tell for status_unknown_max_ms, or it has none and
  // no upstream_deduplicates), answered 502 upstream-outcome-unknown, which wait for an operator.
  // DeclareUnknownOutcomes renders the route's series from now on (0 until counted).
  void DeclareUnknownOutcomes(const std::string& route);
  void CountUnknownOutcome(const std::string& route);

  // A queue consumer's messages (docs/consumers.md): idem_consumer_messages_total{consumer,
  // outcome} — executed, duplicate (answered from the record: nothing ran), held (its outcome
  // unknown, kept for an operator), quarantined (moved to the dead-letter stream), retried (left
  // to the broker's redelivery) — and idem_consumer_deliveries{consumer}, a histogram of how
  // often a message had been delivered when it was acknowledged or quarantined.
  // DeclareConsumer renders the consumer's series from now on.
  void DeclareConsumer(const std::string& consumer);
  void CountConsumerMessage(const std::string& consumer, std::string_view outcome);
  void ObserveConsumerDeliveries(const std::string& consumer, int64_t deliveries);
  // idem_consumer_takeovers_total{consumer}: messages taken over from a consumer that left them
  // unanswered for redeliver_after_ms (it died, or its broker connection did).
  void CountConsumerTakeover(const std::string& consumer);
  // idem_consumer_lag{consumer}: the messages the broker holds for the consumer that no consumer
  // of its group has been given yet, at the last census; nullopt while the broker cannot tell
  // (the series is left out).
  void SetConsumerLag(const std::string& consumer, std::optional<int64_t> lag);
  // Where idem_consumer_in_flight{consumer} (messages this process has in hand) and
  // idem_consumer_oldest_in_flight_seconds{consumer} (how long the oldest of them has been in
  // hand; 0 for none) are read at each scrape.
  struct ConsumerLoad {
    std::string consumer;
    int in_flight = 0;
    double oldest_seconds = 0;
  };
  void WatchConsumers(std::function<std::vector<ConsumerLoad>()> read);

  void CountTakeover() { ++takeovers_; }
  // A stored answer replayed, read from memory (the replay cache) or from the store.
  void CountReplay(bool from_memory) {
    ++(from_memory ? replays_from_memory_ : replays_from_store_);
  }
  // A charge about to be sent, by what covered it (or that nothing could: kTooLate).
  void CountChargeCover(SendCover cover) { ++charge_covers_[static_cast<std::size_t>(cover)]; }
  // A completion refused because the record's fence moved on (another executor took over).
  void CountFenced() { ++fenced_; }
  // Redis failed (replay cache or in-flight markers): the request was served from the store.
  void CountRedisFallback() { ++redis_fallbacks_; }
  // A completion announced by the store (another instance, or this one) woke parked requests.
  void CountStoreNotification() { ++store_notifications_; }
  // idem_reconciler_records_total{result}: resolved, unknown (tried again later).
  void CountTakeoverResult(const std::string& result);
  // One pass of the takeover loop over one route; `failed` when the store refused
  // to list or settle its records.
  void CountTakeoverPass(bool failed);
  // One run of the reconciliation of the books; `failed` when it could not complete.
  void CountBooksRun(bool failed);
  // idem_reconcile_findings_total{class}: duplicate, orphan, missing, mismatched.
  void CountReconcileFinding(const std::string& finding_class);
  // idem_reconcile_refunds_total{outcome}: refunded, refused, unknown.
  void CountCompensation(const std::string& outcome);
  // An outbox event this instance's transactions wrote, counted after its commit.
  void CountOutboxWritten() { ++outbox_written_; }
  // Outbox events a relay of this instance published (the broker confirmed them), `republished`
  // of them published before (an operator's replay).
  void CountOutboxPublished(int64_t n, int64_t republished) {
    outbox_published_ += static_cast<uint64_t>(n);
    outbox_republished_ += static_cast<uint64_t>(republished);
  }
  // One pass of the outbox relay; `failed` when the broker or the store stopped it.
  void CountRelayPass(bool failed) {
    ++relay_passes_;
    if (failed) ++relay_failures_;
  }
  // One batch of the sweeper, committed: the expired records it deleted. Counted batch by batch,
  // so a long round shows its progress and a failed one what it deleted before it stopped.
  void CountSwept(int64_t deleted) { sweep_deleted_ += static_cast<uint64_t>(deleted); }
  // A round of the sweeper that the store stopped.
  void CountSweepFailure() { ++sweep_failures_; }
  // idem_outbox_oldest_unpublished_seconds: the relay's lag (nullopt: nothing unpublished).
  void SetOutboxLag(std::optional<Millis> oldest) { outbox_lag_ms_ = oldest ? oldest->count() : 0; }

  // The records gauges, from a census of the store taken at `taken` (system time).
  void SetRecords(const RecordCensus& census, Timestamp taken);
  // idem_records_unserved{route}: PROCESSING records of routes this process does not serve, by
  // route id. Returns the routes whose count changed since the last call (0 for one now gone).
  std::map<std::string, int64_t> SetUnserved(std::map<std::string, int64_t> unserved);
  // Where idem_http_requests_in_flight and idem_http_requests_parked are read at each scrape;
  // 0 until set (a server starts after the handler that renders them).
  struct ServerLoad {
    int in_flight = 0;
    int parked = 0;
  };
  void WatchServer(std::function<ServerLoad()> read);

  // The exposition (text format 0.0.4), idemd's series and the process's.
  std::string Render() const;

 private:
  // Cumulative only when rendered: Observe touches one bucket.
  class Histogram {
   public:
    explicit Histogram(std::size_t buckets);
    void Observe(const std::vector<double>& bounds, double seconds);
    // The series' lines; `labels` (`route="x"`) is put before le.
    void Render(const std::string& name, const std::string& labels,
                const std::vector<double>& bounds, std::string& out) const;

   private:
    std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // one more: +Inf
    std::size_t size_;
    std::atomic<uint64_t> count_{0};
    std::atomic<uint64_t> sum_micros_{0};
  };

  const MetricsOptions options_;
  const std::vector<double> bounds_;
  mutable Mutex mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> requests_ IDEM_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> reconciled_ IDEM_GUARDED_BY(mu_) = {{"resolved", 0},
                                                                      {"unknown", 0}};
  std::map<std::string, uint64_t> findings_ IDEM_GUARDED_BY(mu_) = {
      {"duplicate", 0}, {"missing", 0}, {"mismatched", 0}, {"orphan", 0}};
  std::map<std::string, uint64_t> compensations_ IDEM_GUARDED_BY(mu_) = {
      {"refunded", 0}, {"refused", 0}, {"unknown", 0}};
  std::map<std::pair<std::string, int>, Histogram> http_ IDEM_GUARDED_BY(mu_);  // by route, code
  std::map<std::string, Histogram> upstream_ IDEM_GUARDED_BY(mu_);              // by route
  std::map<std::string, uint64_t> unknown_outcomes_ IDEM_GUARDED_BY(mu_);       // by route
  // By consumer and outcome; by consumer, the deliveries' buckets (kDeliveryBounds, then +Inf)
  // and their sum; takeovers by consumer.
  std::map<std::pair<std::string, std::string>, uint64_t> consumer_messages_ IDEM_GUARDED_BY(mu_);
  struct Deliveries {
    std::array<uint64_t, 6> buckets{};
    uint64_t sum = 0;
  };
  std::map<std::string, Deliveries> consumer_deliveries_ IDEM_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> consumer_takeovers_ IDEM_GUARDED_BY(mu_);
  std::map<std::string, int64_t> consumer_lag_ IDEM_GUARDED_BY(mu_);
  std::function<std::vector<ConsumerLoad>()> consumer_load_ IDEM_GUARDED_BY(mu_);
  RecordCensus census_ IDEM_GUARDED_BY(mu_);
  std::map<std::string, int64_t> unserved_ IDEM_GUARDED_BY(mu_);
  Timestamp census_taken_ IDEM_GUARDED_BY(mu_) = {};
  std::function<ServerLoad()> server_load_ IDEM_GUARDED_BY(mu_);
  // Filled by the constructor, then only read: each Histogram counts in atomics, without mu_.
  std::vector<std::unique_ptr<Histogram>> store_;     // by StoreOperation
  std::vector<std::unique_ptr<Histogram>> provider_;  // by ProviderOperation
  std::atomic<uint64_t> takeovers_{0};
  std::array<std::atomic<uint64_t>, kSendCovers> charge_covers_{};
  std::atomic<uint64_t> replays_from_memory_{0};
  std::atomic<uint64_t> replays_from_store_{0};
  std::atomic<uint64_t> fenced_{0};
  std::atomic<uint64_t> redis_fallbacks_{0};
  std::atomic<uint64_t> store_notifications_{0};
  std::atomic<uint64_t> reconciler_runs_{0};
  std::atomic<uint64_t> reconciler_failures_{0};
  std::atomic<uint64_t> books_runs_{0};
  std::atomic<uint64_t> books_failures_{0};
  std::atomic<uint64_t> outbox_published_{0};
  std::atomic<uint64_t> outbox_republished_{0};
  std::atomic<uint64_t> outbox_written_{0};
  std::atomic<uint64_t> relay_passes_{0};
  std::atomic<uint64_t> relay_failures_{0};
  std::atomic<uint64_t> sweep_deleted_{0};
  std::atomic<uint64_t> sweep_failures_{0};
  std::atomic<int64_t> outbox_lag_ms_{0};
};

// How often idemd takes a census of the store for the records gauges.
inline constexpr Millis kCensusInterval{15000};

// Takes a census of `store` (Store::Census) into `metrics`' records gauges; on an error the
// gauges keep their last values (idem_records_census_timestamp_seconds tells how old) and a line
// is logged. With `served` (whether this process serves a route id), PROCESSING records of
// routes it does not serve — a gateway route removed or renamed, whose records no retry and no
// takeover pass can resolve — are counted (Metrics::SetUnserved) and logged at error level
// whenever a route's count changes. Blocking.
void TakeCensus(Store& store, Metrics& metrics, Clock& clock,
                const std::function<bool(std::string_view)>& served = {});

// The process_* series of the Prometheus client libraries' process collector, read from
// /proc/self: CPU seconds, resident memory, open and maximum file descriptors, start time.
void RenderProcessMetrics(std::string& out);

}  // namespace idem::idemd
