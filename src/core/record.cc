// src/core/record.cc — record states, an operation's downstream key and the stored-response
// encoding.
#include "idem/record.h"

#include <algorithm>
#include <array>

#include "idem/key.h"
#include "src/core/wire.h"

namespace idem {

std::string_view RecordStateName(RecordState state) {
  switch (state) {
    case RecordState::kProcessing:
      return "PROCESSING";
    case RecordState::kSucceeded:
      return "SUCCEEDED";
    case RecordState::kFailedFinal:
      return "FAILED_FINAL";
    case RecordState::kFailedRetryable:
      return "FAILED_RETRYABLE";
  }
  return "UNKNOWN";
}

Result<RecordState> ParseRecordState(std::string_view name) {
  for (RecordState s : {RecordState::kProcessing, RecordState::kSucceeded,
                        RecordState::kFailedFinal, RecordState::kFailedRetryable}) {
    if (RecordStateName(s) == name) return s;
  }
  return MakeError(Errc::kDataLoss, "unknown record state '" + std::string(name) + "'");
}

bool IsReplayable(RecordState state) {
  return state == RecordState::kSucceeded || state == RecordState::kFailedFinal;
}

bool IsLegalTransition(const Record& from, RecordState to, Timestamp now) {
  if (from.state == RecordState::kProcessing) return true;  // progress, take over or finish
  const bool expired = from.expires_at <= now;
  if (to == RecordState::kProcessing) {
    return from.state == RecordState::kFailedRetryable || expired;  // a retry, a new operation
  }
  // An operator's settlement of a held outcome.
  return from.state == RecordState::kFailedFinal && from.recovery_point == kOutcomeUnknownPoint &&
         !expired;
}

Timestamp LastSent(const Record& record) {
  return record.sent_at != Timestamp{} ? record.sent_at : record.updated_at;
}

std::optional<Millis> UntilSettled(const Record& record, Millis window) {
  const Timestamp settled = LastSent(record) + window;
  if (record.observed_at >= settled) return std::nullopt;
  return std::chrono::duration_cast<Millis>(settled - record.observed_at);
}

namespace {

using wire::PutBytes;
using wire::PutU32;
using wire::Reader;

constexpr uint32_t kResponseFormat = 1;

}  // namespace

std::string OperationKeyOf(const Record& record) {
  std::array<uint8_t, sizeof(record.scope) + sizeof(record.lease.owner)> input{};
  std::copy(record.scope.begin(), record.scope.end(), input.begin());
  std::copy(record.lease.owner.begin(), record.lease.owner.end(),
            input.begin() + static_cast<std::ptrdiff_t>(record.scope.size()));
  return ToHex(
      Sha256({std::string_view(reinterpret_cast<const char*>(input.data()), input.size())}));
}

std::string EncodeResponse(const StoredResponse& r) {
  std::string out;
  out.reserve(16 + r.body.size());
  PutU32(out, kResponseFormat);
  PutU32(out, static_cast<uint32_t>(r.status));
  PutU32(out, static_cast<uint32_t>(r.headers.size()));
  for (const auto& [name, value] : r.headers) {
    PutBytes(out, name);
    PutBytes(out, value);
  }
  PutBytes(out, r.body);
  return out;
}

Result<StoredResponse> DecodeResponse(std::string_view bytes) {
  Reader in(bytes);
  StoredResponse r;
  uint32_t format, status, count;
  if (!in.U32(&format) || format != kResponseFormat || !in.U32(&status) || !in.U32(&count) ||
      count > 64) {
    return MakeError(Errc::kDataLoss, "stored response: bad header");
  }
  r.status = static_cast<int>(status);
  r.headers.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    std::string name, value;
    if (!in.Bytes(&name) || !in.Bytes(&value)) {
      return MakeError(Errc::kDataLoss, "stored response: truncated header");
    }
    r.headers.emplace_back(std::move(name), std::move(value));
  }
  if (!in.Bytes(&r.body) || !in.Done()) {
    return MakeError(Errc::kDataLoss, "stored response: bad body");
  }
  return r;
}

}  // namespace idem
