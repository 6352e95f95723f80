-- start_once.lua: start a workflow under a chosen id only if the id is free.
--
-- KEYS[1]  the workflows index ({flow}:workflows)
-- KEYS[2]  the lifecycle stream ({flow}:lifecycle)
-- ARGV[1]  the workflow id
-- ARGV[2]  now (ms): its place in the index until the lifecycle records its creation
-- ARGV[3…] the start-workflow's fields and values
--
-- The index entry is the claim: two `run --id X` at once, or one while the first
-- start still waits in the stream, cannot both send a start. Returns 1 when the
-- start was sent, 0 when the id was taken (nothing sent).

if redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1]) == 0 then
  return 0
end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
return 1
