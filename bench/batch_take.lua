-- wrk script for the batch benchmark: one POST /v1/takes/batch per request, ITEMS takes of accounts
-- chosen uniformly at random among ACCOUNTS (a new draw per request).
--   wrk -t2 -c8 -d10s --latency -s batch_take.lua URL -- ITEMS ACCOUNTS KEY
local items, accounts, headers

function init(args)
  items = tonumber(args[1] or "100")
  accounts = tonumber(args[2] or "100000")
  headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. (args[3] or "")}
  math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)") or "0", 16) % 100000)
end

function request()
  local parts = {}
  for i = 1, items do
    parts[i] = '{"account_id": "acct-' .. math.random(1, accounts) .. '", "metric": "urls"}'
  end
  return wrk.format("POST", "/v1/takes/batch", headers, '{"items": [' .. table.concat(parts, ", ") .. ']}')
end
