-- wrk script for scripts/bench-edge.sh's HTTP peers: each request a POST of
-- one JSON rate limit check for a key drawn from N keys by Zipf(s), as
-- loadtest/wrk/zipf.lua draws its X-API-Key (same seed, same keys).
-- WRK_BODY picks the API:
--   ratelimit   envoyproxy/ratelimit's /json: {"domain":"bench","descriptors":[{"entries":[{"key":"user","value":KEY}]}]}
--   gubernator  gubernator's /v1/GetRateLimits: one token-bucket request,
--               WRK_LIMIT hits per WRK_DURATION_MS (default 1,000,000 per minute)
-- on PATH (env WRK_PATH). WRK_DELAY_MS > 0: each connection waits that
-- long after a response (as in loadtest/wrk/zipf.lua). As zipf.lua does
-- for N ≤ 16,384 keys, init formats each key's request once and draws a
-- sequence of 131,072 that request() cycles through.
local N = tonumber(os.getenv("WRK_KEYS") or "10000")
local S = tonumber(os.getenv("WRK_ZIPF_S") or "1.1")
local PATH = os.getenv("WRK_PATH") or "/"
local KIND = os.getenv("WRK_BODY") or "ratelimit"
local LIMIT = os.getenv("WRK_LIMIT") or "1000000"
local DURMS = os.getenv("WRK_DURATION_MS") or "60000"
local DELAY = tonumber(os.getenv("WRK_DELAY_MS") or "0")
local SEQ = 131072
local cdf = {}
local bodies = {}
local headers = { ["Content-Type"] = "application/json" }
local seq = nil
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
    local key = "key-" .. i
    if KIND == "gubernator" then
      bodies[i] = '{"requests":[{"name":"bench","unique_key":"' .. key .. '","hits":1,"limit":' .. LIMIT ..
        ',"duration":' .. DURMS .. ',"algorithm":0}]}'
    else
      bodies[i] = '{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"' .. key .. '"}]}]}'
    end
  end
  math.randomseed(12345)
  if N <= 16384 then
    local reqs = {}
    for i = 1, N do reqs[i] = wrk.format("POST", PATH, headers, bodies[i]) end
    seq = {}
    for m = 1, SEQ do seq[m] = reqs[pick()] end
  end
end

function request()
  if seq then
    at = at % SEQ + 1
    return seq[at]
  end
  return wrk.format("POST", PATH, headers, bodies[pick()])
end

if DELAY > 0 then
  function delay()
    return DELAY
  end
end
