package budget

import "github.com/redis/go-redis/v9"

// Every script takes four keys per window, in this order (see keysOf):
//
//	spent  string: nano-units settled in the window; absent until built from the database
//	res    hash: reservation id → amount
//	dl     sorted set: reservation id → deadline (unix ms, the replicas' clock)
//	rsum   string: Σ res, so that a check reads one key rather than the hash
//
// Amounts travel as decimal strings and are written with INCRBY/DECRBY,
// which are exact in 64 bits; only the comparison goes through Lua's
// doubles, exact below 2⁵³ nano-units (some 9 million currency units).
const luaPrelude = `
-- tidy deletes a window's reservation keys once purging left none.
local function tidy(res, dl, rsum)
  if redis.call('HLEN', res) == 0 then
    redis.call('DEL', res, dl, rsum)
  end
end

-- purge removes the reservations whose deadline is at or before now: their
-- requests ended without a settle (a replica died, a settle failed).
local function purge(res, dl, rsum, now)
  local any = false
  while true do
    local dead = redis.call('ZRANGEBYSCORE', dl, '-inf', now, 'LIMIT', 0, 256)
    if #dead == 0 then break end
    any = true
    for _, m in ipairs(dead) do
      local a = redis.call('HGET', res, m)
      if a then
        redis.call('HDEL', res, m)
        redis.call('DECRBY', rsum, a)
      end
    end
    redis.call('ZREM', dl, unpack(dead))
    if #dead < 256 then break end
  end
  if any then tidy(res, dl, rsum) end
end

-- keep makes a window's reservation keys live at least ms from now. They
-- stay between requests (a settle does not delete them), so one PTTL a
-- request tells that their expiry holds; it is pushed only once it has
-- fallen below half of ms.
local function keep(res, dl, rsum, ms)
  if ms <= 0 then return end
  local p = redis.call('PTTL', rsum)
  if p ~= -2 and p < ms / 2 or p == -1 then
    redis.call('PEXPIRE', res, ms)
    redis.call('PEXPIRE', dl, ms)
    redis.call('PEXPIRE', rsum, ms)
  end
end

-- missing lists the windows whose spent is absent (1-based).
local function missing(n)
  local m = {}
  for i = 1, n do
    if redis.call('EXISTS', KEYS[4*i-3]) == 0 then m[#m + 1] = i end
  end
  return m
end
`

// reserveScript checks every window and reserves on all of them or none.
//
// ARGV: 1 id, 2 amount, 3 now ms, 4 deadline ms, then per window: limit,
// ms to keep its reservation keys.
// Returns {0} when reserved; {1, i...} when windows i have no spent
// (nothing done); {2, i, spent, reserved} when window i is the first that
// does not fit.
var reserveScript = redis.NewScript(luaPrelude + `
local id, amount, now, deadline = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = #KEYS / 4
local m = missing(n)
if #m > 0 then return {1, unpack(m)} end

for i = 1, n do
  purge(KEYS[4*i-2], KEYS[4*i-1], KEYS[4*i], now)
end
-- An amount of 0 always fits, even a budget that is spent or 0.
local want = tonumber(amount)
if want > 0 then
  for i = 1, n do
    local spent = redis.call('GET', KEYS[4*i-3])
    local reserved = redis.call('GET', KEYS[4*i]) or '0'
    if tonumber(spent) + tonumber(reserved) + want > tonumber(ARGV[3 + 2*i]) then
      return {2, i, spent, reserved}
    end
  end
end

for i = 1, n do
  local res, dl, rsum = KEYS[4*i-2], KEYS[4*i-1], KEYS[4*i]
  -- The same id again replaces its reservation rather than adding to it.
  local old = redis.call('HGET', res, id)
  if old then redis.call('DECRBY', rsum, old) end
  redis.call('HSET', res, id, amount)
  redis.call('ZADD', dl, deadline, id)
  redis.call('INCRBY', rsum, amount)
  keep(res, dl, rsum, tonumber(ARGV[4 + 2*i]))
end
return {0}
`)

// settleScript replaces a reservation by the request's cost.
//
// ARGV: 1 id, 2 cost. A window whose spent is absent stays so: it will be
// built from the database, which will have this request's row.
var settleScript = redis.NewScript(luaPrelude + `
local id, cost = ARGV[1], ARGV[2]
for i = 1, #KEYS / 4 do
  local spent, res, dl, rsum = KEYS[4*i-3], KEYS[4*i-2], KEYS[4*i-1], KEYS[4*i]
  local a = redis.call('HGET', res, id)
  if a then
    redis.call('HDEL', res, id)
    redis.call('ZREM', dl, id)
    redis.call('DECRBY', rsum, a)
  end
  if cost ~= '0' and redis.call('EXISTS', spent) == 1 then
    redis.call('INCRBY', spent, cost)
  end
end
return 0
`)

// statusScript reads every window after purging its lapsed reservations.
//
// ARGV: 1 now ms. Returns {1, i...} as reserveScript, or {0, spent1,
// reserved1, spent2, reserved2, ...}.
var statusScript = redis.NewScript(luaPrelude + `
local n = #KEYS / 4
local m = missing(n)
if #m > 0 then return {1, unpack(m)} end
local out = {0}
for i = 1, n do
  purge(KEYS[4*i-2], KEYS[4*i-1], KEYS[4*i], ARGV[1])
  out[#out + 1] = redis.call('GET', KEYS[4*i-3])
  out[#out + 1] = redis.call('GET', KEYS[4*i]) or '0'
end
return out
`)
