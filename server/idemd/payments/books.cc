// server/idemd/payments/books.cc — the reconciliation job (books.h).
#include "server/idemd/payments/books.h"

#include <unistd.h>

#include <cstdio>
#include <unordered_set>

#include "idem/failpoint.h"
#include "idem/key.h"
#include "idem/outbox.h"
#include "server/idemd/job_lease.h"
#include "server/idemd/payments/events.h"
#include "server/idemd/payments/table.h"

namespace idem::idemd {

const std::vector<Migration>& BooksMigrations() {
  static const std::vector<Migration> kMigrations = {
      // Its runs, what it found, as it stands, and every change of a finding, append-only. "IF
      // NOT EXISTS": a database made before the books had migrations of their own has these
      // tables from the payments' version 3, and keeps them.
      {1, R"sql(
CREATE TABLE IF NOT EXISTS reconcile_runs (
  id          TEXT PRIMARY KEY,
  since_ms    BIGINT NOT NULL,
  until_ms    BIGINT NOT NULL,
  cursor      TEXT NOT NULL,
  state       TEXT NOT NULL CHECK (state IN ('running', 'done')),
  instance    TEXT NOT NULL,
  charges     BIGINT NOT NULL,
  started_at  BIGINT NOT NULL,
  finished_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS reconcile_runs_open ON reconcile_runs (state, since_ms, until_ms);
CREATE TABLE IF NOT EXISTS reconcile_findings (
  class           TEXT NOT NULL
                  CHECK (class IN ('duplicate', 'orphan', 'missing', 'mismatched')),
  charge_id       TEXT NOT NULL,
  payment_id      TEXT NOT NULL,
  amount          TEXT NOT NULL,
  currency        TEXT NOT NULL,
  detail          TEXT NOT NULL,
  action          TEXT NOT NULL
                  CHECK (action IN ('reported', 'refund_pending', 'refunded', 'refund_failed')),
  refund_id       TEXT NOT NULL,
  refunded_amount TEXT NOT NULL,
  run_id          TEXT NOT NULL,
  instance        TEXT NOT NULL,
  found_at        BIGINT NOT NULL,
  updated_at      BIGINT NOT NULL,
  PRIMARY KEY (class, charge_id, payment_id)
);
CREATE INDEX IF NOT EXISTS reconcile_findings_payment ON reconcile_findings (payment_id);
CREATE INDEX IF NOT EXISTS reconcile_findings_found ON reconcile_findings (found_at);
CREATE TABLE IF NOT EXISTS reconcile_events (
  at         BIGINT NOT NULL,
  run_id     TEXT NOT NULL,
  instance   TEXT NOT NULL,
  class      TEXT NOT NULL,
  charge_id  TEXT NOT NULL,
  payment_id TEXT NOT NULL,
  action     TEXT NOT NULL,
  refund_id  TEXT NOT NULL,
  amount     TEXT NOT NULL,
  detail     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS reconcile_events_at ON reconcile_events (at);
)sql"},
  };
  return kMigrations;
}

std::vector<AppMigrations> IdemdMigrations() {
  return {{"payments", PaymentsMigrations()},
          {"books", BooksMigrations()},
          {"outbox", OutboxMigrations()}};
}

namespace {

// Payments whose own charge a run saw, kept to spare a provider lookup per payment when looking
// for missing charges; past this many, every candidate is looked up.
constexpr std::size_t kMaxMatchedKept = 1'000'000;

Finding FindingOf(const SqlRow& r) {
  return Finding{Text(r[0]),  Text(r[1]),     Text(r[2]),    Text(r[3]), Text(r[4]),
                 Text(r[5]),  Text(r[6]),     Text(r[7]),    Text(r[8]), Text(r[9]),
                 Text(r[10]), Integer(r[11]), Integer(r[12])};
}

constexpr const char* kFindingColumns =
    "class, charge_id, payment_id, amount, currency, detail, action, refund_id, refunded_amount, "
    "run_id, instance, found_at, updated_at";

}  // namespace

std::string RefundKey(const std::string& charge_id) { return "idem-refund-" + charge_id; }

boost::json::object ToJson(const Finding& f) {
  return boost::json::object{
      {"class", f.finding_class},
      {"charge", f.charge_id},
      {"payment", f.payment_id},
      {"amount", f.amount},
      {"currency", f.currency},
      {"action", f.action},
      {"refund", f.refund_id},
      {"refunded_amount", f.refunded_amount},
      {"detail", f.detail},
      {"run", f.run_id},
      {"instance", f.instance},
      {"found_at", f.found_at_ms > 0 ? http::Rfc3339(f.found_at_ms) : ""},
      {"updated_at", f.updated_at_ms > 0 ? http::Rfc3339(f.updated_at_ms) : ""}};
}

boost::json::object ToJson(const RunSummary& s) {
  boost::json::object by_class;
  for (const char* c : {"duplicate", "orphan", "missing", "mismatched"}) {
    auto it = s.by_class.find(c);
    by_class[c] = it == s.by_class.end() ? 0 : it->second;
  }
  boost::json::array findings;
  for (const Finding& f : s.findings) findings.push_back(ToJson(f));
  return boost::json::object{{"run", s.run_id},
                             {"since", http::Rfc3339(s.since_ms)},
                             {"until", http::Rfc3339(s.until_ms)},
                             {"dry_run", s.dry_run},
                             {"resumed", s.resumed},
                             {"charges", s.charges},
                             {"matched", s.matched},
                             {"pending", s.pending},
                             {"findings_by_class", std::move(by_class)},
                             {"refunded", s.refunded},
                             {"findings", std::move(findings)}};
}

std::string InstanceName() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
  return std::string(host) + ":" + std::to_string(getpid());
}

// What one run carries from charge to charge.
struct Reconciliation::Walk {
  JobLease* lease = nullptr;  // null for a dry run
  RunSummary summary;
  std::string cursor;  // the last charge fully handled
  int64_t now_ms = 0;
  std::unordered_set<std::string> matched;  // payments whose own charge was seen (bounded)
};

Reconciliation::Reconciliation(Store& store, Provider& provider, Clock& clock, Random& random,
                               Metrics* metrics, ReconcileOptions options)
    : store_(store),
      provider_(provider),
      clock_(clock),
      random_(random),
      metrics_(metrics),
      options_(std::move(options)) {}

Result<RunSummary> Reconciliation::RunPeriodic(Millis window, Millis lag) {
  IDEM_ASSIGN_OR_RETURN(auto unfinished,
                        store_.Query("SELECT since_ms, until_ms FROM reconcile_runs "
                                     "WHERE state = 'running' ORDER BY started_at LIMIT 1"));
  if (!unfinished.empty()) {
    return Run(Integer(unfinished[0][0]), Integer(unfinished[0][1]), false);
  }
  const int64_t until = ToUnixMillis(clock_.Now()) - lag.count();
  return Run(until - window.count(), until, false);
}

Result<RunSummary> Reconciliation::Run(int64_t since_ms, int64_t until_ms, bool dry_run) {
  if (since_ms >= until_ms) {
    return MakeError(Errc::kInvalidArgument, "the window must end after it starts");
  }
  if (dry_run) return RunLocked(nullptr, "", since_ms, until_ms, "", false);

  // One runner at a time, on every instance (the lease's record is the one it always was).
  IDEM_ASSIGN_OR_RETURN(JobLease lease, JobLease::Take(store_, "reconciler", kBooksJob,
                                                       "reconciliation", options_.lease));

  Result<RunSummary> ran = [&]() -> Result<RunSummary> {
    IDEM_ASSIGN_OR_RETURN(
        auto unfinished,
        store_.Query("SELECT id, cursor FROM reconcile_runs WHERE state = 'running' AND "
                     "since_ms = ? AND until_ms = ? ORDER BY started_at LIMIT 1",
                     {since_ms, until_ms}));
    if (!unfinished.empty()) {
      return RunLocked(&lease, Text(unfinished[0][0]), since_ms, until_ms, Text(unfinished[0][1]),
                       true);
    }
    std::array<uint8_t, 8> id_bytes;
    random_.Fill(id_bytes);
    const std::string run_id = "rec_" + ToHex(id_bytes);
    {  // its connection goes back before the walk needs one
      IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
      IDEM_RETURN_IF_ERROR(lease.Renew(*txn));
      IDEM_RETURN_IF_ERROR(txn->Exec(
          "INSERT INTO reconcile_runs (id, since_ms, until_ms, cursor, state, instance, charges, "
          "started_at, finished_at) VALUES (?, ?, ?, '', 'running', ?, 0, ?, 0)",
          {run_id, since_ms, until_ms, options_.instance, ToUnixMillis(clock_.Now())}));
      IDEM_RETURN_IF_ERROR(txn->Commit());
    }
    return RunLocked(&lease, run_id, since_ms, until_ms, "", false);
  }();

  // Given back whatever happened: the next run need not wait for the lease to run out.
  lease.Release(store_);
  return ran;
}

Result<RunSummary> Reconciliation::RunLocked(JobLease* lease, std::string run_id, int64_t since_ms,
                                             int64_t until_ms, std::string cursor, bool resumed) {
  Walk walk;
  walk.lease = lease;
  walk.summary.run_id = std::move(run_id);
  walk.summary.since_ms = since_ms;
  walk.summary.until_ms = until_ms;
  walk.summary.dry_run = lease == nullptr;
  walk.summary.resumed = resumed;
  walk.cursor = std::move(cursor);
  walk.now_ms = ToUnixMillis(clock_.Now());
  for (bool more = true; more;) {
    IDEM_ASSIGN_OR_RETURN(
        ChargePage page,
        http::RunSync(provider_.ListCharges(since_ms, until_ms, options_.page_size, walk.cursor)));
    for (const Charge& charge : page.data) IDEM_RETURN_IF_ERROR(Examine(walk, charge));
    if (page.data.empty()) break;
    // The page's matched charges move the cursor in one write; findings moved it as they went.
    if (lease != nullptr) {
      IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
      IDEM_RETURN_IF_ERROR(lease->Renew(*txn));
      IDEM_RETURN_IF_ERROR(txn->Exec(
          "UPDATE reconcile_runs SET cursor = ?, charges = charges + ? WHERE id = ?",
          {page.data.back().id, static_cast<int64_t>(page.data.size()), walk.summary.run_id}));
      IDEM_RETURN_IF_ERROR(txn->Commit());
    }
    walk.cursor = page.data.back().id;
    more = page.has_more;
  }
  IDEM_RETURN_IF_ERROR(CheckMissing(walk));
  if (lease == nullptr) return std::move(walk.summary);
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
  IDEM_RETURN_IF_ERROR(lease->Renew(*txn));
  IDEM_RETURN_IF_ERROR(
      txn->Exec("UPDATE reconcile_runs SET state = 'done', finished_at = ? WHERE id = ?",
                {ToUnixMillis(clock_.Now()), walk.summary.run_id}));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  return std::move(walk.summary);
}

Status Reconciliation::Examine(Walk& walk, const Charge& charge) {
  ++walk.summary.charges;
  // A declined or failed charge took no money.
  if (charge.status != "succeeded") return Ok();
  IDEM_ASSIGN_OR_RETURN(auto rows, store_.Query("SELECT status, provider_charge_id, amount_minor, "
                                                "currency FROM payments WHERE id = ?",
                                                {charge.reference}));
  const std::optional<int64_t> charged = AmountInMinorUnits(charge.amount, charge.currency);
  const std::optional<int64_t> refunded = AmountInMinorUnits(
      charge.amount_refunded.empty() ? "0" : charge.amount_refunded, charge.currency);
  const int64_t left = charged && refunded ? *charged - *refunded : 0;

  Finding f;
  f.charge_id = charge.id;
  f.amount = charge.amount;
  f.currency = charge.currency;
  // A charge whose reference idemd could not have made (PaymentIdFor) is someone else's on a
  // shared provider account: reported, never refunded.
  bool ours = true;
  if (rows.empty()) {
    f.finding_class = "orphan";
    f.detail = "no payment has the reference '" + charge.reference + "'";
    ours = IsPaymentId(charge.reference);
    if (!ours) f.detail += ", which is not an idemd payment id: not idemd's charge";
  } else {
    const std::string status = Text(rows[0][0]);
    const std::string own_charge = Text(rows[0][1]);
    const int64_t owed = Integer(rows[0][2]);
    const std::string currency = Text(rows[0][3]);
    f.payment_id = charge.reference;
    if (status == "pending") {
      // Still in flight: its completion may yet claim this charge. A later run looks again.
      ++walk.summary.pending;
      return Ok();
    }
    if (status != "succeeded") {
      f.finding_class = "orphan";
      f.detail = "payment " + charge.reference + " is " + status;
    } else if (own_charge == charge.id) {
      if (charged && *charged == owed && currency == charge.currency && left == *charged) {
        ++walk.summary.matched;
        if (walk.matched.size() < kMaxMatchedKept) walk.matched.insert(charge.reference);
        return Ok();
      }
      f.finding_class = "mismatched";
      f.detail = "the charge is " + charge.amount + " " + charge.currency + " (" +
                 (charge.amount_refunded.empty() ? "0" : charge.amount_refunded) +
                 " refunded), the payment " + FormatAmount(owed, MinorDigits(currency)) + " " +
                 currency;
    } else {
      f.finding_class = "duplicate";
      f.detail = "payment " + charge.reference + " records charge " +
                 (own_charge.empty() ? std::string("none") : own_charge);
    }
  }
  ++walk.summary.by_class[f.finding_class];

  const bool refundable =
      (f.finding_class == "duplicate" && options_.refund_duplicates) ||
      (f.finding_class == "orphan" && ours && options_.refund_orphans && charge.created_at_ms > 0 &&
       charge.created_at_ms <= walk.now_ms - options_.orphan_grace.count());
  if (refundable && charged && left <= 0) {
    f.action = "refunded";  // by an earlier run whose answer was lost, or by someone else
    f.detail += "; found refunded at the provider";
  } else if (refundable && charged) {
    return Compensate(walk, std::move(f), charge, left);
  } else {
    f.action = "reported";
  }
  return Record(walk, f, charge.id);
}

Status Reconciliation::Compensate(Walk& walk, Finding f, const Charge& charge, int64_t left) {
  const std::string amount = FormatAmount(left, MinorDigits(charge.currency));
  if (walk.lease == nullptr) {  // a dry run says what it would do
    f.action = "refund_pending";
    f.detail += "; would refund " + amount;
    walk.summary.findings.push_back(std::move(f));
    return Ok();
  }
  // The intent first, with the cursor still before this charge: a runner that dies after the
  // refund left finds the charge again and repeats it with the same key (or finds it refunded).
  f.action = "refund_pending";
  IDEM_RETURN_IF_ERROR(Record(walk, f, walk.cursor));
  // "duplicate" for orphans too: the one reason the provider contract names.
  auto refund =
      http::RunSync(provider_.RefundCharge(RefundKey(charge.id), charge.id, amount, "duplicate"));
  if (!refund) {
    const Errc code = refund.error().code;
    if (code == Errc::kUnavailable || code == Errc::kDeadlineExceeded) {
      if (metrics_ != nullptr) metrics_->CountCompensation("unknown");
      return std::move(refund).error();  // stop here; the next run repeats it
    }
    if (metrics_ != nullptr) metrics_->CountCompensation("refused");
    f.action = "refund_failed";
    f.detail += "; the provider refused the refund: " + refund.error().message;
    return Record(walk, f, charge.id);
  }
  // A crash here leaves the refund made and recorded only as intended: the next run must find it
  // refunded, or repeat it under the same key, and never refund twice.
  IDEM_RETURN_IF_ERROR(IDEM_FAILPOINT("reconcile_after_refund"));
  if (metrics_ != nullptr) metrics_->CountCompensation("refunded");
  ++walk.summary.refunded;
  f.action = "refunded";
  f.refund_id = refund->id;
  f.refunded_amount = refund->amount.empty() ? amount : refund->amount;
  return Record(walk, f, charge.id);
}

// Writes a finding, an event if it is new or changed, and the run's cursor, in one transaction
// fenced by the runner's lease. A dry run only keeps it in the summary.
Status Reconciliation::Record(Walk& walk, const Finding& finding, const std::string& cursor) {
  if (walk.lease == nullptr) {
    walk.summary.findings.push_back(finding);
    return Ok();
  }
  JobLease& lease = *walk.lease;
  const int64_t now = ToUnixMillis(clock_.Now());
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
  IDEM_RETURN_IF_ERROR(lease.Renew(*txn));
  IDEM_ASSIGN_OR_RETURN(
      auto existing,
      txn->Exec(std::string("SELECT ") + kFindingColumns +
                    " FROM reconcile_findings WHERE class = ? AND charge_id = ? AND payment_id = ?",
                {finding.finding_class, finding.charge_id, finding.payment_id}));
  Finding stored = finding;
  stored.run_id = walk.summary.run_id;
  stored.instance = options_.instance;
  stored.found_at_ms = now;
  stored.updated_at_ms = now;
  bool changed = true;
  if (existing.empty()) {
    if (metrics_ != nullptr) metrics_->CountReconcileFinding(finding.finding_class);
  } else {
    const Finding before = FindingOf(existing[0]);
    stored.found_at_ms = before.found_at_ms;
    // A settled finding stays as it is; one seen again unchanged writes nothing new.
    if (before.action == "refunded" || before.action == finding.action) {
      changed = false;
      stored = before;
    }
  }
  if (changed) {
    IDEM_RETURN_IF_ERROR(txn->Exec(
        std::string("INSERT INTO reconcile_findings (") + kFindingColumns +
            ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (class, charge_id, payment_id) DO UPDATE SET detail = excluded.detail, "
            "action = excluded.action, refund_id = excluded.refund_id, "
            "refunded_amount = excluded.refunded_amount, run_id = excluded.run_id, "
            "instance = excluded.instance, updated_at = excluded.updated_at",
        {stored.finding_class, stored.charge_id, stored.payment_id, stored.amount, stored.currency,
         stored.detail, stored.action, stored.refund_id, stored.refunded_amount, stored.run_id,
         stored.instance, stored.found_at_ms, stored.updated_at_ms}));
    IDEM_RETURN_IF_ERROR(txn->Exec(
        "INSERT INTO reconcile_events (at, run_id, instance, class, charge_id, payment_id, "
        "action, refund_id, amount, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        {now, stored.run_id, stored.instance, stored.finding_class, stored.charge_id,
         stored.payment_id, stored.action, stored.refund_id,
         stored.refunded_amount.empty() ? stored.amount : stored.refunded_amount, stored.detail}));
    // Announced with the refund's record, once: the event's id is the refunded charge's.
    if (stored.action == "refunded" && !stored.payment_id.empty()) {
      IDEM_RETURN_IF_ERROR(AddRefundEvent(
          *txn, stored.payment_id,
          RefundFacts{stored.charge_id, stored.refund_id,
                      stored.refunded_amount.empty() ? stored.amount : stored.refunded_amount,
                      stored.currency},
          FromUnixMillis(now), metrics_));
    }
  }
  IDEM_RETURN_IF_ERROR(txn->Exec("UPDATE reconcile_runs SET cursor = ? WHERE id = ?",
                                 {cursor, walk.summary.run_id}));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  walk.cursor = cursor;
  if (finding.action != "refund_pending" || changed) walk.summary.findings.push_back(stored);
  return Ok();
}

// Payments that succeeded locally within the window but have no charge at the provider. Their
// charge may have been created just outside the window (two clocks), so each one not seen in
// the walk is looked up by reference before it is reported.
Status Reconciliation::CheckMissing(Walk& walk) {
  int64_t after_created = walk.summary.since_ms - 1;
  std::string after_id;
  for (;;) {
    IDEM_ASSIGN_OR_RETURN(
        auto rows, store_.Query("SELECT id, amount_minor, currency, provider_charge_id, created_at "
                                "FROM payments WHERE status = 'succeeded' AND created_at < ? AND "
                                "(created_at > ? OR (created_at = ? AND id > ?)) "
                                "ORDER BY created_at, id LIMIT 100",
                                {walk.summary.until_ms, after_created, after_created, after_id}));
    for (const SqlRow& r : rows) {
      const std::string id = Text(r[0]);
      after_created = Integer(r[4]);
      after_id = id;
      if (walk.matched.count(id) > 0) continue;
      IDEM_ASSIGN_OR_RETURN(std::optional<Charge> found,
                            http::RunSync(provider_.FindCharge(id, "")));
      if (found) continue;
      Finding f;
      f.finding_class = "missing";
      f.payment_id = id;
      f.amount = FormatAmount(Integer(r[1]), MinorDigits(Text(r[2])));
      f.currency = Text(r[2]);
      f.detail = "payment " + id + " succeeded with charge " + Text(r[3]) +
                 ", which the provider does not have";
      f.action = "reported";
      ++walk.summary.by_class["missing"];
      IDEM_RETURN_IF_ERROR(Record(walk, f, walk.cursor));
    }
    if (rows.size() < 100) return Ok();
  }
}

Result<std::vector<Finding>> Reconciliation::Report(int64_t since_ms, int limit) {
  IDEM_ASSIGN_OR_RETURN(auto rows, store_.Query(std::string("SELECT ") + kFindingColumns +
                                                    " FROM reconcile_findings WHERE found_at >= ? "
                                                    "ORDER BY found_at DESC, charge_id LIMIT ?",
                                                {since_ms, int64_t{limit}}));
  std::vector<Finding> out;
  out.reserve(rows.size());
  for (const SqlRow& r : rows) out.push_back(FindingOf(r));
  return out;
}

}  // namespace idem::idemd
