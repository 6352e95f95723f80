-- requeue_dead_letter.lua: deliver a dead letter's original entry to its stream again,
-- once: the dead letter is removed in the same step, so a second requeue of it (a
-- double click, two operators) finds nothing and adds nothing.
--
-- KEYS[1]    the dead-letter stream (<stream>:dead)
-- KEYS[2]    the original stream
-- ARGV[1]    the dead letter's entry id
-- ARGV[2..]  the original entry's fields: name, value, name, value, ...
--
-- Writes: XADD KEYS[2] (a new entry, so every group reads it as new); XDEL KEYS[1].
-- Returns: the new entry's id, or false (nil) when the dead letter is no longer there.

if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return false
end
local add = {'XADD', KEYS[2], '*'}
for i = 2, #ARGV do
  add[#add + 1] = ARGV[i]
end
local id = redis.call(unpack(add))
redis.call('XDEL', KEYS[1], ARGV[1])
return id
