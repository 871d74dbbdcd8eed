-- seq_alloc: allocate consecutive seqs of one or more conversations.
-- KEYS[i]  conversation i's seq counter ({conv}-tagged); on Redis Cluster
--          one call's keys must share a hash slot (RunMany sees to it)
-- ARGV[i]  n_i, how many seqs to allocate for KEYS[i] (>= 1)
-- Returns an array with, for each key, the last allocated seq (the first
-- is last - n_i + 1), or -1 when the counter is missing (Redis lost it):
-- the caller re-seeds it from PostgreSQL with seq_floor and tries again.
-- A missing counter is never silently restarted at 1. A key that fails
-- (wrong type) gets its error in its place, and the others still allocate:
-- an error raised midway would keep the seqs already allocated for earlier
-- keys (scripts do not roll back) without telling anyone.
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 0 then
    out[i] = -1
  else
    out[i] = redis.pcall('INCRBY', key, tonumber(ARGV[i]))
  end
end
return out
