-- wrk script for the webhook benchmark: pre-signed Stripe deliveries, each sent once.
--   wrk -tT -cC -dDs --latency -s webhooks.lua URL -- FILE T
-- FILE has one delivery per line, "<Stripe-Signature>\t<body>"; thread k of T sends lines k, k+T, ...
-- If a thread runs out it starts over (those are duplicates, a cheaper path) and done() says so.
local threads, created = {}, 0

function setup(thread)
  created = created + 1
  thread:set("id", created)
  table.insert(threads, thread)
end

reqs, i, wraps = {}, 0, 0  -- globals: done() reads wraps through thread:get

function init(args)
  local file, n, k = args[1], tonumber(args[2]), 0
  for line in io.lines(file) do
    if k % n == id - 1 then
      local sig, body = line:match("^([^\t]*)\t(.*)$")
      reqs[#reqs + 1] = wrk.format("POST", "/webhooks/stripe",
        {["Content-Type"] = "application/json", ["Stripe-Signature"] = sig}, body)
    end
    k = k + 1
  end
end

function request()
  i = i + 1
  if i > #reqs then
    i, wraps = 1, wraps + 1
  end
  return reqs[i]
end

function done(summary, latency, requests)
  local w = 0
  for _, t in ipairs(threads) do
    w = w + (t:get("wraps") or 0)
  end
  io.write(string.format("Wraps: %d\n", w))
end
