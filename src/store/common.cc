// src/store/common.cc — row mapping shared by the SQL backends.
#include "src/store/common.h"

namespace idem::store_internal {
namespace {

template <std::size_t N>
Status CopyBytes(const SqlValue& v, std::array<uint8_t, N>* out, const char* column) {
  const Blob* b = std::get_if<Blob>(&v);
  if (b == nullptr || b->bytes.size() != N) {
    return MakeError(Errc::kDataLoss, std::string("record column ") + column + " is malformed");
  }
  std::copy(b->bytes.begin(), b->bytes.end(), out->begin());
  return Ok();
}

}  // namespace

Result<Record> RecordFromRow(const SqlRow& row) {
  if (row.size() != 18) return MakeError(Errc::kDataLoss, "record row has the wrong shape");
  auto text = [&](std::size_t i) -> std::string {
    const std::string* s = std::get_if<std::string>(&row[i]);
    return s ? *s : std::string();
  };
  auto integer = [&](std::size_t i) -> int64_t {
    const int64_t* n = std::get_if<int64_t>(&row[i]);
    return n ? *n : 0;
  };
  Record r;
  IDEM_RETURN_IF_ERROR(CopyBytes(row[0], &r.scope, "scope_hash"));
  r.tenant = text(1);
  r.user = text(2);
  r.route = text(3);
  IDEM_RETURN_IF_ERROR(CopyBytes(row[4], &r.fingerprint.mac, "request_hash"));
  r.fingerprint.rules_version = static_cast<uint32_t>(integer(5));
  r.fingerprint.secret_id = static_cast<uint32_t>(integer(6));
  IDEM_ASSIGN_OR_RETURN(r.state, ParseRecordState(text(7)));
  r.recovery_point = text(8);
  r.resource_id = text(9);
  r.status_code = static_cast<int>(integer(10));
  if (const Blob* b = std::get_if<Blob>(&row[11])) r.response = b->bytes;
  IDEM_RETURN_IF_ERROR(CopyBytes(row[12], &r.lease.owner, "owner_token"));
  r.lease.fence = integer(13);
  r.lease.until = FromUnixMillis(integer(14));
  r.created_at = FromUnixMillis(integer(15));
  r.updated_at = FromUnixMillis(integer(16));
  r.expires_at = FromUnixMillis(integer(17));
  return r;
}

Result<int64_t> SingleInteger(const std::vector<SqlRow>& rows, const char* what) {
  if (rows.size() == 1 && rows[0].size() == 1) {
    if (const int64_t* n = std::get_if<int64_t>(&rows[0][0])) return *n;
  }
  return MakeError(Errc::kDataLoss, std::string(what) + ": expected one integer");
}

Status ApplyMigrations(std::string_view component, const std::vector<Migration>& migrations,
                       int64_t current, const std::function<Status(const std::string&)>& run_sql,
                       const std::function<Status(int)>& record) {
  int64_t known = 0;
  for (const Migration& m : migrations) known = std::max<int64_t>(known, m.version);
  if (current > known) {
    return MakeError(Errc::kDataLoss, "schema of '" + std::string(component) + "' is at version " +
                                          std::to_string(current) + ", newer than this build (" +
                                          std::to_string(known) + ")");
  }
  for (const Migration& m : migrations) {
    if (m.version <= current) continue;
    Status s = run_sql(m.sql);
    if (!s) {
      return MakeError(Errc::kInvalidArgument, "migration " + std::string(component) + " v" +
                                                   std::to_string(m.version) + ": " +
                                                   s.error().message);
    }
    IDEM_RETURN_IF_ERROR(record(m.version));
  }
  return Ok();
}

Result<Record> ReclaimResult(int changed, std::optional<Record> current) {
  if (!current) return MakeError(Errc::kNotFound, "reclaim: record is gone");
  if (changed == 0) {
    return MakeError(Errc::kConflict, "reclaim: record moved on (fence " +
                                          std::to_string(current->lease.fence) + ", state " +
                                          std::string(RecordStateName(current->state)) + ")");
  }
  return std::move(*current);
}

Record NewRecord(const ClaimSpec& spec, Timestamp now, int64_t fence, Random& random) {
  Record r;
  r.scope = spec.scope;
  r.tenant = spec.tenant;
  r.user = spec.user;
  r.route = spec.route;
  r.fingerprint = spec.fingerprint;
  r.state = RecordState::kProcessing;
  random.Fill(r.lease.owner);
  r.lease.fence = fence;
  r.lease.until = now + spec.lease_ttl;
  r.created_at = now;
  r.updated_at = now;
  r.expires_at = now + spec.retention;
  return r;
}

}  // namespace idem::store_internal
