-- attempt_state.lua: is a task attempt still wanted? (Task.cancelled)
--
-- KEYS[1]  the workflow hash ({flow}:wf:<id>); reads field 's' (machine state JSON),
--          and 'r:<key>' when the state is chunked (its core has 'live': each running
--          instance's attempt is a field of its own, lifecycle/stored_state.py)
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
local attempt
if state['live'] ~= nil then
  attempt = redis.call('HGET', KEYS[1], 'r:' .. ARGV[1])
else
  local running = state['running']
  attempt = type(running) == 'table' and running[ARGV[1]] or nil
end
if not attempt or tostring(attempt) ~= ARGV[2] then return 'replaced' end
return status
