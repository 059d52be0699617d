// server/idemd/metrics.h — counters and latency histograms in Prometheus text format.
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>

namespace idem::idemd {

// Thread-safe. Names and label values are fixed by the code, never taken from requests.
class Metrics {
 public:
  // idem_requests_total{route, outcome}: executed, replayed, mismatch, in_progress, quota,
  // invalid, unauthorized, error, ...
  void CountRequest(const std::string& route, const std::string& outcome);
  // idem_store_seconds / idem_provider_seconds histograms.
  void ObserveStore(double seconds);
  void ObserveProvider(double seconds);
  // idem_upstream_seconds{route}: a gateway route's exchanges with its upstream, "unmatched" for
  // requests passed through. A route's series appears with its first exchange.
  void ObserveUpstream(const std::string& route, double seconds);
  void CountTakeover() { ++takeovers_; }
  void CountFenced() { ++fenced_; }
  void CountRedisFallback() { ++redis_fallbacks_; }
  // A completion announced by the store (another instance, or this one) woke parked requests.
  void CountStoreNotification() { ++store_notifications_; }
  void CountReconciled(const std::string& result);
  // idem_reconcile_findings_total{class}: duplicate, orphan, missing, mismatched.
  void CountReconcileFinding(const std::string& finding_class);
  // idem_reconcile_refunds_total{outcome}: refunded, refused, unknown.
  void CountCompensation(const std::string& outcome);

  std::string Render() const;

 private:
  static constexpr std::array<double, 12> kBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                      0.05,   0.1,   0.25,   0.5,   1.0,  2.5};
  struct Histogram {
    std::array<std::atomic<uint64_t>, kBuckets.size()> buckets{};
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> sum_micros{0};
    void Observe(double seconds);
    // The series' lines; `labels` ("route=\"x\"") is put before le.
    void Render(const std::string& name, const std::string& labels, std::string& out) const;
  };
  static void RenderHeader(const std::string& name, const std::string& help, std::string& out);

  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> requests_;
  std::map<std::string, uint64_t> reconciled_;
  std::map<std::string, uint64_t> findings_ = {
      {"duplicate", 0}, {"missing", 0}, {"mismatched", 0}, {"orphan", 0}};
  std::map<std::string, uint64_t> compensations_ = {
      {"refunded", 0}, {"refused", 0}, {"unknown", 0}};
  Histogram store_;
  Histogram provider_;
  std::map<std::string, Histogram> upstream_;  // by route; guarded by mu_
  std::atomic<uint64_t> takeovers_{0};
  std::atomic<uint64_t> fenced_{0};
  std::atomic<uint64_t> redis_fallbacks_{0};
  std::atomic<uint64_t> store_notifications_{0};
};

}  // namespace idem::idemd
