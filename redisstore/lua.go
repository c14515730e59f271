package redisstore

import (
	"crypto/sha1"
	"encoding/hex"
)

// The server-side scripts. Each runs atomically on the node that holds its
// keys (every key of one script carries the same hash tag, so one cluster
// slot). They are loaded once per node with SCRIPT LOAD when the Store
// connects and called with EVALSHA; a node that answers NOSCRIPT (restarted,
// failed over, SCRIPT FLUSH) gets the same call once more as EVAL, which
// also caches the script there again.
//
// Redis Lua numbers are IEEE doubles: integers are exact only up to 2^53,
// and Unix nanoseconds (about 1.8e18) and the products of the leaky bucket's
// arithmetic (up to 2^63) are not. luaInt64 is therefore a small exact
// integer library: a value v is a pair (h, l) of doubles with v = h×10^9 + l
// and 0 ≤ l < 10^9. Every intermediate it forms stays below 2^53, so every
// operation is exact for |v| below about 4e19, which covers int64 with room
// for the sums of two. Values cross the script boundary as decimal strings
// (the base makes parsing and printing them a split at the ninth digit from
// the right), and are stored as decimal strings, so HGETALL shows them as
// they are.
const luaInt64 = `
local floor = math.floor
local B = 1000000000
local MAXH, MAXL = 9223372036, 854775807 -- math.MaxInt64 as (h, l)
local SATH = 1000000000000 -- (SATH, 0) stands for "more than 4e19"

-- norm carries l into h: for any integer l below 2^53 in magnitude.
local function norm(h, l)
  local c = floor(l / B)
  return h + c, l - c * B
end
local function add(ah, al, bh, bl) return norm(ah + bh, al + bl) end
local function sub(ah, al, bh, bl) return norm(ah - bh, al - bl) end
local function lt(ah, al, bh, bl) return ah < bh or (ah == bh and al < bl) end
local function tod(h, l) return h * B + l end -- nearest double, for estimates only
local function split(x) -- an integer double below 2^53
  local h = floor(x / B)
  return h, x - h * B
end

-- parse reads a decimal int64 ("-"? digits, at most 19 of them, in range),
-- or returns nil.
local function parse(s)
  if type(s) ~= 'string' or not string.find(s, '^%-?%d+$') then return nil end
  if #s <= 15 then return split(tonumber(s)) end
  local neg, d = string.match(s, '^(%-?)(%d+)$')
  if #d > 19 then return nil end
  local n = #d
  local h, l = 0, tonumber(d)
  if n > 9 then
    h, l = tonumber(string.sub(d, 1, n - 9)), tonumber(string.sub(d, n - 8))
  end
  local maxl = MAXL
  if neg == '-' then maxl = MAXL + 1 end
  if h > MAXH or (h == MAXH and l > maxl) then return nil end
  if neg == '-' then return norm(-h, -l) end
  return h, l
end

-- arg reads the pair ARGV[i], ARGV[i+1] that the caller split an int64
-- into: h = ⌊v / 10^9⌋ and l = v − h × 10^9.
local function arg(i)
  local h, l = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if not h or not l or l < 0 or l >= B then return nil end
  return h, l
end

-- fmt prints (h, l) in decimal.
local function fmt(h, l)
  local sign = ''
  if h < 0 then
    sign = '-'
    h, l = norm(-h, -l)
  end
  if h == 0 then return sign .. string.format('%d', l) end
  return sign .. string.format('%d%09d', h, l)
end

-- mulsmall returns a × m for a ≥ 0 and 0 ≤ m < 1e11 with a × m below 4e19.
local function mulsmall(ah, al, m)
  local m1 = floor(m / 100000)
  local m0 = m - m1 * 100000
  local x1 = al * m1
  local x1h = floor(x1 / 10000)
  return norm(ah * m + x1h, (x1 - x1h * 10000) * 100000 + al * m0)
end

-- mul returns a × b for a, b ≥ 0 below 2e19, or (SATH, 0) when the
-- product exceeds 4e19.
local function mul(ah, al, bh, bl)
  if tod(ah, al) * tod(bh, bl) > 4e19 then return SATH, 0 end
  local ph, pl = mulsmall(ah, al, bl)
  if bh == 0 then return ph, pl end
  local qh, ql = mulsmall(ah, al, bh)
  return add(ph, pl, qh * B + ql, 0)
end

-- divmod returns the floor quotient and the remainder of a / b, for
-- 0 ≤ a < 2e19 and b > 0.
local function divmod(ah, al, bh, bl)
  if bh == 0 and bl < 8388608 then -- short division, digit by digit
    local qh = floor(ah / bl)
    local r = ah - qh * bl
    if r < 0 then qh, r = qh - 1, r + bl elseif r >= bl then qh, r = qh + 1, r - bl end
    local cur = r * B + al -- below 2^23 × 10^9 + 10^9 < 2^53
    local ql = floor(cur / bl)
    local rl = cur - ql * bl
    if rl < 0 then ql, rl = ql - 1, rl + bl elseif rl >= bl then ql, rl = ql + 1, rl - bl end
    return qh, ql, 0, rl
  end
  -- b ≥ 2^23, so the quotient is below 2^41: estimate it in doubles (off
  -- by at most one), then correct it with the exact remainder.
  local q = floor(tod(ah, al) / tod(bh, bl))
  local qh, ql = split(q)
  local ph, pl = mul(bh, bl, qh, ql)
  local rh, rl = sub(ah, al, ph, pl)
  for _ = 1, 4 do
    if rh < 0 then
      q = q - 1
      rh, rl = add(rh, rl, bh, bl)
    elseif not lt(rh, rl, bh, bl) then
      q = q + 1
      rh, rl = sub(rh, rl, bh, bl)
    else
      qh, ql = split(q)
      return qh, ql, rh, rl
    end
  end
  error(redis.error_reply('POPLIMIT division did not converge'))
end
`

// luaCounter is every counter write, so that one script's presence in a
// node's cache decides all of a call's writes at once (see batch.exec):
// ARGV[1] is the delta in decimal. An increment is INCRBY, then PEXPIRE with
// ARGV[2] (ms) when the result equals the delta, so a counter the increment
// created gets its TTL, atomically. (A counter at 0, decremented to it,
// that is incremented takes the TTL again, which only lengthens its life.)
// A decrement is INCRBY of the negative delta clamped at 0 with the TTL
// kept; a missing counter stays missing and reads -1 (reported as 0, a
// miss).
const luaCounter = `local d = ARGV[1]
if string.sub(d, 1, 1) ~= '-' then
  local v = redis.call('INCRBY', KEYS[1], d)
  if v == tonumber(d) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return v
end
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local v = redis.call('INCRBY', KEYS[1], d)
if v < 0 then
  redis.call('SET', KEYS[1], '0', 'KEEPTTL')
  return 0
end
return v`

// luaGCRA is algo.LeakyBucket.Allow over a hash {tat, frac}, exact in
// luaInt64. KEYS[1] is the bucket. ARGV: now (Unix ns, a pair), n, Rate (a
// pair), n × Per (a pair), (Capacity − n) × Per (a pair, negative when n >
// Capacity), "1" for the conditional form (pour n only if it fits) or "0"
// for the unconditional one (pour n whatever the level), and the
// clock-skew allowance in ms. It returns {poured (1 or 0), TAT, Frac}, the
// state after the call, from which the caller computes the room left and
// the release time with algo.LeakyBucket itself. After a pour it sets
// the key's TTL to the time the bucket takes to drain, in whole ms rounded
// up, plus the allowance; a refusal writes nothing.
//
// A stored Frac of Rate or more (the key was last poured under another
// rate) is read as Rate − 1: the theoretical arrival time moves later by
// less than a nanosecond.
//
// With "2" in ARGV[10] it gives units back instead (algo.LeakyBucket.
// GiveBack): ARGV[12], ARGV[13] is mark, the TAT an earlier pour of the n
// units left, and the TAT moves earlier by min(⌊n × Per / Rate⌋, mark −
// now) ns, never before now; it returns {1, TAT, Frac}.
const luaGCRA = luaInt64 + `
local nh, nl = arg(1)
local n = tonumber(ARGV[3])
local rh, rl = arg(4)
local ph, pl = arg(6)
local ch, cl = arg(8)
local cond = ARGV[10] == '1'
local skew = tonumber(ARGV[11])
if not nh or not n or not rh or not ph or not ch or not skew or rh < 0 or (rh == 0 and rl == 0) or ph < 0 then
  return redis.error_reply('POPLIMIT bad arguments')
end
local th, tl, fh, fl = 0, 0, 0, 0
local st = redis.call('HMGET', KEYS[1], 'tat', 'frac')
if st[1] or st[2] then
  th, tl = parse(st[1])
  fh, fl = parse(st[2])
  if not th or not fh or fh < 0 then return redis.error_reply('POPLIMIT bad state') end
  if not lt(fh, fl, rh, rl) then fh, fl = sub(rh, rl, 0, 1) end
end
if n <= 0 then return {1, fmt(th, tl), fmt(fh, fl)} end
if ARGV[10] == '2' then
  local mh, ml = arg(12)
  if not mh then return redis.error_reply('POPLIMIT bad arguments') end
  local lqh, lql = divmod(ph, pl, rh, rl) -- the units' length, whole ns
  local gh, gl = sub(mh, ml, nh, nl)
  if lt(lqh, lql, gh, gl) then gh, gl = lqh, lql end
  if gh < 0 or (gh == 0 and gl == 0) or not lt(nh, nl, th, tl) then return {1, fmt(th, tl), fmt(fh, fl)} end
  th, tl = sub(th, tl, gh, gl)
  if not lt(nh, nl, th, tl) then th, tl, fh, fl = nh, nl, 0, 0 end
  local eh, el = sub(th, tl, nh, nl)
  local ms = eh * 1000 + math.ceil(el / 1000000)
  if ms < 1 then ms = 1 end
  ms = ms + skew
  local tat, frac = fmt(th, tl), fmt(fh, fl)
  redis.call('HSET', KEYS[1], 'tat', tat, 'frac', frac)
  redis.call('PEXPIRE', KEYS[1], string.format('%d', ms))
  return {1, tat, frac}
end
local dh, dl = sub(th, tl, nh, nl)
local empty = dh < 0 or (dh == 0 and dl == 0 and fh == 0 and fl == 0)
if cond then
  local lh, ll = 0, 0 -- the level, in units of 1/Per unit
  if not empty then
    lh, ll = mul(dh, dl, rh, rl)
    if lh < SATH then lh, ll = add(lh, ll, fh, fl) end
  end
  if lt(ch, cl, lh, ll) then return {0, fmt(th, tl), fmt(fh, fl)} end
end
if empty then th, tl, fh, fl = nh, nl, 0, 0 end
local toth, totl = add(fh, fl, ph, pl)
local qh, ql, remh, reml = divmod(toth, totl, rh, rl)
th, tl = add(th, tl, qh, ql)
fh, fl = remh, reml
if lt(MAXH, MAXL, th, tl) then th, tl, fh, fl = MAXH, MAXL, 0, 0 end
local eh, el = sub(th, tl, nh, nl)
if fh > 0 or fl > 0 then eh, el = add(eh, el, 0, 1) end
local ms = eh * 1000 + math.ceil(el / 1000000)
if ms < 1 then ms = 1 end
ms = ms + skew
local tat, frac = fmt(th, tl), fmt(fh, fl)
redis.call('HSET', KEYS[1], 'tat', tat, 'frac', frac)
redis.call('PEXPIRE', KEYS[1], string.format('%d', ms))
return {1, tat, frac}
`

// luaSlidingLog is algo.SlidingLog over a sorted set of one member per
// logged unit (KEYS[1]) and a hash of its bookkeeping (KEYS[2]): e, the
// epoch (Unix ns) that scores count from; t, the latest now seen; s, the
// last member number handed out. Scores are nanoseconds since e, exact as
// long as they stay below 2^53; the epoch moves to now whenever the log is
// empty, and to the oldest entry (every score shifted down) when now is
// 2^52 ns past it, which Window ≤ 2^52 ns keeps in range.
//
// ARGV: now (Unix ns, a pair), n, Limit, Window (ns, a pair), "1" for
// conditional (Allow) or "0" for unconditional (Add), the TTL (one window
// plus the clock-skew allowance, ms), and the most members a key may hold
// (Add stops logging there). It returns {logged (1 or 0), count after the
// call, the oldest entry's instant or nil, releaseAt}, with releaseAt
// "never" when n > Limit.
const luaSlidingLog = luaInt64 + `
local nh, nl = arg(1)
local n = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local wh, wl = arg(5)
local cond = ARGV[7] == '1'
local ttl = ARGV[8]
local cap = tonumber(ARGV[9])
if not nh or not n or not limit or not wh or not cap or wh < 0 or (wh == 0 and wl == 0) then
  return redis.error_reply('POPLIMIT bad arguments')
end
local eh, el, seq
local m = redis.call('HMGET', KEYS[2], 'e', 't', 's')
if m[1] or m[2] or m[3] then
  local th, tl
  eh, el = parse(m[1])
  th, tl = parse(m[2])
  if type(m[3]) == 'string' and #m[3] <= 15 and string.match(m[3], '^%d+$') then seq = tonumber(m[3]) end
  if not eh or not th or not seq or lt(th, tl, eh, el) then
    return redis.error_reply('POPLIMIT bad state')
  end
  if lt(nh, nl, th, tl) then nh, nl = th, tl end
else
  redis.call('DEL', KEYS[1]) -- entries without their epoch cannot be read
  eh, el, seq = nh, nl, 0
end
-- drop the entries at or before now - Window
local hh, hl = sub(nh, nl, wh, wl)
hh, hl = sub(hh, hl, eh, el)
if hh >= 0 then
  if hh >= 9007199 then
    redis.call('DEL', KEYS[1])
  else
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(hh, hl))
  end
end
local count = redis.call('ZCARD', KEYS[1])
local oh, ol = sub(nh, nl, eh, el)
if count == 0 then
  eh, el, oh, ol = nh, nl, 0, 0
elseif lt(4503599, 627370496, oh, ol) then
  local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  local shift = tonumber(all[2])
  for i = 1, #all, 2000 do
    local args = {}
    for j = i, math.min(i + 1999, #all), 2 do
      args[#args + 1] = string.format('%.0f', tonumber(all[j + 1]) - shift)
      args[#args + 1] = all[j]
    end
    redis.call('ZADD', KEYS[1], unpack(args))
  end
  eh, el = add(eh, el, split(shift))
  oh, ol = sub(nh, nl, eh, el)
end
local score = string.format('%.0f', tod(oh, ol))
local ok = 0
if n <= 0 then ok = 1 end
if ARGV[7] == '2' then
  -- Give back: up to n members logged at the instant mark.
  local mh, ml = arg(10)
  if not mh then return redis.error_reply('POPLIMIT bad arguments') end
  local sh, sl = sub(mh, ml, eh, el)
  if n > 0 and count > 0 and sh >= 0 and sh < 9007199 then
    local at = string.format('%.0f', tod(sh, sl))
    local ms = redis.call('ZRANGEBYSCORE', KEYS[1], at, at, 'LIMIT', 0, n)
    if #ms > 0 then
      redis.call('ZREM', KEYS[1], unpack(ms))
      count = count - #ms
    end
  end
  ok, n = 1, 0
end
if n > 0 and (not cond or n <= limit - count) then
  local k = n
  if not cond and count + k > cap then k = math.max(0, cap - count) end
  local done = 0
  while done < k do
    local args = {}
    for _ = 1, math.min(1000, k - done) do
      seq = seq + 1
      args[#args + 1] = score
      args[#args + 1] = string.format('%.0f', seq)
    end
    redis.call('ZADD', KEYS[1], unpack(args))
    done = done + #args / 2
  end
  count = count + k
  ok = 1
end
local release
if n <= 0 or n <= limit - count then
  release = fmt(nh, nl)
elseif n > limit then
  release = 'never'
else
  local e = redis.call('ZRANGE', KEYS[1], count + n - limit - 1, count + n - limit - 1, 'WITHSCORES')
  local ah, al = add(eh, el, split(tonumber(e[2])))
  ah, al = add(ah, al, wh, wl)
  if lt(MAXH, MAXL, ah, al) then ah, al = MAXH, MAXL end
  release = fmt(ah, al)
end
local oldest = false
if count > 0 then
  local e = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  oldest = fmt(add(eh, el, split(tonumber(e[2]))))
  redis.call('PEXPIRE', KEYS[1], ttl)
end
redis.call('HSET', KEYS[2], 'e', fmt(eh, el), 't', fmt(nh, nl), 's', string.format('%.0f', seq))
redis.call('PEXPIRE', KEYS[2], ttl)
return {ok, count, oldest, release}
`

// scriptID names a script; scriptGet is no script but a plain GET.
type scriptID uint8

const (
	scriptCounter scriptID = iota
	scriptGCRA
	scriptSlidingLog
	numScripts
	scriptGet = numScripts
)

// script is one Lua source and its SHA-1, the name EVALSHA calls it by.
type script struct {
	name string // the "script" label
	src  string
	sha  string
}

var scripts = func() [numScripts]script {
	s := [numScripts]script{
		scriptCounter:    {name: "counter", src: luaCounter},
		scriptGCRA:       {name: "gcra", src: luaGCRA},
		scriptSlidingLog: {name: "sliding_log", src: luaSlidingLog},
	}
	for i := range s {
		sum := sha1.Sum([]byte(s[i].src))
		s[i].sha = hex.EncodeToString(sum[:])
	}
	return s
}()
