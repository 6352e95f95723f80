-- attempt_state.lua: is a task attempt still wanted? (Task.cancelled)
--
-- KEYS[1]  the workflow hash ({flow}:wf:<id>); reads field 's' (machine state JSON)
-- ARGV[1]  the node instance key ('' = do not check the attempt)
-- ARGV[2]  the attempt number ('' = do not check the attempt)
--
-- Decoded here rather than in the worker so that only a short answer crosses
-- the network, whatever the size of the state. Writes nothing. Returns the
-- workflow status ('running', 'finished', 'failed', 'terminated'), 'missing'
-- when there is no such workflow, or 'replaced' when the workflow runs but
-- this attempt is no longer its running one (timed out, retried).

local raw = redis.call('HGET', KEYS[1], 's')
if not raw then return 'missing' end
local state = cjson.decode(raw)
local status = state['status'] or 'running'
if status ~= 'running' or ARGV[1] == '' or ARGV[2] == '' then return status end
local running = state['running']
if type(running) ~= 'table' or tostring(running[ARGV[1]]) ~= ARGV[2] then
  return 'replaced'
end
return status
