// tools/idemctl/main.cc — idemctl's command line (CLI11): one subcommand per command, nested as
// the commands read ("payment get ID"), each with its own --help. Anything the command line can
// get wrong — an unknown option or command, a missing or malformed value — is a usage error: one
// message on standard error naming it, and exit status 2. What each command does is in
// commands.cc.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "http/client.h"
#include "http/message.h"
#include "idem/failpoint.h"
#include "idem/outbox.h"
#include "idem/result.h"
#include "server/idemd/routes.h"
#include "tools/idemctl/commands.h"

#ifndef IDEM_VERSION
#error "IDEM_VERSION (the project's version) is defined by tools/CMakeLists.txt"
#endif

namespace {

using namespace idem::ctl;

// --url and --api-key, with their environment defaults, on a command that talks to idemd.
void AddServerOptions(CLI::App* command, ServerOptions* server) {
  server->url = "http://127.0.0.1:8080";
  command->add_option("--url", server->url, "idemd's base URL")
      ->envname("IDEM_URL")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](const std::string& url) -> std::string {
            auto parsed = idem::http::ParseHttpUrl(url);
            return parsed ? "" : parsed.error().message;
          },
          "", "http URL"));
  command->add_option("--api-key", server->api_key, "an API key of idemd's config")
      ->envname("IDEM_API_KEY")
      ->required();
}

CLI::Option* AddConfigOption(CLI::App* command, std::string* path, const std::string& what) {
  return command->add_option("--config", *path, what)->type_name("FILE");
}

// -o text (the default) or -o json.
CLI::Option* AddOutputOption(CLI::App* command, Output* output) {
  return command
      ->add_option_function<std::string>(
          "-o,--output",
          [output](const std::string& format) {
            *output = format == "json" ? Output::kJson : Output::kText;
          },
          "text, or json: one JSON value on one line, for scripts")
      ->check(CLI::IsMember({"text", "json"}))
      ->type_name("FORMAT")
      ->default_str("text");
}

// An RFC 3339 time ("2026-11-30T00:00:00Z") into *unix_ms once the option is read.
CLI::Option* AddTimeOption(CLI::App* command, const std::string& name, int64_t* unix_ms,
                           const std::string& what) {
  return command
      ->add_option_function<std::string>(
          name, [unix_ms](const std::string& text) { *unix_ms = *idem::http::ParseRfc3339(text); },
          what)
      ->check(CLI::Validator(
          [](const std::string& text) -> std::string {
            return idem::http::ParseRfc3339(text)
                       ? ""
                       : "not an RFC 3339 time (e.g. 2026-11-30T00:00:00Z): " + text;
          },
          "", "RFC 3339"))
      ->type_name("TIME");
}

// A tenant or user name that idemd's config accepts for a new principal.
const CLI::Validator kPrincipalName(
    [](const std::string& name) -> std::string {
      const bool valid =
          !name.empty() && name.size() <= 64 &&
          name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-_") == std::string::npos;
      return valid ? "" : "must be 1..64 of a-z 0-9 - _";
    },
    "", "principal name");

std::string ExitStatusFooter() {
  std::ostringstream out;
  out << "Exit status:\n";
  for (const ExitStatus& status : kExitStatuses) {
    out << "  " << status.code << "  " << status.meaning << "\n";
  }
  out << "\nCommands against idemd take --url (default $IDEM_URL, else http://127.0.0.1:8080)\n"
         "and --api-key (default $IDEM_API_KEY); commands on a store take --config FILE, the\n"
         "idemd config. Run 'idemctl COMMAND --help' for a command's options.";
  return out.str();
}

// "idemctl payment get: ID is required", and where to read more: the command line as far as it
// was read names the command whose help to ask for.
std::string UsageMessage(const CLI::App* app, const CLI::Error& e) {
  std::string command = "idemctl";
  for (std::vector<CLI::App*> parsed = app->get_subcommands(); !parsed.empty();
       parsed = parsed.front()->get_subcommands()) {
    command += " " + parsed.front()->get_name();
  }
  return command + ": " + e.what() + "\nRun '" + command + " --help' for more information.\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "The idem command line: payments through idemd with the retrying client (one idempotency "
      "key per operation, reused on every retry), and, for operators, the store of an idemd "
      "config.",
      "idemctl");
  app.set_version_flag("--version", "idemctl " IDEM_VERSION);
  app.require_subcommand(0, 1);
  app.failure_message(UsageMessage);
  app.get_formatter()->column_width(40);  // subcommands share the formatter

  const std::string kIdemd = "Against a running idemd";
  const std::string kStore = "On the store of an idemd config";
  const std::string kSetUp = "Set-up";

  PayOptions pay;
  CLI::App* pay_cmd = app.add_subcommand("pay", "Make one payment (POST /v1/payments)");
  pay_cmd->footer(
      "The idempotency key is reused on every retry, and printed on standard error as\n"
      "\"Idempotency-Key: K (N attempts)\". Exit status 3 when the final answer is 4xx or 5xx.");
  pay_cmd->group(kIdemd);
  AddServerOptions(pay_cmd, &pay.server);
  pay_cmd->add_option("--order", pay.order, "the merchant's order number")->required();
  pay_cmd->add_option("--amount", pay.amount, "the amount, e.g. 100.00")->required();
  pay_cmd->add_option("--currency", pay.currency, "ISO 4217 code, e.g. CNY")->required();
  pay_cmd->add_option("--key", pay.key, "the Idempotency-Key (default: a fresh UUIDv7)");
  pay_cmd->add_flag("--async", pay.async, "ask for 202 Accepted (Prefer: respond-async)");
  AddOutputOption(pay_cmd, &pay.output);

  GetOptions payment;
  CLI::App* payment_cmd = app.add_subcommand("payment", "Read payments");
  payment_cmd->group(kIdemd);
  payment_cmd->require_subcommand(1);
  CLI::App* payment_get =
      payment_cmd->add_subcommand("get", "Print a payment (GET /v1/payments/ID)");
  payment_get->add_option("ID", payment.id, "the payment's id (pay_...)")->required();
  AddServerOptions(payment_get, &payment.server);
  AddOutputOption(payment_get, &payment.output);

  GetOptions operation;
  CLI::App* operation_cmd = app.add_subcommand("operation", "Read operations (by idempotency key)");
  operation_cmd->group(kIdemd);
  operation_cmd->require_subcommand(1);
  CLI::App* operation_get =
      operation_cmd->add_subcommand("get", "Print an operation (GET /v1/operations/KEY)");
  operation_get->add_option("KEY", operation.id, "the Idempotency-Key of the operation")
      ->required();
  AddServerOptions(operation_get, &operation.server);
  AddOutputOption(operation_get, &operation.output);

  InspectOptions inspect;
  inspect.route = std::string(idem::idemd::kPaymentsCreateRoute);
  CLI::App* record_cmd = app.add_subcommand("record", "Read idempotency records in the store");
  record_cmd->group(kStore);
  record_cmd->require_subcommand(1);
  CLI::App* record_inspect = record_cmd->add_subcommand(
      "inspect", "Print one record, read from the store (nothing is written)");
  AddConfigOption(record_inspect, &inspect.config, "the idemd config whose store to read")
      ->required();
  record_inspect->add_option("--tenant", inspect.tenant, "the principal's tenant")->required();
  record_inspect->add_option("--user", inspect.user, "the principal's user")->required();
  record_inspect->add_option("--key", inspect.key, "the Idempotency-Key")->required();
  record_inspect->add_option("--route", inspect.route, "the route of the record")
      ->capture_default_str();
  record_inspect->add_flag("--show-response", inspect.show_response,
                           "also print the stored answer, opened with the config's secrets");
  AddOutputOption(record_inspect, &inspect.output);

  HeldOptions held;
  CLI::App* record_held = record_cmd->add_subcommand(
      "held", "List the held outcomes an operator must settle (nothing is written)");
  AddConfigOption(record_held, &held.config, "the idemd config whose store to read")->required();
  record_held->add_option("--route", held.route, "only this route (e.g. gw.orders; default: all)");
  record_held->add_option("--limit", held.limit, "at most this many, the longest held first")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  AddOutputOption(record_held, &held.output);
  record_held->footer(
      "A held outcome is an operation whose service could not learn whether it executed and\n"
      "will not try it again (a gateway route with neither a status URL nor an upstream that\n"
      "deduplicates): its key answers 502 upstream-outcome-unknown until `record settle`.");

  SettleOptions settle;
  CLI::App* record_settle = record_cmd->add_subcommand(
      "settle", "Settle one held outcome: executed (with the answer to keep) or not executed");
  AddConfigOption(record_settle, &settle.config, "the idemd config whose store to write")
      ->required();
  CLI::Option* by_scope =
      record_settle
          ->add_option("--scope", settle.scope_hex,
                       "the record's scope hash (64 hex digits: record held, idemd's log)")
          ->check(CLI::Validator(
              [](const std::string& hex) -> std::string {
                return hex.size() == 64 &&
                               hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos
                           ? ""
                           : "not a scope hash (64 hex digits): " + hex;
              },
              "", "HEX"));
  CLI::Option* by_tenant =
      record_settle->add_option("--tenant", settle.tenant, "the principal's tenant");
  CLI::Option* by_user = record_settle->add_option("--user", settle.user, "the principal's user");
  CLI::Option* by_key = record_settle->add_option("--key", settle.key, "the Idempotency-Key");
  CLI::Option* by_route =
      record_settle->add_option("--route", settle.route, "the record's route (e.g. gw.orders)");
  for (CLI::Option* option : {by_tenant, by_user, by_key, by_route}) by_scope->excludes(option);
  by_tenant->needs(by_user)->needs(by_key)->needs(by_route);
  by_user->needs(by_tenant);
  by_key->needs(by_tenant);
  CLI::Option* executed = record_settle->add_flag(
      "--executed", settle.executed, "it ran: store --status (and --body-file) as its answer");
  bool not_executed = false;
  CLI::Option* not_executed_flag = record_settle->add_flag(
      "--not-executed", not_executed, "it did not run: the next request with its key executes");
  executed->excludes(not_executed_flag);
  CLI::Option* status =
      record_settle->add_option("--status", settle.status, "the answer's HTTP status")
          ->check(CLI::Range(200, 599));
  CLI::Option* body =
      record_settle->add_option("--body-file", settle.body_file, "the answer's body")
          ->check(CLI::ExistingFile);
  CLI::Option* content_type =
      record_settle->add_option("--content-type", settle.content_type, "the answer's Content-Type");
  for (CLI::Option* option : {status, body, content_type}) {
    option->needs(executed);
    not_executed_flag->excludes(option);
  }
  executed->needs(status);
  AddOutputOption(record_settle, &settle.output);
  record_settle->footer(
      "Name the record by --scope, or by --tenant, --user, --key (and --route). Find out at the\n"
      "upstream first: a wrong `--not-executed` lets the request run a second time.");

  SweepOptions sweep;
  CLI::App* sweep_cmd = app.add_subcommand("sweep", "Delete the expired finished records now");
  sweep_cmd->group(kStore);
  AddConfigOption(sweep_cmd, &sweep.config, "the idemd config whose store to sweep")->required();
  AddOutputOption(sweep_cmd, &sweep.output);

  ReconcileOptions reconcile;
  CLI::App* reconcile_cmd =
      app.add_subcommand("reconcile", "Reconcile the provider's charges with the payments");
  reconcile_cmd->group(kStore);
  reconcile_cmd->require_subcommand(0, 1);
  // Not required() here: `reconcile report` has its own; checked after parsing.
  CLI::Option* reconcile_config = AddConfigOption(
      reconcile_cmd, &reconcile.config, "the idemd config whose store and provider to reconcile");
  CLI::Option* reconcile_since = AddTimeOption(reconcile_cmd, "--since", &reconcile.since_ms,
                                               "the first creation time (RFC 3339); required");
  int64_t until_ms = 0;
  CLI::Option* reconcile_until =
      AddTimeOption(reconcile_cmd, "--until", &until_ms, "the end, excluded (default: now)");
  CLI::Option* reconcile_dry_run =
      reconcile_cmd->add_flag("--dry-run", reconcile.dry_run, "write and refund nothing");
  CLI::Option* reconcile_output = AddOutputOption(reconcile_cmd, &reconcile.output);

  ReportOptions report;
  CLI::App* report_cmd =
      reconcile_cmd->add_subcommand("report", "Print the findings so far, newest first");
  AddConfigOption(report_cmd, &report.config, "the idemd config whose store to read")->required();
  AddTimeOption(report_cmd, "--since", &report.since_ms, "findings from this time on (RFC 3339)");
  report_cmd->add_option("--limit", report.limit, "at most this many findings")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  AddOutputOption(report_cmd, &report.output);
  // `reconcile`'s own options run a reconciliation; with `report` they would be ignored.
  for (CLI::Option* option :
       {reconcile_config, reconcile_since, reconcile_until, reconcile_dry_run, reconcile_output}) {
    report_cmd->excludes(option);
  }
  // After `report` is added, which would copy it.
  reconcile_cmd->footer(
      "Reconciles the provider's charges created in [since, until) with the payments: reports\n"
      "what does not match and refunds duplicates (docs/reconciliation.md). A dry run writes and\n"
      "refunds nothing. Exit status 5 when a payment is missing or mismatched.");

  DeadLetterOptions dead;
  CLI::App* dead_cmd = app.add_subcommand("dead-letter", "A queue consumer's quarantined messages");
  dead_cmd->group(kStore);
  dead_cmd->require_subcommand(1);
  CLI::App* dead_list = dead_cmd->add_subcommand(
      "list", "Print a consumer's dead letters, oldest first (nothing moves)");
  CLI::App* dead_redrive = dead_cmd->add_subcommand(
      "redrive", "Move dead letters back to the consumer's stream or queue, to be consumed again");
  for (CLI::App* sub : {dead_list, dead_redrive}) {
    AddConfigOption(sub, &dead.config, "the idemd config that has the consumer")->required();
    sub->add_option("--consumer", dead.consumer, "the consumer's name ([[consumers]] name)")
        ->required();
    sub->add_option("--limit", dead.limit, "the first this many dead letters, oldest first")
        ->check(CLI::Range(1, 100000))
        ->capture_default_str();
    AddOutputOption(sub, &dead.output);
  }
  CLI::Option* dead_ids =
      dead_redrive->add_option("--id", dead.ids, "a dead letter to move back, by its listed id");
  CLI::Option* dead_all =
      dead_redrive->add_flag("--all", dead.all, "every dead letter among the first --limit");
  dead_ids->excludes(dead_all);
  dead_redrive->footer(
      "A message moved back is consumed like any other: its record decides. Fix what made it\n"
      "fail first (an upstream's answers, a producer's payload); a message of another payload\n"
      "than its key's record is quarantined again, and one whose record finished is acknowledged.");

  OutboxOptions outbox;
  CLI::App* outbox_cmd = app.add_subcommand("outbox", "The payment events and their relay");
  outbox_cmd->group(kStore);
  outbox_cmd->require_subcommand(1);
  CLI::App* outbox_list = outbox_cmd->add_subcommand(
      "list", "Print a payment's events, or the oldest not yet published (nothing moves)");
  CLI::App* outbox_relay = outbox_cmd->add_subcommand(
      "relay", "Publish the events not yet published to [outbox]'s broker, once");
  CLI::App* outbox_replay = outbox_cmd->add_subcommand(
      "replay", "Publish a payment's events again, under their ids, with the relay's next pass");
  for (CLI::App* sub : {outbox_list, outbox_relay, outbox_replay}) {
    AddConfigOption(sub, &outbox.config, "the idemd config whose store holds the events")
        ->required();
    AddOutputOption(sub, &outbox.output);
    if (sub == outbox_replay) continue;
    sub->add_option("--limit", outbox.limit,
                    "list: at most this many; relay: publish at most this many")
        ->check(CLI::Range(1, idem::limits::kOutboxPageMax))
        ->capture_default_str();
  }
  outbox_list->add_option("--payment", outbox.payment, "this payment's events, in order");
  outbox_replay
      ->add_option("--payment", outbox.payment, "the payment whose events to publish again")
      ->required();
  outbox_replay->footer(
      "For a consumer that lost a payment's events: each published one is set back to be\n"
      "published again, under its own id and in sequence order, by the next pass of a relay (an\n"
      "idemd's, or `idemctl outbox relay`). A consumer keyed by the event id drops the copies it\n"
      "already has.");
  outbox_relay->footer(
      "One pass of the relay idemd runs every [outbox] interval_ms: under the same lease, so it\n"
      "never runs beside an instance's relay (it fails instead). An event is marked published\n"
      "only once the broker confirmed it; a crash publishes it again, under its own id.");

  CLI::App* gen_secret_cmd =
      app.add_subcommand("gen-secret", "Print a fresh secrets file (TOML) for IDEM_SECRETS");
  gen_secret_cmd->group(kSetUp);

  ApiKeyAddOptions apikey;
  CLI::App* apikey_cmd = app.add_subcommand("apikey", "Manage API keys");
  apikey_cmd->group(kSetUp);
  apikey_cmd->require_subcommand(1);
  CLI::App* apikey_add = apikey_cmd->add_subcommand(
      "add", "Create an API key, add its SHA-256 to the config, print the key once");
  AddConfigOption(apikey_add, &apikey.config, "the idemd config to add the principal to")
      ->required();
  apikey_add
      ->add_option("--tenant", apikey.tenant, "the new principal's tenant: 1..64 of a-z 0-9 - _")
      ->required()
      ->check(kPrincipalName);
  apikey_add->add_option("--user", apikey.user, "the new principal's user: 1..64 of a-z 0-9 - _")
      ->required()
      ->check(kPrincipalName);
  AddOutputOption(apikey_add, &apikey.output);

  // Set last: subcommands copy their parent's footer when they are added.
  app.footer(ExitStatusFooter());

  try {
    app.parse(argc, argv);
    // What CLI11 cannot say: --config and --since are required by a run, not by `reconcile
    // report` (which requires its own --config).
    if (reconcile_cmd->parsed() && !report_cmd->parsed()) {
      if (reconcile_config->count() == 0) throw CLI::RequiredError("--config");
      if (reconcile_since->count() == 0) throw CLI::RequiredError("--since");
      if (reconcile_until->count() > 0) reconcile.until_ms = until_ms;
    }
    if (dead_redrive->parsed() && dead_ids->count() == 0 && !dead.all) {
      throw CLI::ValidationError("dead-letter redrive", "name dead letters by --id, or say --all");
    }
    // One of two, and a record named one of two ways.
    if (record_settle->parsed()) {
      if (!settle.executed && !not_executed) {
        throw CLI::ValidationError("record settle", "say --executed or --not-executed");
      }
      if (by_scope->count() == 0 && by_tenant->count() == 0) {
        throw CLI::ValidationError("record settle",
                                   "name the record by --scope, or by --tenant, --user and --key");
      }
    }
  } catch (const CLI::ParseError& e) {
    // Help and version print on standard output and exit 0; the rest are usage errors. CLI11
    // checks required options before it complains of unknown ones, but an unknown option is
    // the better message (it may be a misspelt required one); and it names them last to first.
    if (e.get_exit_code() == 0) return app.exit(e);
    if (std::vector<std::string> unknown = app.remaining(true); !unknown.empty()) {
      std::reverse(unknown.begin(), unknown.end());  // ExtrasError joins them in reverse
      app.exit(CLI::ExtrasError(unknown));
    } else {
      app.exit(e);
    }
    return kExitUsage;
  }
  if (app.get_subcommands().empty()) {
    std::cout << app.help();
    return kExitDone;
  }

  // Tests make a reconciliation crash at a step, as idemd's do (include/idem/failpoint.h).
  if (const char* spec = std::getenv("IDEM_FAILPOINTS"); spec != nullptr && *spec != '\0') {
    if (auto armed = idem::ArmFailpoints(spec); !armed) {
      std::cerr << "idemctl: " << armed.error().message << "\n";
      return kExitFailed;
    }
  }

  if (pay_cmd->parsed()) return Pay(pay);
  if (payment_get->parsed()) return PaymentGet(payment);
  if (operation_get->parsed()) return OperationGet(operation);
  if (record_inspect->parsed()) return RecordInspect(inspect);
  if (record_held->parsed()) return RecordHeld(held);
  if (record_settle->parsed()) return RecordSettle(settle);
  if (sweep_cmd->parsed()) return Sweep(sweep);
  if (report_cmd->parsed()) return ReconcileReport(report);
  if (reconcile_cmd->parsed()) return Reconcile(reconcile);
  if (outbox_list->parsed()) return OutboxList(outbox);
  if (outbox_relay->parsed()) return OutboxRelay(outbox);
  if (outbox_replay->parsed()) return OutboxReplay(outbox);
  if (dead_list->parsed()) return DeadLetterList(dead);
  if (dead_redrive->parsed()) return DeadLetterRedrive(dead);
  if (gen_secret_cmd->parsed()) return GenSecret();
  if (apikey_add->parsed()) return ApiKeyAdd(apikey);
  IDEM_CHECK(false && "a command without a dispatch");
  return kExitFailed;
}
