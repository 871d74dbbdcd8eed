-- Events keyed by an integer conversation key, and one index fewer.
--
-- A message row cost about 870 bytes of WAL: its heap tuple and three
-- btree entries (the primary key, events_by_cmid and events_by_sender),
-- each repeating the conversation's text id, and their page splits. Here:
--   * conversations get conv_key, a bigint assigned once when the
--     conversation is created; events hold it instead of conv_id (8 bytes
--     instead of the id's length plus header, in the heap and every index);
--   * events_by_sender is gone. It served counting one's own messages in
--     the two partial own-message buckets at the ends of an unread range
--     (0004); with buckets of 64 seqs instead of 256 those ends are at most
--     32 seqs each, counted on the primary key. (Buckets of 32 seqs made
--     a page of 100 conversations with 10,000 unread messages each sum
--     five times as many bucket rows, and took about twice as long.)
-- Measured with 100-byte bodies and 50-row commits over 200 to 5,000
-- conversations: about 700 bytes of WAL per row before, 440 to 465 after.
-- The columns are laid out widest first so the tuple carries no padding.

ALTER TABLE conversations ADD COLUMN conv_key bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE conversations ADD CONSTRAINT conversations_conv_key UNIQUE (conv_key);

CREATE TABLE events_keyed (
    conv_key    bigint NOT NULL,
    seq         bigint NOT NULL,
    ts          bigint NOT NULL,
    recalled_by bigint,
    target      bigint,
    kind        smallint NOT NULL,
    sender      text NOT NULL DEFAULT '',
    cmid        text,
    body        bytea,
    users       text[]
);
INSERT INTO events_keyed (conv_key, seq, ts, recalled_by, target, kind, sender, cmid, body, users)
SELECT c.conv_key, e.seq, e.ts, e.recalled_by, e.target, e.kind, e.sender, e.cmid, e.body, e.users
  FROM events e JOIN conversations c ON c.conv_id = e.conv_id;
DROP TABLE events;
ALTER TABLE events_keyed RENAME TO events;
ALTER TABLE events ADD CONSTRAINT events_pkey PRIMARY KEY (conv_key, seq);
CREATE UNIQUE INDEX events_by_cmid ON events (conv_key, sender, cmid) WHERE cmid IS NOT NULL;
CREATE INDEX events_not_counted ON events (conv_key, seq) WHERE kind <> 1 OR recalled_by IS NOT NULL;

-- Buckets of 64 seqs, recounted.
UPDATE unread_settings SET bucket_bits = 6;
TRUNCATE own_msg_buckets;
INSERT INTO own_msg_buckets (conv_id, sender, bucket, n)
SELECT c.conv_id, e.sender, e.seq >> s.bucket_bits, count(*)
  FROM events e JOIN conversations c ON c.conv_key = e.conv_key, unread_settings s
 WHERE e.seq <= c.dense_seq AND e.kind = 1 AND e.recalled_by IS NULL
 GROUP BY 1, 2, 3;

-- parley_unread_of (0005) on conv_key. The own messages at the ends of a
-- range (lc, hc) are now counted on the primary key.
CREATE OR REPLACE FUNCTION parley_unread_of(p_conv text, p_user text, p_read bigint) RETURNS TABLE (unread bigint)
LANGUAGE sql STABLE ROWS 1 AS $$
SELECT coalesce(sum(
         CASE WHEN r.mid > r.lo
              THEN (r.mid - r.lo) - nc.n
                 - CASE WHEN r.multi
                        THEN bk.whole
                           + CASE WHEN r.l_direct THEN lc.n ELSE coalesce(bk.n_a, 0) - lc.n END
                           + CASE WHEN r.h_direct THEN hc.n ELSE coalesce(bk.n_h, 0) - hc.n END
                        ELSE lc.n END
              ELSE 0 END
       + top.n), 0)::bigint
  FROM (SELECT (SELECT coalesce(max(e.seq), 0) FROM events e WHERE e.conv_key = c.conv_key) AS head,
               coalesce(c.dense_seq, 0) AS w,
               (SELECT bucket_bits FROM unread_settings) AS bits, c.conv_key AS k
          FROM (SELECT NULL) one LEFT JOIN conversations c ON c.conv_id = p_conv
        OFFSET 0) h
  JOIN membership_periods m ON m.conv_id = p_conv AND m.user_id = p_user AND coalesce(m.to_seq, h.head) > p_read
  CROSS JOIN LATERAL (
        SELECT x.lo, x.hi, x.mid, h.w, h.bits,
               x.lo + 1 AS a, (x.lo + 1) >> h.bits AS ba, x.mid >> h.bits AS bh, 1::bigint << h.bits AS size,
               x.mid > x.lo AND (x.mid >> h.bits) - ((x.lo + 1) >> h.bits) > 1 AS multi
          FROM (SELECT y.lo, y.hi, least(y.hi, greatest(y.lo, h.w)) AS mid
                  FROM (SELECT greatest(p_read, m.from_seq - 1) AS lo, least(coalesce(m.to_seq, h.head), h.head) AS hi) y) x
         WHERE x.hi > x.lo OFFSET 0) r0
  CROSS JOIN LATERAL (
        SELECT r0.*,
               (r0.ba + 1) * r0.size - 1 - r0.a < r0.a - r0.ba * r0.size AS l_direct,
               r0.mid - r0.bh * r0.size < least(r0.bh * r0.size + r0.size - 1, r0.w) - r0.mid AS h_direct OFFSET 0) r1
  CROSS JOIN LATERAL (
        SELECT r1.*,
               -- own messages counted at the low end: the range itself if
               -- it spans at most two buckets, else a's partial bucket
               CASE WHEN NOT r1.multi THEN r1.a WHEN r1.l_direct THEN r1.a ELSE r1.ba * r1.size END AS lx,
               CASE WHEN NOT r1.multi THEN r1.mid WHEN r1.l_direct THEN (r1.ba + 1) * r1.size - 1 ELSE r1.a - 1 END AS ly,
               -- and at the high end (nothing unless multi)
               CASE WHEN NOT r1.multi THEN 1 WHEN r1.h_direct THEN r1.bh * r1.size ELSE r1.mid + 1 END AS hx,
               CASE WHEN NOT r1.multi THEN 0 WHEN r1.h_direct THEN r1.mid
                    ELSE least(r1.bh * r1.size + r1.size - 1, r1.w) END AS hy OFFSET 0) r
  CROSS JOIN LATERAL (SELECT count(*) AS n FROM events e
                       WHERE e.conv_key = h.k AND e.seq > r.lo AND e.seq <= r.mid
                         AND (e.kind <> 1 OR e.recalled_by IS NOT NULL)) nc
  CROSS JOIN LATERAL (SELECT count(*) AS n FROM events e
                       WHERE e.conv_key = h.k AND e.sender = p_user AND e.seq >= r.lx AND e.seq <= r.ly
                         AND e.kind = 1 AND e.recalled_by IS NULL) lc
  CROSS JOIN LATERAL (SELECT count(*) AS n FROM events e
                       WHERE e.conv_key = h.k AND e.sender = p_user AND e.seq >= r.hx AND e.seq <= r.hy
                         AND e.kind = 1 AND e.recalled_by IS NULL) hc
  CROSS JOIN LATERAL (SELECT coalesce(sum(b.n) FILTER (WHERE b.bucket > r.ba AND b.bucket < r.bh), 0) AS whole,
                             max(b.n) FILTER (WHERE b.bucket = r.ba) AS n_a,
                             max(b.n) FILTER (WHERE b.bucket = r.bh) AS n_h
                        FROM own_msg_buckets b
                       WHERE r.multi AND b.conv_id = p_conv AND b.sender = p_user
                         AND b.bucket >= r.ba AND b.bucket <= r.bh) bk
  CROSS JOIN LATERAL (SELECT count(*) AS n FROM events e
                       WHERE e.conv_key = h.k AND e.seq > r.mid AND e.seq <= r.hi
                         AND e.kind = 1 AND e.recalled_by IS NULL AND e.sender <> p_user) top
$$;
