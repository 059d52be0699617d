-- wrk script: the same request again and again (a retry storm): after the first, all replays.
-- wrk -t2 -c64 -d10s -s bench/wrk/replay.lua http://127.0.0.1:8080
local body = '{"merchant_order_no":"ORD-WRK-REPLAY","amount":"100.00","currency":"CNY"}'

function request()
  return wrk.format("POST", "/v1/payments", {
    ["Authorization"] = "Bearer dev-acme-alice-7f3c9a1e",
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = "wrk-replay-key-0001",
  }, body)
end
