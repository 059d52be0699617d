// server/idemd/metrics.cc — Prometheus text exposition (version 0.0.4).
#include "server/idemd/metrics.h"

#include <cstdio>

namespace idem::idemd {

void Metrics::CountRequest(const std::string& route, const std::string& outcome) {
  std::lock_guard lock(mu_);
  ++requests_[{route, outcome}];
}

void Metrics::CountReconciled(const std::string& result) {
  std::lock_guard lock(mu_);
  ++reconciled_[result];
}

void Metrics::CountReconcileFinding(const std::string& finding_class) {
  std::lock_guard lock(mu_);
  ++findings_[finding_class];
}

void Metrics::CountCompensation(const std::string& outcome) {
  std::lock_guard lock(mu_);
  ++compensations_[outcome];
}

void Metrics::ObserveStore(double seconds) { store_.Observe(seconds); }
void Metrics::ObserveProvider(double seconds) { provider_.Observe(seconds); }

void Metrics::ObserveUpstream(const std::string& route, double seconds) {
  std::lock_guard lock(mu_);
  upstream_[route].Observe(seconds);
}

void Metrics::Histogram::Observe(double seconds) {
  for (std::size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) ++buckets[i];
  }
  ++count;
  sum_micros += static_cast<uint64_t>(seconds * 1e6);
}

void Metrics::RenderHeader(const std::string& name, const std::string& help, std::string& out) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
}

void Metrics::Histogram::Render(const std::string& name, const std::string& labels,
                                std::string& out) const {
  const std::string before_le = labels.empty() ? "" : labels + ",";
  const std::string alone = labels.empty() ? "" : "{" + labels + "}";
  char value[64];
  for (std::size_t i = 0; i < kBuckets.size(); ++i) {
    std::snprintf(value, sizeof value, "%g\"} %llu\n", kBuckets[i],
                  static_cast<unsigned long long>(buckets[i].load()));
    out += name + "_bucket{" + before_le + "le=\"" + value;
  }
  const std::string total = std::to_string(count.load());
  std::snprintf(value, sizeof value, "%.6f", static_cast<double>(sum_micros.load()) / 1e6);
  out += name + "_bucket{" + before_le + "le=\"+Inf\"} " + total + "\n";
  out += name + "_sum" + alone + " " + value + "\n";
  out += name + "_count" + alone + " " + total + "\n";
}

std::string Metrics::Render() const {
  std::string out;
  out += "# HELP idem_requests_total Requests by route and outcome.\n";
  out += "# TYPE idem_requests_total counter\n";
  {
    std::lock_guard lock(mu_);
    for (const auto& [labels, n] : requests_) {
      out += "idem_requests_total{route=\"" + labels.first + "\",outcome=\"" + labels.second +
             "\"} " + std::to_string(n) + "\n";
    }
    out += "# HELP idem_reconciler_total Records the reconciler resolved, by result.\n";
    out += "# TYPE idem_reconciler_total counter\n";
    for (const auto& [result, n] : reconciled_) {
      out += "idem_reconciler_total{result=\"" + result + "\"} " + std::to_string(n) + "\n";
    }
    out +=
        "# HELP idem_reconcile_findings_total Charges and payments the reconciliation of the "
        "books found not to match, by class.\n";
    out += "# TYPE idem_reconcile_findings_total counter\n";
    for (const auto& [finding_class, n] : findings_) {
      out += "idem_reconcile_findings_total{class=\"" + finding_class + "\"} " + std::to_string(n) +
             "\n";
    }
    out += "# HELP idem_reconcile_refunds_total Refunds of extra charges, by outcome.\n";
    out += "# TYPE idem_reconcile_refunds_total counter\n";
    for (const auto& [outcome, n] : compensations_) {
      out +=
          "idem_reconcile_refunds_total{outcome=\"" + outcome + "\"} " + std::to_string(n) + "\n";
    }
  }
  RenderHeader("idem_store_seconds", "Latency of store transactions.", out);
  store_.Render("idem_store_seconds", "", out);
  RenderHeader("idem_provider_seconds", "Latency of provider calls.", out);
  provider_.Render("idem_provider_seconds", "", out);
  RenderHeader("idem_upstream_seconds",
               "Latency of gateway routes' upstream exchanges, by route (\"unmatched\": passed "
               "through).",
               out);
  {
    std::lock_guard lock(mu_);
    for (const auto& [route, histogram] : upstream_) {
      histogram.Render("idem_upstream_seconds", "route=\"" + route + "\"", out);
    }
  }
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name +
           " " + std::to_string(v) + "\n";
  };
  counter("idem_lease_takeovers_total",
          "Executions resumed after a lease expired or a retryable failure.", takeovers_.load());
  counter("idem_fencing_rejections_total", "Completions refused because the lease was lost.",
          fenced_.load());
  counter("idem_redis_fallbacks_total", "Redis errors that fell back to the database path.",
          redis_fallbacks_.load());
  counter("idem_store_notifications_total",
          "Completions announced by the store (LISTEN/NOTIFY) that woke waiting requests.",
          store_notifications_.load());
  return out;
}

}  // namespace idem::idemd
