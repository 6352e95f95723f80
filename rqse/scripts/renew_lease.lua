-- renew_lease.lua: keep a consumer's in-flight entries from looking idle, so
-- that other consumers' XAUTOCLAIM does not take them while process() runs.
--
-- KEYS[1]    the stream
-- ARGV[1]    the consumer group
-- ARGV[2]    the consumer that must still own the entries
-- ARGV[3..]  entry ids (at most a few thousand per call)
--
-- Writes: the group's pending entries list of KEYS[1]: idle time reset by
-- XCLAIM ... JUSTID, which does not count a delivery. Entries another consumer
-- has claimed meanwhile are left alone (checked first, atomically).
-- Returns: the number of entries renewed.

local claim = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], '0'}
local owned = 0
for i = 3, #ARGV do
  local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if pending[1] and pending[1][2] == ARGV[2] then
    claim[#claim + 1] = ARGV[i]
    owned = owned + 1
  end
end
if owned == 0 then
  return 0
end
claim[#claim + 1] = 'JUSTID'
return #redis.call(unpack(claim))
