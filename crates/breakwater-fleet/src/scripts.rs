//! The Lua scripts: each a compare-and-set or a read-modify-write that
//! must happen as one step on the Redis server. Each comment counts the
//! commands it runs, since `INFO commandstats` counts those too.

/// Compare-and-set of the breaker record, then the record published.
/// KEYS: record. ARGV: expected version as `epoch:generation` ("" for no
/// record), the new record (JSON), the channel. Returns 1 when stored.
/// Commands: GET, and on success SET and PUBLISH. (Epochs stay below 2^53,
/// so Lua's numbers hold them exactly.)
pub const COMPARE_AND_SET: &str = r"
local cur = redis.call('GET', KEYS[1])
local version = ''
if cur then
  local r = cjson.decode(cur)
  version = string.format('%d:%d', r.epoch or 0, r.generation)
end
if version ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[2])
return 1
";

/// A node's beat: its heartbeat stored, the lease taken or renewed when
/// the node wants it and it is free or its own, the record read as a
/// backstop to pub/sub, and for the lease holder every node's beat.
/// KEYS: beats, lease, record. ARGV: node, beat JSON, lease value, lease
/// TTL ms, "1" if the node wants the lease, "1" to store the beat (a node
/// skips it when nothing worth telling changed). Returns {lease value or
/// "", record or "", beats (flat hash) or {}}. Commands: MGET, HSET when
/// the beat is stored; the holder adds SET and HGETALL.
pub const SYNC: &str = r"
if ARGV[6] == '1' then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
local got = redis.call('MGET', KEYS[2], KEYS[3])
local lease = got[1]
local mine = false
if ARGV[5] == '1' then
  if (not lease) or string.sub(lease, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
    redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
    lease = ARGV[3]
    mine = true
  end
end
local beats = {}
if mine then beats = redis.call('HGETALL', KEYS[1]) end
return {lease or '', got[2] or '', beats}
";

/// Gives the lease up if this node holds it. KEYS: lease. ARGV: node.
pub const RELEASE_LEASE: &str = r"
local lease = redis.call('GET', KEYS[1])
if lease and string.sub(lease, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Takes a probe slot of a half-open period if fewer than the limit are
/// held, lapsed slots freed first; times are the Redis server's own, so
/// nodes' clocks do not matter. KEYS: the period's slots, the id counter.
/// ARGV: TTL ms, limit. Returns the slot id, or -1 when all are held.
pub const TAKE_PROBE_SLOT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return -1 end
local id = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), id)
redis.call('PEXPIRE', KEYS[1], 3600000)
return id
";

/// Gives a probe slot back; with the second argument "1" counts a success in the
/// period. KEYS: the period's slots, its success counter. ARGV: slot id,
/// success. Returns the period's successes.
pub const GIVE_BACK_PROBE_SLOT: &str = r"
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  local n = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], 3600000)
  return n
end
return tonumber(redis.call('GET', KEYS[2]) or '0')
";
