-- kind_slots.lua: the slots of a task kind's concurrency limit (lifecycle/kind_limits.py).
--
-- KEYS[1]  the holders            ({flow}:slots:<kind>: member -> lease expiry, ms)
-- KEYS[2]  the waiting line       ({flow}:slot-queue:<kind>: member -> order)
-- KEYS[3]  the waiters' leases    ({flow}:slot-waiting:<kind>: member -> lease expiry, ms)
-- KEYS[4]  the batch holders      ({flow}:slot-batches:<kind>, a sorted set: member ->
--                                  slots it holds, 2 or more; member '+': the sum of
--                                  (slots - 1) of them. Sorted-set commands only: the
--                                  workers' ACL has no hash writes)
--
-- ARGV[1]  operation: acquire | take | renew | give | release | set | remove
-- ARGV[2]  the kind
-- ARGV[3]  the member (a task's stream entry id and its holder), the new limit for
--          'set', or for 'take' the holder's part of a member (' <holder>')
-- ARGV[4]  acquire: the member's order in the line (from its stream entry id);
--          give: how many of the member's slots it gives back; take: the batch's size
-- ARGV[5]  lease, ms
-- ARGV[6]  prefix of the wake-up lists (<prefix><member>), in the same hash tag
-- ARGV[7]  the limits hash ({flow}:kind-limits: kind -> N), in the same hash tag. Named
--          here, not among KEYS: a key given to EVAL needs write access in the ACL,
--          and workers may only read it (only set and remove, an administrator's, write)
-- ARGV[8..] take: the stream entry ids of a batch's tasks, the first alone or all of
--           them (a task's member is <name><ARGV[3]>, its name the id with the sequence
--           zero-padded to 20 digits, its order in line the id's millisecond: as
--           lifecycle.kind_limits.slot_name and entry_order); release: more members
--
-- A holder holds one slot, or a whole batch's: the member of a batch's first task
-- then holds as many slots as the batch has tasks, counted in KEYS[4]. Slots in use:
-- ZCARD of the holders plus KEYS[4]'s '+'.
--
-- Writes KEYS[1..4], the limits hash (set, remove) and the wake-up lists of the
-- waiters it lets in (LPUSH, with a lease-long expiry, so a waiter gone meanwhile
-- leaves nothing behind). The clock is Redis's TIME: hosts with skewed clocks agree on
-- when a lease ends.
--
-- Returns, for acquire: {1, 0} holding a slot, {2, 0} no limit on the kind (nothing
-- held), {0, ms} waiting, ms = when to look again at the latest (the earliest lease
-- end among holders, or the waiter's own lease renewal). renew: 1 still held, 0 lost.
-- take: {0} every task of the batch holds a slot, under the first one's member;
-- {ms, flag per task} each its own (1 holding a slot, 0 waiting in line, ms as for
-- acquire); {-2} not every one could, and only the first id was given: call again
-- with them all; {-1} the kind has no limit. give, release, set, remove: how many waiters
-- were woken.

local op, kind, member = ARGV[1], ARGV[2], ARGV[3]
local lease = tonumber(ARGV[5])
local wake_prefix = ARGV[6]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function used()
  return redis.call('ZCARD', KEYS[1]) + tonumber(redis.call('ZSCORE', KEYS[4], '+') or 0)
end

-- Batch holders' extra slots: the sum goes up or down by `by`, gone at zero.
local function add_extra(by)
  if tonumber(redis.call('ZADD', KEYS[4], 'INCR', by, '+')) <= 0 then
    redis.call('ZREM', KEYS[4], '+')
  end
end

-- `command key item...` for every item, a thousand at a time (unpack has a limit).
local function each(command, key, items)
  for i = 1, #items, 1000 do
    redis.call(command, key, unpack(items, i, math.min(i + 999, #items)))
  end
end

-- Holders gone, with every slot they held.
local function drop(members)
  local batches, extra = {}, 0
  if redis.call('EXISTS', KEYS[4]) == 1 then
    for _, m in ipairs(members) do
      local count = redis.call('ZSCORE', KEYS[4], m)
      if count then
        batches[#batches + 1] = m
        extra = extra + tonumber(count) - 1
      end
    end
  end
  if #batches > 0 then
    each('ZREM', KEYS[4], batches)
    add_extra(-extra)
  end
  each('ZREM', KEYS[1], members)
end

-- Holders and waiters whose lease ended are gone: a crashed worker frees its slots.
local function expire()
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  if #lapsed > 0 then drop(lapsed) end
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  if #gone > 0 then
    each('ZREM', KEYS[2], gone)
    each('ZREM', KEYS[3], gone)
  end
end

-- Wake the first waiters, as many as there are free slots (every one without a limit);
-- each then acquires in its own call, so the line's order decides who gets in.
local function wake(limit)
  local count
  if limit then
    count = limit - used()
    if count <= 0 then return 0 end
  else
    count = 0
  end
  local first = redis.call('ZRANGE', KEYS[2], 0, count - 1)
  for _, waiter in ipairs(first) do
    local list = wake_prefix .. waiter
    redis.call('LPUSH', list, '1')
    redis.call('PEXPIRE', list, lease)
  end
  return #first
end

-- When to look again at the latest: before the own waiting lease ends (a third of
-- it), or when a holder's ends.
local function again_ms()
  local again = math.floor(lease / 3)
  local earliest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if earliest[2] then
    again = math.min(again, tonumber(earliest[2]) - now + 1)
  end
  return math.max(again, 1)
end

-- A task's name and order in line, from its stream entry id: names of one millisecond
-- sort as the stream does (the order, a score, ties by name).
local function named(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if not ms then return id, '0' end
  return ms .. '-' .. string.rep('0', 20 - #seq) .. seq, ms
end

local function the_limit()
  local raw = redis.call('HGET', ARGV[7], kind)
  return raw and tonumber(raw)
end

if op == 'set' then
  redis.call('HSET', ARGV[7], kind, member)
  expire()
  return wake(tonumber(member))
elseif op == 'remove' then
  redis.call('HDEL', ARGV[7], kind)
  return wake(nil)
elseif op == 'renew' then
  if not redis.call('ZSCORE', KEYS[1], member) then return 0 end
  redis.call('ZADD', KEYS[1], now + lease, member)
  return 1
elseif op == 'release' then
  -- What lapsed is cleared by those who take: a release only gives back its own.
  local members = {member}
  for i = 8, #ARGV do members[#members + 1] = ARGV[i] end
  drop(members)
  -- Nobody in line: none of them is either, there is nobody to wake, and a wake-up
  -- list left by an earlier wait expires on its own.
  if redis.call('ZCARD', KEYS[2]) == 0 then return 0 end
  each('ZREM', KEYS[2], members)
  each('ZREM', KEYS[3], members)
  for _, m in ipairs(members) do redis.call('DEL', wake_prefix .. m) end
  return wake(the_limit())
elseif op == 'give' then
  if redis.call('ZSCORE', KEYS[1], member) then
    local held = tonumber(redis.call('ZSCORE', KEYS[4], member) or 1)
    local left = held - tonumber(ARGV[4])
    if left <= 0 then
      drop({member})
    else
      if left == 1 then
        redis.call('ZREM', KEYS[4], member)
      else
        redis.call('ZADD', KEYS[4], left, member)
      end
      add_extra(left - held)
    end
  end
  if redis.call('ZCARD', KEYS[2]) == 0 then return 0 end
  return wake(the_limit())
end

local limit = the_limit()
expire()

if op == 'take' then
  if not limit then return {-1} end
  local count = tonumber(ARGV[4])
  local first = named(ARGV[8]) .. member
  if redis.call('ZSCORE', KEYS[1], first) then drop({first}) end  -- the batch again: anew
  if limit - used() >= count and redis.call('ZCARD', KEYS[2]) == 0 then
    -- Room for all and nobody in line, the common case: one holder for the batch.
    redis.call('ZADD', KEYS[1], now + lease, first)
    if count > 1 then
      redis.call('ZADD', KEYS[4], count, first)
      add_extra(count - 1)
    end
    return {0}
  end
  if #ARGV - 7 < count then return {-2} end  -- each needs its own: their ids, please
  -- Otherwise one at a time, in batch order, each in by its place in line as acquire
  -- would, until one has to wait: that one and the later ones join the line when their
  -- turn comes (acquire), at the place their ids give them. So the tasks holding slots
  -- are the first of the batch, and no slot waits for one of its tasks in line behind
  -- those it runs first.
  local result, took = {0}, false
  for i = 1, count do
    local name, ms = named(ARGV[7 + i])
    local m = name .. member
    if redis.call('ZSCORE', KEYS[1], m) then  -- held already (a redelivery to us)
      redis.call('ZADD', KEYS[1], now + lease, m)
      result[i + 1] = 1
    else
      local added = redis.call('ZADD', KEYS[2], 'NX', ms, m)
      if redis.call('ZRANK', KEYS[2], m) < limit - used() then
        redis.call('ZREM', KEYS[2], m)
        redis.call('ZREM', KEYS[3], m)
        redis.call('ZADD', KEYS[1], now + lease, m)
        result[i + 1] = 1
        took = true
      else
        if added == 1 then redis.call('ZREM', KEYS[2], m) end
        for j = i, count do result[j + 1] = 0 end
        break
      end
    end
  end
  if took then wake(limit) end
  result[1] = again_ms()
  return result
end

-- acquire
if redis.call('ZSCORE', KEYS[1], member) then  -- held already (a redelivery to us)
  redis.call('ZADD', KEYS[1], now + lease, member)
  return {1, 0}
end
if not limit then
  redis.call('ZREM', KEYS[2], member)
  redis.call('ZREM', KEYS[3], member)
  return {2, 0}
end
redis.call('ZADD', KEYS[2], 'NX', ARGV[4], member)
local free = limit - used()
if free > 0 and redis.call('ZRANK', KEYS[2], member) < free then
  redis.call('ZREM', KEYS[2], member)
  redis.call('ZREM', KEYS[3], member)
  redis.call('ZADD', KEYS[1], now + lease, member)
  wake(limit)  -- slots a lapsed lease freed: the next in line need not wait for a timeout
  return {1, 0}
end
redis.call('ZADD', KEYS[3], now + lease, member)
return {0, again_ms()}
