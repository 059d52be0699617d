// server/idemd/payments/books.h — reconciliation of the books: walks the charges the provider
// made in a window, matches each to its payment by reference, reports what does not match, and
// refunds duplicate charges (and, when configured, orphans). docs/reconciliation.md has what each
// class means and what the job does and never does.
#pragma once

#include <boost/json.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "idem/store.h"
#include "server/idemd/metrics.h"
#include "server/idemd/payments/provider.h"

namespace idem::idemd {

class JobLease;

// The books' tables (runs, findings, their events), an application migration of the store
// ("books" component), applied after PaymentsMigrations: the books read the payments table.
const std::vector<Migration>& BooksMigrations();

// Every application migration idemd's store applies, in order: the payments', the books', then
// the outbox's (include/idem/outbox.h), where the payment events wait for the relay.
std::vector<AppMigrations> IdemdMigrations();

struct ReconcileOptions {
  // Refund every charge of a payment beyond the one the payment records.
  bool refund_duplicates = true;
  // Refund charges with no payment (or whose payment failed) once older than orphan_grace: a
  // late completion may still claim one before. Off: orphans are only reported.
  bool refund_orphans = false;
  Millis orphan_grace{24 * 3'600'000};
  // How long the runner's lease lasts; renewed at every charge, so a crashed runner's window is
  // taken over this long after its last step.
  Millis lease{60'000};
  int page_size = 100;
  // Who runs, for the audit trail (host:pid).
  std::string instance;
};

// One row of reconcile_findings: a charge (or a payment) that does not match the books, and what
// was done about it.
struct Finding {
  std::string finding_class;  // duplicate, orphan, missing, mismatched
  std::string charge_id;      // "" for missing
  std::string payment_id;     // "" for an orphan with no payment
  std::string amount;         // the charge's (missing, mismatched: the payment's)
  std::string currency;
  std::string detail;
  std::string action;  // reported, refund_pending, refunded, refund_failed
  std::string refund_id;
  std::string refunded_amount;
  std::string run_id;
  std::string instance;
  int64_t found_at_ms = 0;
  int64_t updated_at_ms = 0;
};

struct RunSummary {
  std::string run_id;  // "" for a dry run
  int64_t since_ms = 0;
  int64_t until_ms = 0;
  bool dry_run = false;
  bool resumed = false;  // continued a run that stopped before its end
  int64_t charges = 0;   // charges walked
  int64_t matched = 0;
  int64_t pending = 0;  // charges of payments still in flight: looked at again by a later run
  std::map<std::string, int64_t> by_class;  // findings seen in this run, by class
  int64_t refunded = 0;                     // refunds made by this run
  std::vector<Finding> findings;            // as they stand after this run
};

// Thread-compatible: one run at a time per object; runs on several instances exclude each other
// through a lease row on the store's clock (a record of the records table, fenced).
class Reconciliation {
 public:
  // Borrows everything. `metrics` may be null.
  Reconciliation(Store& store, Provider& provider, Clock& clock, Random& random, Metrics* metrics,
                 ReconcileOptions options);

  // Reconciles charges created in [since_ms, until_ms): resumes the unfinished run of that
  // window if there is one, else starts one. A dry run takes no lease and writes nothing.
  // Errors: kInvalidArgument (since >= until); kConflict (another runner holds the lease);
  // kUnavailable / kDeadlineExceeded (store or provider; the run resumes where it stopped).
  Result<RunSummary> Run(int64_t since_ms, int64_t until_ms, bool dry_run);

  // The periodic job: finishes a run that stopped before its end, if any; else reconciles the
  // window [now - lag - window, now - lag). Errors: as Run.
  Result<RunSummary> RunPeriodic(Millis window, Millis lag);

  // Findings first seen at or after `since_ms`, newest first, at most `limit`.
  Result<std::vector<Finding>> Report(int64_t since_ms, int limit);

 private:
  struct Walk;
  // Walks the window; `lease` null for a dry run.
  Result<RunSummary> RunLocked(JobLease* lease, std::string run_id, int64_t since_ms,
                               int64_t until_ms, std::string cursor, bool resumed);
  Status Examine(Walk& walk, const Charge& charge);
  Status CheckMissing(Walk& walk);
  // Refunds `left` (minor units) of `charge`, recording the intent first.
  Status Compensate(Walk& walk, Finding finding, const Charge& charge, int64_t left);
  Status Record(Walk& walk, const Finding& finding, const std::string& cursor);

  Store& store_;
  Provider& provider_;
  Clock& clock_;
  Random& random_;
  Metrics* metrics_;
  ReconcileOptions options_;
};

// The refund idempotency key of an extra charge: derived from the charge alone, so every run on
// every instance refunds it with the same key.
std::string RefundKey(const std::string& charge_id);

// As JSON, for logs and `idemctl reconcile -o json`.
boost::json::object ToJson(const Finding& finding);
boost::json::object ToJson(const RunSummary& summary);

// "host:pid", who runs, for the audit trail.
std::string InstanceName();

}  // namespace idem::idemd
