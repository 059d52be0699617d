// tools/idem_demo.cc — the protocol on a SQLite file, step by step: a payment is claimed and
// executed, its retry is replayed byte for byte, and reusing the key for another amount is refused.
// libidem alone, without HTTP: the smallest program that embeds it.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "idem/engine.h"
#include "idem/store/sqlite.h"

namespace {

using namespace idem;

struct Secrets {
  std::string hmac;
  std::string seal;
};

// Reads the development secrets, generating them on first use (mode 0600, never committed).
Result<Secrets> LoadOrCreateSecrets(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    auto fresh = [] {
      std::array<uint8_t, 32> bytes;
      SystemRandom().Fill(bytes);
      return ToHex(bytes);
    };
    std::ofstream out(path);
    out << "hmac " << fresh() << "\nseal " << fresh() << "\n";
    out.close();
    if (!out) return MakeError(Errc::kUnavailable, "cannot write " + path);
    chmod(path.c_str(), 0600);
    std::cout << "generated development secrets in " << path << "\n";
    in.open(path);
  }
  Secrets s;
  std::string name, hex;
  while (in >> name >> hex) {
    IDEM_ASSIGN_OR_RETURN(std::string bytes, DecodeHex(hex));
    (name == "hmac" ? s.hmac : s.seal) = std::move(bytes);
  }
  if (s.hmac.size() != 32 || s.seal.size() != 32) {
    return MakeError(Errc::kInvalidArgument,
                     path + ": expected 'hmac <64 hex>' and 'seal <64 hex>'");
  }
  return s;
}

constexpr const char* kPaymentsTable = R"sql(
CREATE TABLE payments (
  id                TEXT PRIMARY KEY,
  tenant            TEXT NOT NULL,
  merchant_order_no TEXT NOT NULL,
  amount            TEXT NOT NULL,
  currency          TEXT NOT NULL,
  status            TEXT NOT NULL,
  UNIQUE (tenant, merchant_order_no)
))sql";

std::string Describe(const Decision& d) {
  switch (d.kind) {
    case Decision::Kind::kExecute:
      return "EXECUTE (this request won the claim)";
    case Decision::Kind::kReplay:
      return "REPLAY (answered from the stored response)";
    case Decision::Kind::kInProgress:
      return "IN PROGRESS (another request holds the lease)";
  }
  return "?";
}

int Run(const std::string& db_path, const std::string& secrets_path) {
  auto secrets = LoadOrCreateSecrets(secrets_path);
  if (!secrets) {
    std::cerr << "secrets: " << secrets.error().message << "\n";
    return 1;
  }
  SqliteStoreOptions options;
  options.path = db_path;
  options.apps = {{"demo", {{1, kPaymentsTable}}}};
  auto store = OpenSqliteStore(options, SystemClock(), SystemRandom());
  auto fingerprinter = Fingerprinter::Create({{1, secrets->hmac}}, 1);
  auto sealer = Sealer::Create({{1, secrets->seal}}, 1, SystemRandom());
  if (!store || !fingerprinter || !sealer) {
    std::cerr << "start-up failed: "
              << (!store           ? store.error().message
                  : !fingerprinter ? fingerprinter.error().message
                                   : sealer.error().message)
              << "\n";
    return 1;
  }
  Engine engine(**store, **fingerprinter, **sealer, SystemClock());

  RoutePolicy policy;
  policy.route = "payments.create";
  policy.rules.money_fields = {"amount"};
  policy.rules.removed_fields = {"trace_id"};

  std::array<uint8_t, 8> nonce;
  SystemRandom().Fill(nonce);
  const std::string key = "demo-" + ToHex(nonce);
  const std::string order = "ORD-" + ToHex(nonce).substr(0, 8);
  const std::string payment_id = "pay_" + ToHex(nonce);
  std::cout << "store: " << db_path << "\nIdempotency-Key: " << key << "\n\n";

  auto send = [&](const std::string& title, const std::string& body) -> int {
    std::cout << "== " << title << "\n   body: " << body << "\n";
    Request request;
    request.principal = {"acme", "alice"};
    request.key_header = key;
    request.method = "POST";
    request.content_type = "application/json";
    request.api_version = "v1";
    request.body = body;
    auto decision =
        engine.Start(policy, request, [&](StoreTxn& txn, const Record& record) -> Status {
          if (!record.resource_id.empty()) return Ok();
          IDEM_RETURN_IF_ERROR(txn.Exec(
              "INSERT INTO payments (id, tenant, merchant_order_no, amount, currency, status) "
              "VALUES (?, 'acme', ?, '100', 'CNY', 'pending')",
              {payment_id, order}));
          return txn.Advance(record.scope, record.lease, "claimed", payment_id);
        });
    if (!decision) {
      std::cout << "   -> refused: " << ErrcName(decision.error().code) << ": "
                << decision.error().message << "\n\n";
      return decision.error().code == Errc::kFingerprintMismatch ? 422 : 500;
    }
    std::cout << "   -> " << Describe(*decision) << "\n";
    StoredResponse response;
    if (decision->kind == Decision::Kind::kExecute) {
      // A real service would call the payment provider here, with Idempotency-Key: payment id.
      response = {
          201,
          {{"Location", "/v1/payments/" + payment_id}, {"Content-Type", "application/json"}},
          R"({"id":")" + payment_id + R"(","merchant_order_no":")" + order +
              R"(","amount":"100.00","currency":"CNY","status":"succeeded"})"};
      auto finished = engine.Finish(
          decision->ticket, RecordState::kSucceeded, response,
          [&](StoreTxn& txn, const Record&) -> Status {
            IDEM_RETURN_IF_ERROR(
                txn.Exec("UPDATE payments SET status = 'succeeded' WHERE id = ?", {payment_id}));
            return Ok();
          });
      if (!finished) {
        std::cout << "   -> finish failed: " << finished.error().message << "\n\n";
        return 500;
      }
    } else if (decision->kind == Decision::Kind::kReplay) {
      response = decision->response;
    }
    std::cout << "   <- " << response.status << " " << response.body << "\n\n";
    return response.status;
  };

  const int first = send("1. first request", R"({"amount":"100.00","currency":"CNY"})");
  const int retry = send("2. retry, same meaning written differently",
                         R"({"currency":"CNY","amount":100,"trace_id":"retry-2"})");
  const int reuse =
      send("3. same key, different amount", R"({"amount":"250.00","currency":"CNY"})");
  auto txn = (*store)->Begin();
  auto rows = (*txn)->Exec("SELECT count(*) FROM payments WHERE merchant_order_no = ?", {order});
  const int64_t payments = rows ? std::get<int64_t>(rows->at(0).at(0)) : -1;
  std::cout << "payments rows for " << order << ": " << payments << "\n";
  const bool ok = first == 201 && retry == 201 && reuse == 422 && payments == 1;
  std::cout << (ok ? "demo: OK — one execution, one replay, one refusal\n" : "demo: UNEXPECTED\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string db = "data/demo.db";
  std::string secrets = "data/dev-secrets";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if ((arg == "--db" || arg == "--secrets") && i + 1 < argc) {
      (arg == "--db" ? db : secrets) = argv[++i];
    } else {
      std::cerr << "usage: idem_demo [--db FILE] [--secrets FILE]\n";
      return 2;
    }
  }
  return Run(db, secrets);
}
