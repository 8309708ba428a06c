-- wrk script: each thread sends its own file of pre-signed requests
-- (written by signed_requests.py), each request once, in order; counts the
-- answers by status. Past the end of its file a thread starts over, and
-- the summary says how many requests were sent again (duplicates).
local prefix = os.getenv("BW_REQUESTS")
local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

-- Globals, so done() can read them from each thread.
reqs, n, i, wrapped = {}, 0, 0, 0
statuses = {}

function init(args)
  local f = assert(io.open(prefix .. "." .. tid, "rb"))
  local data = f:read("*a")
  f:close()
  local pos = 1
  while pos <= #data do
    local len = tonumber(data:sub(pos, pos + 7))
    n = n + 1
    reqs[n] = data:sub(pos + 8, pos + 7 + len)
    pos = pos + 8 + len
  end
end

function request()
  i = i + 1
  if i > n then
    i = 1
    wrapped = wrapped + 1
  end
  return reqs[i]
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local total, sent_again = {}, 0
  for _, t in ipairs(threads) do
    local s = t:get("statuses")
    for k, v in pairs(s) do
      total[k] = (total[k] or 0) + v
    end
    sent_again = sent_again + t:get("wrapped")
  end
  local parts = {}
  for k, v in pairs(total) do
    table.insert(parts, k .. "=" .. v)
  end
  table.sort(parts)
  io.write("statuses: " .. table.concat(parts, " ") .. "\n")
  io.write("wrapped: " .. sent_again .. "\n")
  io.write(string.format("p50_ms: %.2f p99_ms: %.2f\n",
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
