-- wrk script: every request a new operation (new Idempotency-Key, new merchant order).
-- wrk -t2 -c64 -d10s -s bench/wrk/first_execution.lua http://127.0.0.1:8080
local counter = 0
local prefix

function init(args)
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
  prefix = string.format("wrk%08x", math.random(0, 0x7fffffff))
end

function request()
  counter = counter + 1
  local key = prefix .. "-" .. counter
  return wrk.format("POST", "/v1/payments", {
    ["Authorization"] = "Bearer dev-acme-alice-7f3c9a1e",
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = key,
  }, '{"merchant_order_no":"' .. key .. '","amount":"100.00","currency":"CNY"}')
end

local statuses = {}
function response(status)
  statuses[status] = (statuses[status] or 0) + 1
end
