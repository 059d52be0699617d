-- wrk script of scripts/bench: POST /v1/orders, to idemd's gateway route, to nginx proxying the
-- same upstream, or to the upstream itself; or POST /v1/payments, to idemd's payments route and to
-- nginx's fixed 201 (the replays beside idem-bench's).
--   WRK_MODE=replay  one key again and again: through idemd, all replays after the first
--   WRK_MODE=first   a new key per request: every request a first execution
--   WRK_ROUTE=payments  POST /v1/payments with a payment's body instead of the gateway's order
--   WRK_JSON=FILE    where done() writes a JSON summary (requests, duration, statuses, errors,
--                    latency percentiles in microseconds)
-- wrk -t2 -c64 -d15s -s bench/wrk/gateway.lua http://127.0.0.1:PORT
local mode = os.getenv("WRK_MODE") or "first"
local out = os.getenv("WRK_JSON")
local payments = os.getenv("WRK_ROUTE") == "payments"
local path = payments and "/v1/payments" or "/v1/orders"
local body = payments and '{"merchant_order_no":"ORD-WRK-REPLAY","amount":"100.00","currency":"CNY"}'
  or '{"sku":"A1","amount":"10.50"}'
local counter = 0
local prefix
local threads = {}
statuses = {}  -- global: done() reads each thread's

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
  prefix = string.format("gw%08x", math.random(0, 0x7fffffff))
end

function request()
  local key = "gw-replay-key-0001"
  if mode == "first" then
    counter = counter + 1
    key = prefix .. "-" .. counter
  end
  return wrk.format("POST", path, {
    ["Authorization"] = "Bearer dev-acme-alice-7f3c9a1e",
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = key,
  }, body)
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  if not out then return end
  local merged = {}
  for _, t in ipairs(threads) do
    for status, n in pairs(t:get("statuses")) do
      merged[tostring(status)] = (merged[tostring(status)] or 0) + n
    end
  end
  local parts = {}
  for status, n in pairs(merged) do
    table.insert(parts, string.format('"%s":%d', status, n))
  end
  local e = summary.errors
  local f = assert(io.open(out, "w"))
  f:write(string.format(
    '{"mode":"%s","requests":%d,"duration_us":%d,"statuses":{%s},' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d},' ..
    '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"p99_9":%d,"max":%d,"mean":%.1f}}\n',
    mode, summary.requests, summary.duration, table.concat(parts, ","),
    e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean))
  f:close()
end
