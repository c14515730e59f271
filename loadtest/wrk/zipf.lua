-- wrk script: each request carries an X-API-Key drawn from N keys with a
-- Zipf(s) distribution, on PATH (env WRK_PATH, default /). Keys and the
-- inverse CDF are built once per thread; the seed is fixed per thread so
-- runs are comparable. WRK_DELAY_MS > 0 makes each connection wait that
-- many milliseconds after a response before its next request (an offered
-- rate of about connections × 1000 / (delay + latency) a second, the same
-- for every server that answers within a fraction of the delay).
local N = tonumber(os.getenv("WRK_KEYS") or "10000")
local S = tonumber(os.getenv("WRK_ZIPF_S") or "1.1")
local PATH = os.getenv("WRK_PATH") or "/"
local DELAY = tonumber(os.getenv("WRK_DELAY_MS") or "0")
local cdf = {}
local keys = {}
local headers = {}

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
end

local function pick()
  local u = math.random()
  local lo, hi = 1, N
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cdf[mid] < u then lo = mid + 1 else hi = mid end
  end
  return keys[lo]
end

function request()
  headers["X-API-Key"] = pick()
  return wrk.format("GET", PATH, headers)
end

if DELAY > 0 then
  function delay()
    return DELAY
  end
end
