// examples/embed/main.cc — libidem embedded in a program of its own: one operation runs through
// the engine on a SQLite file, and a second call with the same key and the same meaning gets the
// first call's answer back, replayed from the store instead of executed again.
//
//   embed FILE.db    prints both answers; exits 0 when the second is a byte-identical replay
#include <idem/engine.h>
#include <idem/store/sqlite.h>

#include <array>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace {

// 32 random bytes. A real program loads its HMAC and sealing secrets from its configuration and
// keeps them (idemd: IDEM_SECRETS); fresh ones here mean this run's records can be opened only by
// this run, which is all the example needs.
idem::Secret FreshSecret() {
  std::array<uint8_t, 32> bytes;
  idem::SystemRandom().Fill(bytes);
  return idem::Secret{1, std::string(bytes.begin(), bytes.end())};
}

int Fail(const std::string& what, const idem::Error& error) {
  std::cerr << "embed: " << what << ": " << error.message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: embed FILE.db\n";
    return 2;
  }
  idem::SqliteStoreOptions options;
  options.path = argv[1];
  auto store = idem::OpenSqliteStore(options, idem::SystemClock(), idem::SystemRandom());
  if (!store) return Fail("store", store.error());
  auto fingerprinter = idem::Fingerprinter::Create({FreshSecret()}, 1);
  if (!fingerprinter) return Fail("fingerprinter", fingerprinter.error());
  auto sealer = idem::Sealer::Create({FreshSecret()}, 1, idem::SystemRandom());
  if (!sealer) return Fail("sealer", sealer.error());
  idem::Engine engine(**store, **fingerprinter, **sealer, idem::SystemClock());

  idem::RoutePolicy policy;
  policy.route = "orders.create";
  std::array<uint8_t, 8> nonce;
  idem::SystemRandom().Fill(nonce);
  const std::string key = "order-" + idem::ToHex(nonce);  // a new operation on every run

  // The same request twice, as a client retrying after a lost answer would send it.
  std::vector<idem::StoredResponse> answers;
  for (int call = 1; call <= 2; ++call) {
    idem::Request request;
    request.principal = {"acme", "alice"};
    request.key_header = key;
    request.method = "POST";
    request.content_type = "application/json";
    request.api_version = "v1";
    request.body = R"({"item":"book","quantity":1})";
    auto decision = engine.Start(policy, request);
    if (!decision) return Fail("start", decision.error());
    if (decision->kind == idem::Decision::Kind::kExecute) {
      // The operation itself goes here; its answer is sealed and stored with the record.
      idem::StoredResponse created{201,
                                   {{"Content-Type", "application/json"}},
                                   R"({"order":")" + key + R"(","status":"created"})"};
      if (auto done = engine.Finish(decision->ticket, idem::RecordState::kSucceeded, created);
          !done) {
        return Fail("finish", done.error());
      }
      std::cout << "call " << call << ": executed, answered " << created.status << " "
                << created.body << "\n";
      answers.push_back(created);
    } else if (decision->kind == idem::Decision::Kind::kReplay) {
      std::cout << "call " << call << ": replayed " << decision->response.status << " "
                << decision->response.body << "\n";
      answers.push_back(decision->response);
    } else {
      std::cout << "call " << call << ": still in progress\n";
      return 1;
    }
  }
  const bool replayed = answers.size() == 2 && answers[0] == answers[1];
  std::cout << (replayed ? "the retry got the first answer back\n" : "unexpected answers\n");
  return replayed ? 0 : 1;
}
