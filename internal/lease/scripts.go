package lease

import "github.com/redis/go-redis/v9"

// luaPrelude is shared by every script. now comes from Redis TIME so that
// expiries do not depend on the clocks of the replicas; replicate_commands
// lets Redis versions before 5 accept TIME ahead of writes (it is a no-op
// from Redis 5 on).
const luaPrelude = `
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- purge removes the expired leases and wait entries of one backend and
-- returns how many it removed.
local function purge(lk, wk, ek)
  local n = redis.call('ZREMRANGEBYSCORE', lk, '-inf', now)
  local dead = redis.call('ZRANGEBYSCORE', ek, '-inf', now)
  if #dead > 0 then
    redis.call('ZREM', ek, unpack(dead))
    redis.call('ZREM', wk, unpack(dead))
  end
  return n + #dead
end

-- keep pushes a key's own expiry to at least ms from now, never shortening
-- one set by a replica with a longer TTL, so that no key outlives its
-- members by much and none expires before them.
local function keep(k, ms)
  local p = redis.call('PTTL', k)
  if p ~= -2 and p < ms then
    redis.call('PEXPIRE', k, ms)
  end
end

-- release gives back the lease member of lk and, if anyone waits in wk,
-- tells the replicas that a slot on backend name was freed. It returns 1 if
-- the lease was still there.
local function release(lk, wk, member, ch, name)
  local removed = redis.call('ZREM', lk, member)
  if removed > 0 and redis.call('ZCARD', wk) > 0 then
    redis.call('PUBLISH', ch, name)
  end
  return removed
end

-- waiters reports whether anyone other than member waits in wk.
local function waiters(wk, member)
  local n = redis.call('ZCARD', wk)
  if member and redis.call('ZSCORE', wk, member) then
    n = n - 1
  end
  return n > 0
end
`

// acquireScript first gives back the leases released since the last call
// (Store.ReleaseSoon), then takes a slot on one of the candidates.
//
// KEYS: per candidate i: lease, wait, waitexp; then per lease given back:
// lease, wait; last, the fence (see adoptScript).
// ARGV: 1 wait member, 2 lease member, 3 arrival ms, 4 next arrival ms or
// "0", 5 TTL ms, 6 random number in [0,1), 7 channel, 8 number of leases
// given back (m), then per candidate: name, max, weight; then per lease
// given back: member, backend name.
// Returns the 1-based index of the granted candidate, or 0.
var acquireScript = newScript(luaPrelude + `
local me, lid = ARGV[1], ARGV[2]
local arrival = tonumber(ARGV[3])
local nxt = ARGV[4]
local ttl = tonumber(ARGV[5])
local r = tonumber(ARGV[6])
local ch = ARGV[7]
local m = tonumber(ARGV[8])
local n = (#KEYS - 1 - 2*m) / 3
local exp = now + ttl
-- While a fence stands, nothing new is granted: replicas that served
-- their share without Redis are adopting those slots.
local fence = redis.call('GET', KEYS[#KEYS])
local fenced = fence and tonumber(fence) > now

for j = 1, m do
  release(KEYS[3*n + 2*j - 1], KEYS[3*n + 2*j], ARGV[8 + 3*n + 2*j - 1], ch, ARGV[8 + 3*n + 2*j])
end

-- A call whose reply was lost may be sent again (the client retries once):
-- if it already granted this lease, the answer is that grant again, not a
-- second slot, nor a refusal that would leave the first held by nobody.
local already = 0
for i = 1, n do
  if redis.call('ZSCORE', KEYS[3*i-2], lid) then
    already = i
  end
end

local freed = {}   -- candidate i freed capacity that others may wait for
local had = {}     -- our wait entry's arrival before this call, or false
local bestLoad = nil
local tied = {}
for i = 1, n do
  local lk, wk, ek = KEYS[3*i-2], KEYS[3*i-1], KEYS[3*i]
  freed[i] = purge(lk, wk, ek) > 0
  local mine = redis.call('ZSCORE', wk, me)
  had[i] = mine and tonumber(mine) or false
  local held = redis.call('ZCARD', lk)
  -- Slots owed to queues that have waited longer than this request.
  local ahead = redis.call('ZCOUNT', wk, '-inf', '(' .. ARGV[3])
  if had[i] and had[i] < arrival then
    ahead = ahead - 1
  end
  local max = tonumber(ARGV[8 + 3*i - 1])
  local w = tonumber(ARGV[8 + 3*i])
  if already == 0 and not fenced and max - held - ahead > 0 then
    local load = held / (max * w)
    if bestLoad == nil or load < bestLoad - 1e-12 then
      bestLoad = load
      tied = {i}
    elseif load <= bestLoad + 1e-12 then
      tied[#tied + 1] = i
    end
  end
end

local chosen = already
if already > 0 then
  redis.call('ZADD', KEYS[3*chosen-2], exp, lid)
elseif #tied > 0 then
  local sum = 0
  for _, i in ipairs(tied) do
    sum = sum + tonumber(ARGV[8 + 3*i])
  end
  local x = r * sum
  chosen = tied[#tied]
  for _, i in ipairs(tied) do
    x = x - tonumber(ARGV[8 + 3*i])
    if x < 0 then
      chosen = i
      break
    end
  end
  redis.call('ZADD', KEYS[3*chosen-2], exp, lid)
  keep(KEYS[3*chosen-2], 2 * ttl)
end

for i = 1, n do
  local wk, ek = KEYS[3*i-1], KEYS[3*i]
  if chosen == 0 then
    redis.call('ZADD', wk, ARGV[3], me)
    redis.call('ZADD', ek, exp, me)
    keep(wk, 2 * ttl)
    keep(ek, 2 * ttl)
  elseif nxt ~= '0' then
    redis.call('ZADD', wk, nxt, me)
    redis.call('ZADD', ek, exp, me)
    keep(wk, 2 * ttl)
    keep(ek, 2 * ttl)
    -- Moving our entry later frees a slot owed to us on the candidates we
    -- did not take.
    if i ~= chosen and had[i] and had[i] < tonumber(nxt) then
      freed[i] = true
    end
  elseif had[i] then
    redis.call('ZREM', wk, me)
    redis.call('ZREM', ek, me)
    if i ~= chosen then
      freed[i] = true
    end
  end
  if freed[i] and waiters(wk, me) then
    redis.call('PUBLISH', ch, ARGV[8 + 3*i - 2])
  end
end
return chosen
`)

// releaseScript gives leases back.
//
// KEYS: per lease: lease, wait. ARGV: 1 channel, then per lease: member,
// backend name.
// Returns how many of the leases were still there.
var releaseScript = newScript(luaPrelude + `
local removed = 0
for j = 1, #KEYS / 2 do
  removed = removed + release(KEYS[2*j-1], KEYS[2*j], ARGV[2*j], ARGV[1], ARGV[2*j+1])
end
return removed
`)

// clearScript removes one queue's wait entries.
//
// KEYS: per backend: wait, waitexp. ARGV: 1 wait member, 2 channel, then
// the backend names.
var clearScript = newScript(`
local me, ch = ARGV[1], ARGV[2]
for i = 1, #KEYS / 2 do
  local wk, ek = KEYS[2*i-1], KEYS[2*i]
  redis.call('ZREM', ek, me)
  if redis.call('ZREM', wk, me) > 0 and redis.call('ZCARD', wk) > 0 then
    redis.call('PUBLISH', ch, ARGV[2 + i])
  end
end
return 0
`)

// renewScript keeps one replica's state alive; see Store.renew for the
// argument layout, which leaveScript shares.
//
// KEYS: 1 replicas, then per backend: lease, wait, waitexp.
// ARGV: 1 replica, 2 TTL ms, 3 channel, then per backend: name, then three
// counted lists (count, members...): leases to extend, wait members to
// extend, leases to delete.
// Returns {live replicas, {1-based positions of the items that were gone}},
// positions counting leases and wait members in order across backends; a
// lease that was gone is added again, a wait entry is not.
var renewScript = newScript(luaPrelude + `
local ttl = tonumber(ARGV[2])
local ch = ARGV[3]
local exp = now + ttl
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], exp, ARGV[1])
keep(KEYS[1], 2 * ttl)
local live = redis.call('ZCARD', KEYS[1])

local lost = {}
local pos = 0
local p = 4
for j = 1, (#KEYS - 1) / 3 do
  local lk, wk, ek = KEYS[3*j-1], KEYS[3*j], KEYS[3*j+1]
  local name = ARGV[p]
  p = p + 1
  local freed = purge(lk, wk, ek) > 0
  local nl = tonumber(ARGV[p])
  p = p + 1
  for k = 1, nl do
    pos = pos + 1
    local m = ARGV[p]
    p = p + 1
    -- A lease found gone (it expired while this replica could not renew
    -- it, or Redis lost its data) still has its request running: it is
    -- counted again, so that nothing more is granted on top of it. Its
    -- slot may meanwhile be someone else's; the backend is then over its
    -- limit until one of them ends, but not further.
    if not redis.call('ZSCORE', lk, m) then
      lost[#lost + 1] = pos
    end
    redis.call('ZADD', lk, exp, m)
  end
  if nl > 0 then keep(lk, 2 * ttl) end
  local nw = tonumber(ARGV[p])
  p = p + 1
  for k = 1, nw do
    pos = pos + 1
    local m = ARGV[p]
    p = p + 1
    if redis.call('ZSCORE', ek, m) then
      redis.call('ZADD', ek, exp, m)
    else
      lost[#lost + 1] = pos
    end
  end
  if nw > 0 then
    keep(wk, 2 * ttl)
    keep(ek, 2 * ttl)
  end
  local no = tonumber(ARGV[p])
  p = p + 1
  for k = 1, no do
    if redis.call('ZREM', lk, ARGV[p]) > 0 then
      freed = true
    end
    p = p + 1
  end
  if freed and waiters(wk, nil) then
    redis.call('PUBLISH', ch, name)
  end
end
return {live, lost}
`)

// leaveScript removes everything one replica holds: its liveness, the
// listed leases and wait entries. Same KEYS and ARGV as renewScript (the
// third list, leases to delete, is deleted like the first).
var leaveScript = newScript(`
local ch = ARGV[3]
redis.call('ZREM', KEYS[1], ARGV[1])
local p = 4
for j = 1, (#KEYS - 1) / 3 do
  local lk, wk, ek = KEYS[3*j-1], KEYS[3*j], KEYS[3*j+1]
  local name = ARGV[p]
  p = p + 1
  local freed = false
  for list = 1, 3 do
    local c = tonumber(ARGV[p])
    p = p + 1
    for k = 1, c do
      local m = ARGV[p]
      p = p + 1
      if list == 2 then
        redis.call('ZREM', ek, m)
        if redis.call('ZREM', wk, m) > 0 then freed = true end
      elseif redis.call('ZREM', lk, m) > 0 then
        freed = true
      end
    end
  end
  if freed and redis.call('ZCARD', wk) > 0 then
    redis.call('PUBLISH', ch, name)
  end
end
return 0
`)

// adoptScript adds leases whatever a backend holds already, for slots a
// replica handed out while it could not reach Redis (their requests run
// anyway: now they are counted), and raises the fence, which holds back
// every grant until it expires, so that the other replicas that served
// their share meanwhile adopt theirs before anything is granted on top.
//
// KEYS: 1 fence, then per backend: lease. ARGV: 1 TTL ms, 2 fence ms, then
// per backend: count, members.
var adoptScript = newScript(luaPrelude + `
local ttl = tonumber(ARGV[1])
local fence = tonumber(ARGV[2])
local exp = now + ttl
-- The fence holds its end (ms, Redis clock) and expires a little later.
local till = now + fence
if fence > 0 and till > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], till, 'PX', fence + 1000)
end
local p = 3
for j = 2, #KEYS do
  local c = tonumber(ARGV[p])
  p = p + 1
  for k = 1, c do
    redis.call('ZADD', KEYS[j], exp, ARGV[p])
    p = p + 1
  end
  if c > 0 then keep(KEYS[j], 2 * ttl) end
end
return 0
`)

// countScript counts the live leases of one backend. KEYS: lease.
var countScript = newScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
`)

// sources holds every script's text, for Store.loadScripts: the scripts
// are loaded together when the store starts, so that the first call of each
// is an EVALSHA like every other; after a Redis restart, Script.Run falls
// back to EVAL once, which caches the script again.
var sources []string

func newScript(src string) *redis.Script {
	sources = append(sources, src)
	return redis.NewScript(src)
}
