// tools/idemctl/commands.h — what each idemctl command does once its command line is read: the
// exit statuses, each command's options as plain values, and one function per command. The
// command line itself (CLI11) is main.cc's alone, so only that file pays for its templates.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace idem::ctl {

// idemctl's exit statuses. `idemctl --help` prints kExitStatuses; docs/idemctl.md lists them.
inline constexpr int kExitDone = 0;
inline constexpr int kExitFailed = 1;      // idemd unreachable, a store, config or file error
inline constexpr int kExitUsage = 2;       // the command line: unknown, missing or bad
inline constexpr int kExitIdemdError = 3;  // idemd answered with an HTTP error (4xx, 5xx)
inline constexpr int kExitNoRecord = 4;    // record inspect found no record
inline constexpr int kExitReconcileAlarm =
    5;                                  // a missing or mismatched payment: a person must look
inline constexpr int kExitNotHeld = 6;  // record settle: the record is not a held outcome

struct ExitStatus {
  int code;
  const char* meaning;
};
inline constexpr ExitStatus kExitStatuses[] = {
    {kExitDone, "done"},
    {kExitFailed, "failed (idemd unreachable, a store, config or file error)"},
    {kExitUsage, "usage: an unknown option or command, a missing or bad value"},
    {kExitIdemdError, "idemd answered an error (HTTP 4xx or 5xx)"},
    {kExitNoRecord, "no such record (record inspect)"},
    {kExitReconcileAlarm, "reconcile found a missing or mismatched payment (a person must look)"},
    {kExitNotHeld, "record settle: the record is not a held outcome (settled already, or never)"},
};

// How a command prints its result on standard output. Errors go to standard error as text
// either way.
enum class Output { kText, kJson };

// Where idemd is and who we are to it.
struct ServerOptions {
  std::string url;
  std::string api_key;  // never printed
};

struct PayOptions {
  ServerOptions server;
  std::string order;
  std::string amount;
  std::string currency;
  std::string key;  // empty: a fresh UUIDv7, reused on every retry
  bool async = false;
  Output output = Output::kText;
};

// `payment get ID`, `operation get KEY`.
struct GetOptions {
  ServerOptions server;
  std::string id;
  Output output = Output::kText;
};

struct InspectOptions {
  std::string config;
  std::string tenant;
  std::string user;
  std::string key;
  std::string route;
  bool show_response = false;
  Output output = Output::kText;
};

// `record held`: the held outcomes of one route, or of all.
struct HeldOptions {
  std::string config;
  std::string route;  // empty: every route
  int limit = 100;
  Output output = Output::kText;
};

// `record settle`: one held outcome, named by its scope hash or by (tenant, user, route, key).
struct SettleOptions {
  std::string config;
  std::string scope_hex;  // set, or the four below
  std::string tenant;
  std::string user;
  std::string key;
  std::string route;
  bool executed = false;  // else --not-executed
  int status = 0;         // executed: the answer to store
  std::string body_file;  // executed: its body (empty: none)
  std::string content_type;
  Output output = Output::kText;
};

struct SweepOptions {
  std::string config;
  Output output = Output::kText;
};

struct ReconcileOptions {
  std::string config;
  int64_t since_ms = 0;
  std::optional<int64_t> until_ms;  // unset: now
  bool dry_run = false;
  Output output = Output::kText;
};

struct ReportOptions {
  std::string config;
  int64_t since_ms = 0;
  int limit = 100;
  Output output = Output::kText;
};

struct DeadLetterOptions {
  std::string config;
  std::string consumer;          // a [[consumers]] name
  int limit = 100;               // the first this many dead letters, oldest first
  std::vector<std::string> ids;  // redrive: these (as listed); none with `all`
  bool all = false;              // redrive: every one among the first `limit`
  Output output = Output::kText;
};

struct OutboxOptions {
  std::string config;
  std::string payment;  // list: this payment's events, else the unpublished ones; replay: its
  int limit = 100;      // list: at most this many; relay: at most this many published
  Output output = Output::kText;
};

struct ApiKeyAddOptions {
  std::string config;
  std::string tenant;
  std::string user;
  Output output = Output::kText;
};

// Each command returns its exit status and prints its result on standard output; failures are
// one line on standard error ("idemctl: ...") and kExitFailed. The options are taken as valid:
// main.cc checks what the command line can check.

// One POST /v1/payments through the retrying client; prints the answer (and, on standard error,
// the key it used). kExitIdemdError when the final answer is 4xx or 5xx.
int Pay(const PayOptions& options);
// GET /v1/payments/ID. kExitIdemdError when idemd answers 4xx or 5xx.
int PaymentGet(const GetOptions& options);
// GET /v1/operations/KEY. kExitIdemdError when idemd answers 4xx or 5xx.
int OperationGet(const GetOptions& options);
// The record of (tenant, user, route, key) read from the store of the config. kExitNoRecord when
// there is none.
int RecordInspect(const InspectOptions& options);
// The held outcomes (include/idem/record.h) in the store of the config, the longest held first.
int RecordHeld(const HeldOptions& options);
// Settles one held outcome: executed, with the answer to store, or not executed. kExitNoRecord
// when there is no record, kExitNotHeld when it is not a held outcome.
int RecordSettle(const SettleOptions& options);
// Deletes every expired finished record from the store of the config now.
int Sweep(const SweepOptions& options);
// One reconciliation run over the provider's charges created in [since, until).
// kExitReconcileAlarm when it found a missing or mismatched payment.
int Reconcile(const ReconcileOptions& options);
// The reconciliation findings since `since_ms`, newest first.
int ReconcileReport(const ReportOptions& options);
// A fresh secrets file (TOML) for IDEM_SECRETS.
// dead-letter list: a consumer's dead letters, oldest first (nothing is moved).
int DeadLetterList(const DeadLetterOptions& options);
// dead-letter redrive: the chosen dead letters moved back to the consumer's stream or queue, each
// both or neither; prints how many. The message's key decides what happens then: a finished
// record answers it (acknowledged as a duplicate), a record of another payload quarantines it
// again, else it executes.
int DeadLetterRedrive(const DeadLetterOptions& options);

// `idemctl outbox list`: a payment's events (--payment), or the oldest unpublished ones.
int OutboxList(const OutboxOptions& options);
// `idemctl outbox replay`: sets --payment's published events back, so that the relay publishes
// them again (ReplayPaymentEvents).
int OutboxReplay(const OutboxOptions& options);
// `idemctl outbox relay`: one pass of the relay of the config's [outbox] (docs/outbox.md), under
// the relay's lease; exit 1 when another instance relays now or the broker fails.
int OutboxRelay(const OutboxOptions& options);

int GenSecret();
// A new API key: its SHA-256 appended to the config as a principal, the key printed once.
int ApiKeyAdd(const ApiKeyAddOptions& options);

}  // namespace idem::ctl
