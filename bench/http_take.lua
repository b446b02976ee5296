-- wrk script for the HTTP take benchmark: one POST per request, the account chosen per request.
--   wrk -t2 -c32 -d10s --latency -s http_take.lua URL -- PATH_TEMPLATE ACCOUNTS KEY [GET]
-- With GET (the check benchmark, check_bench.py), a GET of the path, no body.
-- PATH_TEMPLATE has {id} where the account id goes (acct-1 .. acct-ACCOUNTS, uniformly at random);
-- ACCOUNTS = 1 puts every request on acct-1 (hot row). The baseline app gets the very same requests
-- (body and key included) on a template without {id}, so the load generator's work is identical.
local template, accounts, body, headers, method

function init(args)
  template = args[1] or "/v1/accounts/{id}/takes"
  accounts = tonumber(args[2] or "100000")
  headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. (args[3] or "")}
  method = args[4] or "POST"
  body = method == "POST" and '{"metric": "urls"}' or nil
  if method ~= "POST" then headers["Content-Type"] = nil end
  math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)") or "0", 16) % 100000)
end

function request()
  local id = "acct-" .. math.random(1, accounts)
  local path = template:gsub("{id}", id)
  return wrk.format(method, path, headers, body)
end
