-- Unread counts from what the caller already read.
--
-- parley_unread_of looked up the conversation (its key, dense_seq and
-- head) for every (user, conversation) it counted. A snapshot statement
-- had read the same three values a moment before, in the same
-- statement, for the same conversation: a reconnect storm's snapshots
-- paid for each lookup twice. parley_unread_at is the count itself,
-- taking them as arguments (p_key the conversation's conv_key, p_head
-- its newest seq, p_w its dense_seq, as read in the caller's snapshot);
-- parley_unread_of looks them up once and calls it, so every caller
-- counts with the same body. Both are plain SQL functions, inlined into
-- their callers' plans.

CREATE FUNCTION parley_unread_at(p_conv text, p_user text, p_read bigint, p_key bigint, p_head bigint, p_w bigint)
RETURNS TABLE (unread bigint)
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
  FROM (SELECT p_head AS head, p_w AS w, (SELECT bucket_bits FROM unread_settings) AS bits, p_key AS k
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

CREATE OR REPLACE FUNCTION parley_unread_of(p_conv text, p_user text, p_read bigint) RETURNS TABLE (unread bigint)
LANGUAGE sql STABLE ROWS 1 AS $$
SELECT u.unread
  FROM (SELECT (SELECT coalesce(max(e.seq), 0) FROM events e WHERE e.conv_key = c.conv_key) AS head,
               coalesce(c.dense_seq, 0) AS w, c.conv_key AS k
          FROM (SELECT NULL) one LEFT JOIN conversations c ON c.conv_id = p_conv
        OFFSET 0) h
  CROSS JOIN LATERAL parley_unread_at(p_conv, p_user, p_read, h.k, h.head, h.w) u
$$;
