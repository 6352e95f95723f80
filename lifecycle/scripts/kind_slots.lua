-- kind_slots.lua: the slots of a task kind's concurrency limit (lifecycle/kind_limits.py).
--
-- KEYS[1]  the limits hash        ({flow}:kind-limits: kind -> N)
-- KEYS[2]  the holders            ({flow}:slots:<kind>: member -> lease expiry, ms)
-- KEYS[3]  the waiting line       ({flow}:slot-queue:<kind>: member -> order)
-- KEYS[4]  the waiters' leases    ({flow}:slot-waiting:<kind>: member -> lease expiry, ms)
--
-- ARGV[1]  operation: acquire | take | renew | release | set | remove
-- ARGV[2]  the kind
-- ARGV[3]  the member (task attempt id and holder), or the new limit for 'set'
-- ARGV[4]  the member's order in the line (acquire: from its stream entry id)
-- ARGV[5]  lease, ms
-- ARGV[6]  prefix of the wake-up lists (<prefix><member>), in the same hash tag
-- ARGV[7..] take: the stream entry ids of a batch's tasks; each one's member is
--           <id><ARGV[3]> (ARGV[3]: ' <holder>'), its order ms * 1000 + seq (seq
--           capped at 999, as lifecycle.kind_limits.entry_order); release: more
--           members to release with ARGV[3]
--
-- Writes KEYS[1..4] and the wake-up lists of the waiters it lets in (LPUSH, with a
-- lease-long expiry, so a waiter gone meanwhile leaves nothing behind). The clock is
-- Redis's TIME: hosts with skewed clocks agree on when a lease ends.
--
-- Returns, for acquire: {1, 0} holding a slot, {2, 0} no limit on the kind (nothing
-- held), {0, ms} waiting, ms = when to look again at the latest (the earliest lease
-- end among holders, or the waiter's own lease renewal). renew: 1 still held, 0 lost.
-- take: {ms, flag per entry} (1 holding a slot, 0 waiting in line, ms as for acquire),
-- or {-1} when the kind has no limit. release, set, remove: how many waiters were woken.

local op, kind, member = ARGV[1], ARGV[2], ARGV[3]
local lease = tonumber(ARGV[5])
local wake_prefix = ARGV[6]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Holders and waiters whose lease ended are gone: a crashed worker frees its slot.
local function expire()
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
  if #gone > 0 then
    redis.call('ZREM', KEYS[3], unpack(gone))
    redis.call('ZREM', KEYS[4], unpack(gone))
  end
end

-- Wake the first waiters, as many as there are free slots (every one without a limit);
-- each then acquires in its own call, so the line's order decides who gets in.
local function wake(limit)
  local count
  if limit then
    count = limit - redis.call('ZCARD', KEYS[2])
    if count <= 0 then return 0 end
  else
    count = 0
  end
  local first = redis.call('ZRANGE', KEYS[3], 0, count - 1)
  for _, waiter in ipairs(first) do
    local list = wake_prefix .. waiter
    redis.call('LPUSH', list, '1')
    redis.call('PEXPIRE', list, lease)
  end
  return #first
end

local raw = redis.call('HGET', KEYS[1], kind)
local limit = raw and tonumber(raw)

if op == 'set' then
  redis.call('HSET', KEYS[1], kind, member)
  expire()
  return wake(tonumber(member))
elseif op == 'remove' then
  redis.call('HDEL', KEYS[1], kind)
  return wake(nil)
end

expire()

if op == 'renew' then
  if not redis.call('ZSCORE', KEYS[2], member) then return 0 end
  redis.call('ZADD', KEYS[2], now + lease, member)
  return 1
elseif op == 'release' then
  local members = {member}
  for i = 7, #ARGV do members[#members + 1] = ARGV[i] end
  redis.call('ZREM', KEYS[2], unpack(members))
  -- Nobody in line: none of them is either, and a wake-up list left by an earlier
  -- wait expires on its own.
  if redis.call('ZCARD', KEYS[3]) > 0 or redis.call('ZCARD', KEYS[4]) > 0 then
    local lists = {}
    for i, m in ipairs(members) do lists[i] = wake_prefix .. m end
    redis.call('ZREM', KEYS[3], unpack(members))
    redis.call('ZREM', KEYS[4], unpack(members))
    redis.call('DEL', unpack(lists))
  end
  return wake(limit)
end

-- When to look again at the latest: before the own waiting lease ends (a third of
-- it), or when a holder's ends.
local function again_ms()
  local again = math.floor(lease / 3)
  local earliest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if earliest[2] then
    again = math.min(again, tonumber(earliest[2]) - now + 1)
  end
  return math.max(again, 1)
end

if op == 'take' then
  if not limit then return {-1} end
  local count = #ARGV - 6
  local result = {0}
  local free = limit - redis.call('ZCARD', KEYS[2])
  if free >= count and redis.call('ZCARD', KEYS[3]) == 0 then
    -- Room for all and nobody in line: the common case, one write.
    local hold = {}
    local expires = now + lease
    for i = 1, count do
      hold[2 * i - 1] = expires
      hold[2 * i] = ARGV[6 + i] .. member
      result[i + 1] = 1
    end
    redis.call('ZADD', KEYS[2], unpack(hold))
    return result
  end
  -- Otherwise each in line, and in by its place there, as acquire does.
  local members = {}
  for i = 1, count do
    local id = ARGV[6 + i]
    local m = id .. member
    members[i] = m
    if not redis.call('ZSCORE', KEYS[2], m) then
      -- As a string: Lua would print a number this large in 14 digits only.
      local ms, seq = string.match(id, '^(%d+)-(%d+)$')
      local order = ms and (ms .. string.format('%03d', math.min(tonumber(seq), 999))) or '0'
      redis.call('ZADD', KEYS[3], 'NX', order, m)
    end
  end
  local took = false
  for i = 1, count do
    local m = members[i]
    local rank = redis.call('ZRANK', KEYS[3], m)
    if not rank then  -- held already (a redelivery to us)
      redis.call('ZADD', KEYS[2], now + lease, m)
      result[i + 1] = 1
    elseif rank < limit - redis.call('ZCARD', KEYS[2]) then
      redis.call('ZREM', KEYS[3], m)
      redis.call('ZREM', KEYS[4], m)
      redis.call('ZADD', KEYS[2], now + lease, m)
      result[i + 1] = 1
      took = true
    else
      redis.call('ZADD', KEYS[4], now + lease, m)
      result[i + 1] = 0
    end
  end
  if took then wake(limit) end
  result[1] = again_ms()
  return result
end

-- acquire
if redis.call('ZSCORE', KEYS[2], member) then  -- held already (a redelivery to us)
  redis.call('ZADD', KEYS[2], now + lease, member)
  return {1, 0}
end
if not limit then
  redis.call('ZREM', KEYS[3], member)
  redis.call('ZREM', KEYS[4], member)
  return {2, 0}
end
redis.call('ZADD', KEYS[3], 'NX', ARGV[4], member)
local free = limit - redis.call('ZCARD', KEYS[2])
if free > 0 and redis.call('ZRANK', KEYS[3], member) < free then
  redis.call('ZREM', KEYS[3], member)
  redis.call('ZREM', KEYS[4], member)
  redis.call('ZADD', KEYS[2], now + lease, member)
  wake(limit)  -- slots a lapsed lease freed: the next in line need not wait for a timeout
  return {1, 0}
end
redis.call('ZADD', KEYS[4], now + lease, member)
return {0, again_ms()}
