-- Own messages without counting them one by one.
--
-- Below dense_seq, unread(lo, hi] = (hi - lo) - non-msg or recalled rows
-- - the user's own messages (0003). The first two are rare and counted on
-- their partial index. Own messages are not rare (a tenth of a chat is
-- typical), and counting them entry by entry cost most of a convs page:
-- 1,000 index entries for a 10,000-message unread range.
--
-- own_msg_buckets(conv, sender, bucket) holds how many of sender's
-- not-recalled messages in conv have seq >> bucket_bits = bucket and
-- seq <= the conversation's dense_seq. It is maintained in the same
-- transactions that change what it counts, so it is exact, not a counter
-- that can drift:
--   * AdvanceDense locks the conversation rows, then, in one statement,
--     adds the messages of (old dense_seq, new dense_seq] and moves
--     dense_seq (new messages always land above dense_seq);
--   * a recall locks the conversation row and, if its target is at or
--     below dense_seq, takes the message out of its bucket.
-- Own messages in a range are then the whole buckets inside it plus the
-- two partial buckets at its ends, each counted on events_by_sender from
-- whichever end of the bucket is nearer: at most half a bucket of seqs per
-- end instead of the whole range.
CREATE TABLE unread_settings (
    -- Fixed once the database holds messages (the buckets depend on it);
    -- tests lower it on an empty database to cross many bucket boundaries.
    bucket_bits integer NOT NULL CHECK (bucket_bits BETWEEN 1 AND 20)
);
INSERT INTO unread_settings VALUES (8);

CREATE TABLE own_msg_buckets (
    conv_id text NOT NULL,
    sender  text NOT NULL,
    bucket  bigint NOT NULL,
    n       bigint NOT NULL CHECK (n >= 0),
    PRIMARY KEY (conv_id, sender, bucket) INCLUDE (n) -- sums are index-only scans
);

INSERT INTO own_msg_buckets (conv_id, sender, bucket, n)
SELECT e.conv_id, e.sender, e.seq >> s.bucket_bits, count(*)
  FROM events e JOIN conversations c ON c.conv_id = e.conv_id, unread_settings s
 WHERE e.seq <= c.dense_seq AND e.kind = 1 AND e.recalled_by IS NULL
 GROUP BY 1, 2, 3;

-- parley_unread_of(conv, user, read): one row, the number of msg events of
-- conv inside one of user's membership periods, not recalled, not sent by
-- user, with seq > read. A set-returning SQL function of one SELECT, so
-- the planner inlines it into the calling query (use it in FROM,
-- LATERAL): a page of conversations is one plan whose index scans are
-- re-run per conversation, not a function call per row with its own
-- executor start-up. STABLE: it sees the caller's snapshot.
--
-- Per membership period [from, to] (to: head if open), unread counts the
-- range (lo, hi], lo = max(read, from - 1), hi = min(to, head), split at
-- mid = the dense_seq watermark w (0003):
--   (lo, mid]: (mid - lo) - non-msg or recalled rows - own messages, the
--              latter from own_msg_buckets: the whole buckets between, and
--              the partial bucket at each end counted from its nearer end
--              (or the range itself if it spans at most two buckets);
--   (mid, hi]: counted directly (the last few seqs, some maybe in flight).
CREATE FUNCTION parley_unread_of(p_conv text, p_user text, p_read bigint) RETURNS TABLE (unread bigint)
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
  FROM (SELECT (SELECT coalesce(max(seq), 0) FROM events WHERE conv_id = p_conv) AS head,
               coalesce((SELECT dense_seq FROM conversations WHERE conv_id = p_conv), 0) AS w,
               (SELECT bucket_bits FROM unread_settings) AS bits
        OFFSET 0) h
  JOIN membership_periods m ON m.conv_id = p_conv AND m.user_id = p_user AND coalesce(m.to_seq, h.head) > p_read
  CROSS JOIN LATERAL (
        SELECT x.lo, x.hi, x.mid, h.w, h.bits,
               x.lo + 1 AS a, (x.lo + 1) >> h.bits AS ba, x.mid >> h.bits AS bh, 1::bigint << h.bits AS size,
               x.mid > x.lo AND (x.mid >> h.bits) - ((x.lo + 1) >> h.bits) > 1 AS multi
          FROM (SELECT y.lo, y.hi, least(y.hi, greatest(y.lo, h.w)) AS mid
                  FROM (SELECT greatest(p_read, m.from_seq - 1) AS lo, least(coalesce(m.to_seq, h.head), h.head) AS hi) y) x
         WHERE x.hi > x.lo) r0
  CROSS JOIN LATERAL (
        SELECT r0.*,
               (r0.ba + 1) * r0.size - 1 - r0.a < r0.a - r0.ba * r0.size AS l_direct,
               r0.mid - r0.bh * r0.size < least(r0.bh * r0.size + r0.size - 1, r0.w) - r0.mid AS h_direct) r1
  CROSS JOIN LATERAL (
        SELECT r1.*,
               -- own messages counted at the low end: the range itself if
               -- it spans at most two buckets, else a's partial bucket
               CASE WHEN NOT r1.multi THEN r1.a WHEN r1.l_direct THEN r1.a ELSE r1.ba * r1.size END AS lx,
               CASE WHEN NOT r1.multi THEN r1.mid WHEN r1.l_direct THEN (r1.ba + 1) * r1.size - 1 ELSE r1.a - 1 END AS ly,
               -- and at the high end (nothing unless multi)
               CASE WHEN NOT r1.multi THEN 1 WHEN r1.h_direct THEN r1.bh * r1.size ELSE r1.mid + 1 END AS hx,
               CASE WHEN NOT r1.multi THEN 0 WHEN r1.h_direct THEN r1.mid
                    ELSE least(r1.bh * r1.size + r1.size - 1, r1.w) END AS hy) r
  CROSS JOIN LATERAL (SELECT count(*) AS n FROM events e
                       WHERE e.conv_id = p_conv AND e.seq > r.lo AND e.seq <= r.mid
                         AND (e.kind <> 1 OR e.recalled_by IS NOT NULL)) nc
  CROSS JOIN LATERAL (SELECT count(*) AS n FROM events e
                       WHERE e.conv_id = p_conv AND e.sender = p_user AND e.seq >= r.lx AND e.seq <= r.ly
                         AND e.kind = 1 AND e.recalled_by IS NULL) lc
  CROSS JOIN LATERAL (SELECT count(*) AS n FROM events e
                       WHERE e.conv_id = p_conv AND e.sender = p_user AND e.seq >= r.hx AND e.seq <= r.hy
                         AND e.kind = 1 AND e.recalled_by IS NULL) hc
  CROSS JOIN LATERAL (SELECT coalesce(sum(b.n) FILTER (WHERE b.bucket > r.ba AND b.bucket < r.bh), 0) AS whole,
                             max(b.n) FILTER (WHERE b.bucket = r.ba) AS n_a,
                             max(b.n) FILTER (WHERE b.bucket = r.bh) AS n_h
                        FROM own_msg_buckets b
                       WHERE r.multi AND b.conv_id = p_conv AND b.sender = p_user
                         AND b.bucket >= r.ba AND b.bucket <= r.bh) bk
  CROSS JOIN LATERAL (SELECT count(*) AS n FROM events e
                       WHERE e.conv_id = p_conv AND e.seq > r.mid AND e.seq <= r.hi
                         AND e.kind = 1 AND e.recalled_by IS NULL AND e.sender <> p_user) top
$$;

-- parley_unread(conv, user, read): the same as a scalar, for single uses.
CREATE OR REPLACE FUNCTION parley_unread(p_conv text, p_user text, p_read bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
SELECT unread FROM parley_unread_of(p_conv, p_user, p_read)
$$;
