-- The idempotency index keyed by a hash of (sender, cmid).
--
-- events_by_cmid held each message's conversation key, sender id and
-- cmid: with ids and cmids of 25–36 characters its entries were 56–96
-- bytes, the largest of a message's index entries, and it wrote about a
-- quarter of a send's WAL (docs/operations.md, "Less WAL per send").
-- events_by_cmid_hash holds the conversation key and a 64-bit
-- hash of (sender, cmid) instead: 24-byte entries whatever the ids.
--
-- It is still the unique key that makes a retried send return the
-- original seq: equal (sender, cmid) hash equal, so a retry conflicts
-- with its original, and the original is then found through the same
-- index (hash, then sender and cmid compared). Two different (sender,
-- cmid) of one conversation that hash alike (about once in 2^64 pairs)
-- are told apart the same way: the later message is stored with
-- cmid_collided true, outside the hash index, under
-- events_by_cmid_collided, the exact unique key of those rows, empty in
-- practice (store.InsertMessages, docs/consistency.md).
--
-- parley_cmid_hash is a plain SQL function, inlined wherever it is used,
-- so queries match the index expression. Adding the column rewrites no
-- rows; building the index reads the table once.

CREATE FUNCTION parley_cmid_hash(p_sender text, p_cmid text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT hashtextextended(p_cmid, hashtextextended(p_sender, 0))
$$;

ALTER TABLE events ADD COLUMN cmid_collided boolean;
CREATE UNIQUE INDEX events_by_cmid_hash ON events (conv_key, parley_cmid_hash(sender, cmid))
    WHERE cmid IS NOT NULL AND cmid_collided IS NULL;
CREATE UNIQUE INDEX events_by_cmid_collided ON events (conv_key, sender, cmid) WHERE cmid_collided;
DROP INDEX events_by_cmid;
