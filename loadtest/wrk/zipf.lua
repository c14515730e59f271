-- wrk script: each request carries an X-API-Key drawn from N keys with a
-- Zipf(s) distribution, on PATH (env WRK_PATH, default /). Keys and the
-- inverse CDF are built once per thread; the seed is fixed per thread so
-- runs are comparable. WRK_DELAY_MS > 0 makes each connection wait that
-- many milliseconds after a response before its next request (an offered
-- rate of about connections × 1000 / (delay + latency) a second, the same
-- for every server that answers within a fraction of the delay).
--
-- With N ≤ 16,384 keys (the benchmarks' 10,000), init formats each key's
-- request once and draws a sequence of 131,072 keys that request() then
-- cycles through: the load generator spends about 3.7 µs of user CPU a
-- request instead of 5.4 drawing and formatting each one, so it is less
-- often the bottleneck, for every server alike. More keys (bench-long's
-- uniform 10^5 and 10^6) are drawn and formatted per request, so that every
-- key can come up.
local N = tonumber(os.getenv("WRK_KEYS") or "10000")
local S = tonumber(os.getenv("WRK_ZIPF_S") or "1.1")
local PATH = os.getenv("WRK_PATH") or "/"
local DELAY = tonumber(os.getenv("WRK_DELAY_MS") or "0")
local SEQ = 131072
local cdf = {}
local keys = {}
local headers = {}
local seq = nil -- the drawn sequence of formatted requests, when N is small
local at = 0

local function pick()
  local u = math.random()
  local lo, hi = 1, N
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cdf[mid] < u then lo = mid + 1 else hi = mid end
  end
  return lo
end

function init(args)
  local total = 0
  for i = 1, N do total = total + 1 / (i ^ S) end
  local acc = 0
  for i = 1, N do
    acc = acc + 1 / (i ^ S) / total
    cdf[i] = acc
    keys[i] = "key-" .. i
  end
  math.randomseed(12345)
  if N <= 16384 then
    local reqs = {}
    for i = 1, N do
      headers["X-API-Key"] = keys[i]
      reqs[i] = wrk.format("GET", PATH, headers)
    end
    seq = {}
    for m = 1, SEQ do seq[m] = reqs[pick()] end
  end
end

function request()
  if seq then
    at = at % SEQ + 1
    return seq[at]
  end
  headers["X-API-Key"] = keys[pick()]
  return wrk.format("GET", PATH, headers)
end

if DELAY > 0 then
  function delay()
    return DELAY
  end
end
