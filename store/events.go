package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Kind is an event's kind as stored (smallint).
type Kind int16

// Event kinds. KindHole marks a seq that will never hold an event.
const (
	KindHole   Kind = 0
	KindMsg    Kind = 1
	KindJoin   Kind = 2
	KindLeave  Kind = 3
	KindRecall Kind = 4
	KindEdit   Kind = 5
	KindUpdate Kind = 6 // a role, mute, ban or conversation setting changed
)

// String is the wire name of the kind.
func (k Kind) String() string {
	switch k {
	case KindMsg:
		return "msg"
	case KindJoin:
		return "join"
	case KindLeave:
		return "leave"
	case KindRecall:
		return "recall"
	case KindEdit:
		return "edit"
	case KindUpdate:
		return "update"
	}
	return "hole"
}

// Event is one committed event of a conversation.
type Event struct {
	Conv     string
	Seq      int64
	Kind     Kind
	Sender   string
	Cmid     string
	Body     []byte
	Ts       int64
	Recalled bool
	Target   int64
	Users    []string
	Mentions []string // msg: the mentioned users who were members at send time
	// Edited is the ts of the newest edit of a msg (0: never edited); its
	// Body is then that edit's.
	Edited int64
	// Update is what an update event changed (for its Users).
	Update Update
}

// NewMessage is a msg event to insert at a seq the caller allocated.
type NewMessage struct {
	Conv   string
	Sender string
	Cmid   string
	Body   []byte
	Seq    int64
	Ts     int64
	// Mentions: users the message mentions; those who are not current
	// members are dropped when it is stored.
	Mentions []string
}

// InsertResult is what happened to one NewMessage.
type InsertResult struct {
	Seq int64 // the stored seq: the allocated one, or the original on Dup
	Ts  int64
	Dup bool  // (conv, sender, cmid) was stored before: nothing new stored
	Err error // nil, ErrNotMember (sender is not a current member), ErrForbidden (MutedErr: the sender is muted) or ErrSeqTaken
	// For an inserted row: the conversation's current member count, and,
	// if it is below the recipientsBelow argument of InsertMessages, the
	// users whose membership periods contain the seq (HaveRecipients),
	// read in the same statement so fan-out needs no query of its own.
	Members        int64
	Recipients     []string
	HaveRecipients bool
	Mentions       []string // as stored
}

// InsertMessages stores msgs in one transaction (group commit). Per row:
// inserted; a duplicate (conv, sender, cmid), answered with the original
// seq; a sender who is not a current member; or a seq already taken (the
// caller allocates a new one). The seqs of duplicates and non-members are
// recorded as holes right after, so readers need not wait for them. The
// returned error is for the whole batch (nothing committed).
// The insert is one statement, so the batch commits atomically in one
// round trip.
//
// A message whose (sender, cmid) hashes like another (sender, cmid) of
// the conversation (events_by_cmid_hash; about once in 2^64 pairs) is
// stored in a second transaction, as a collided row; if that one fails,
// so do those rows alone (their Err), the batch's others being committed.
func (s *Store) InsertMessages(ctx context.Context, msgs []NewMessage, recipientsBelow int) ([]InsertResult, error) {
	// The first try is a plain INSERT: checking every unique key before
	// inserting (ON CONFLICT DO NOTHING) costs about a third of the
	// statement, and conflicts are rare (a resend racing its original:
	// the send path answers the resends of stored messages before they
	// get here, StoredSends; a seq counter lost in Redis). A conflict
	// fails the whole statement, which then runs again in the
	// conflict-tolerant form.
	res, err := s.insertRetrying(ctx, msgs, recipientsBelow, insertPlain)
	if err != nil {
		return res, err
	}
	var collided []int
	for i := range res {
		if res[i].Err == errCmidCollided {
			collided = append(collided, i)
		}
	}
	if len(collided) == 0 {
		return res, nil
	}
	again := make([]NewMessage, len(collided))
	for j, i := range collided {
		again[j] = msgs[i]
	}
	res2, err := s.insertRetrying(ctx, again, recipientsBelow, insertCollided)
	for j, i := range collided {
		if err != nil {
			res[i] = InsertResult{Seq: msgs[i].Seq, Ts: msgs[i].Ts, Err: err}
		} else {
			res[i] = res2[j]
		}
	}
	return res, nil
}

// insertMode is which form of insertMessagesSQL a try runs.
type insertMode int

const (
	insertPlain    insertMode = iota // fails on any conflict
	insertTolerant                   // ON CONFLICT DO NOTHING; resolveMissing explains what was not inserted
	insertCollided                   // tolerant, and the rows are stored as cmid_collided
)

// errCmidCollided is resolveMissing's answer for a row that was not
// inserted because another (sender, cmid) of its conversation has the
// same parley_cmid_hash: InsertMessages stores it as a collided row.
var errCmidCollided = errors.New("store: cmid hash taken by another cmid")

// insertRetrying runs insertMessages in mode, in the tolerant form after a
// plain one's conflict, and again after a deadlock.
func (s *Store) insertRetrying(ctx context.Context, msgs []NewMessage, recipientsBelow int, mode insertMode) ([]InsertResult, error) {
	var res []InsertResult
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		res, err = s.insertMessages(ctx, msgs, recipientsBelow, mode)
		switch {
		case mode == insertPlain && isUniqueViolation(err):
			mode = insertTolerant
		case !isDeadlock(err):
			return res, err
		}
	}
	return res, err
}

// insertMessagesSQL looks up memberships and conversations per row, by
// index (scalar and LATERAL subqueries with LIMIT, which the planner does
// not turn into joins): as joins, a plan made while the tables were small
// hashed all of them for every batch, and kept doing so as they grew.
// Being plan-stable, it runs on its generic plan (lockedRowsGeneric):
// left to choose, PostgreSQL planned it anew for every batch, and
// planning took longer than running it (BENCHMARKS.md, the row
// "73186ee against" the sends' insert on its generic plan).
const insertMessagesSQL = `WITH u AS (
		SELECT u.*, c.conv_key, c.member_count
		FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bytea[], $6::bigint[], $8::text[]) AS u(conv, seq, sender, cmid, body, ts, mentions)
		CROSS JOIN LATERAL (SELECT c.conv_key, c.member_count FROM conversations c WHERE c.conv_id = u.conv LIMIT 1) c
	), ins AS (
		INSERT INTO events (conv_key, seq, kind, sender, cmid, body, ts, mentions, cmid_collided)
		SELECT u.conv_key, u.seq, 1, u.sender, u.cmid, u.body, u.ts, ` + mentionsSQL + `, %s
		FROM u
		WHERE coalesce((SELECT true FROM membership_periods m
		                WHERE m.conv_id = u.conv AND m.user_id = u.sender AND m.to_seq IS NULL AND m.from_seq <= u.seq
		                  AND NOT ` + mutedSQL + ` LIMIT 1), false)
		%s
		RETURNING conv_key, seq, mentions)
	SELECT u.conv, u.seq, ins.mentions, u.member_count,
		CASE WHEN u.member_count < $7 THEN ARRAY(SELECT m.user_id FROM membership_periods m
			WHERE m.conv_id = u.conv AND m.from_seq <= u.seq AND (m.to_seq IS NULL OR m.to_seq >= u.seq)) END
	FROM ins JOIN u ON u.conv_key = ins.conv_key AND u.seq = ins.seq`

// mutedSQL: is the send u of member period m one its mute refuses? A
// mute is judged by seq, in the log's order: a send whose seq is above
// the mute's while the mute lasts (muted_until above the send's ts), or
// between the last mute and the unmute that ended it, is refused; one
// below the mute's is not, even if it commits after it. (Never NULL: a
// NULL would refuse every send.)
const mutedSQL = `((coalesce(m.muted_until, 0) > u.ts AND u.seq > coalesce(m.muted_seq, 0))
	OR (u.seq > coalesce(m.muted_seq, 0) AND u.seq < coalesce(m.unmuted_seq, 0)))`

var (
	insertMessagesPlainSQL    = fmt.Sprintf(insertMessagesSQL, "NULL::boolean", "")
	insertMessagesTolerantSQL = fmt.Sprintf(insertMessagesSQL, "NULL::boolean", "ON CONFLICT DO NOTHING")
	insertMessagesCollidedSQL = fmt.Sprintf(insertMessagesSQL, "true", "ON CONFLICT DO NOTHING")
)

func (s *Store) insertMessages(ctx context.Context, msgs []NewMessage, recipientsBelow int, mode insertMode) ([]InsertResult, error) {
	n := len(msgs)
	convs, senders, cmids := make([]string, n), make([]string, n), make([]string, n)
	bodies := make([][]byte, n)
	seqs, tss := make([]int64, n), make([]int64, n)
	mentions := make([]*string, n)
	for i, m := range msgs {
		convs[i], senders[i], cmids[i], bodies[i], seqs[i], tss[i] = m.Conv, m.Sender, m.Cmid, m.Body, m.Seq, m.Ts
		mentions[i] = mentionsJSON(m.Mentions)
	}
	res := make([]InsertResult, n)
	// One transaction, sent in one round trip, and one WAL flush commit
	// the whole batch: first the change locks of its conversations
	// (shared), then one statement that inserts the rows of senders whose
	// open membership period began at or below the row's seq. The insert
	// takes its snapshot after the locks, so a membership change or recall
	// that held one is committed by then and is seen: the order of seqs
	// agrees with the order of membership changes (MembershipChange). The
	// same statement reads the recipients of each inserted row in a small
	// conversation (the membership periods that contain its seq).
	query := insertMessagesPlainSQL
	switch mode {
	case insertTolerant:
		query = insertMessagesTolerantSQL
	case insertCollided:
		query = insertMessagesCollidedSQL
	}
	type insertedRow struct {
		members    int64
		recipients []string
		mentions   []string
	}
	inserted := make(map[ConvSeq]insertedRow, n)
	err := s.lockedRowsGeneric(ctx, lockSharedSQL, lockKeys("", convs),
		query, []any{convs, seqs, senders, cmids, bodies, tss, recipientsBelow, mentions},
		func(rows pgx.Rows) error {
			var k ConvSeq
			var r insertedRow
			if err := rows.Scan(&k.Conv, &k.Seq, &r.mentions, &r.members, &r.recipients); err != nil {
				return err
			}
			if r.recipients == nil && r.members < int64(recipientsBelow) {
				r.recipients = []string{} // computed, and nobody (cannot happen: the sender is a member)
			}
			inserted[k] = r
			return nil
		})
	if err != nil {
		return nil, err
	}
	var missing []int
	for i := range msgs {
		res[i] = InsertResult{Seq: seqs[i], Ts: tss[i]}
		r, ok := inserted[ConvSeq{convs[i], seqs[i]}]
		if !ok {
			missing = append(missing, i)
			continue
		}
		res[i].Members, res[i].Recipients, res[i].HaveRecipients = r.members, r.recipients, r.recipients != nil
		res[i].Mentions = r.mentions
	}
	if len(missing) > 0 {
		// The inserted rows are committed already; explaining the others
		// reads committed state and only adds holes, which are idempotent.
		if err := resolveMissing(ctx, s.pool, msgs, missing, res, mode == insertCollided); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// querier is what pgx's pool, connections and transactions have in common.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// lockSharedSQL takes the change locks $1 (sorted, distinct) shared,
// until the end of the transaction. Sorted: a batch waits only for locks
// above those it holds, so batches and changes cannot wait in a cycle.
const lockSharedSQL = `SELECT count(pg_advisory_xact_lock_shared(k)) FROM unnest($1::bigint[]) k`

// lockExclusiveSQL takes the advisory locks $1 (sorted, distinct)
// exclusively, until the end of the transaction: the device cursor locks
// of a cursor merge, the read locks of a read-position merge.
const lockExclusiveSQL = `SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::bigint[]) k`

// Advisory lock namespaces: a conversation's change lock is keyed by its
// id alone, a device's cursor lock and a user's read lock by their id
// after these prefixes.
const (
	deviceLockNS = "device\x00"
	readLockNS   = "read\x00"
)

// lockKeys returns the advisory lock keys of ids in namespace ns, sorted
// and distinct (so a transaction takes them in one order).
func lockKeys(ns string, ids []string) []int64 {
	keys := make([]int64, len(ids))
	for i, id := range ids {
		keys[i] = changeLockKey(ns + id)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// lockedRows runs, in one transaction sent in one round trip, lockSQL
// with keys (the advisory locks, held to the end of the transaction) and
// then sql with args, and calls scan for each row sql returns (scan reads
// the current row; an error it returns ends the call). The transaction is
// implicit: it commits at the end of the batch, when the batch is closed,
// so what sql wrote is durable only once lockedRows returns nil.
func (s *Store) lockedRows(ctx context.Context, lockSQL string, keys []int64, sql string, args []any, scan func(pgx.Rows) error) error {
	return s.batchRows(ctx, s.pool, "", lockSQL, keys, sql, args, scan)
}

// lockedRowsGeneric is lockedRows with sql run on its generic plan (see
// genericRows): for statements that PostgreSQL would otherwise plan anew
// on every execution at a cost above running them (the read-state
// statements, which inline parley_unread_of: BENCHMARKS.md, the row
// "f3921e7 against fb51afd"). sql must be plan-stable, as genericRows
// requires.
func (s *Store) lockedRowsGeneric(ctx context.Context, lockSQL string, keys []int64, sql string, args []any, scan func(pgx.Rows) error) error {
	return s.batchRows(ctx, s.pool, "BEGIN", lockSQL, keys, sql, args, scan)
}

// batchRows sends, in one round trip: begin and SET LOCAL plan_cache_mode
// = force_generic_plan (if begin is not ""; otherwise the transaction is
// the batch's implicit one), lockSQL with keys (if lockSQL is not ""),
// sql with args, and COMMIT (if begin was sent). It calls scan for each
// row sql returns and returns once the transaction committed.
//
// A begun transaction that fails (a unique violation that a plain insert
// expects now and then, a deadlock) is left aborted on its connection,
// and pgxpool closes a connection released in a transaction: batchRows
// rolls it back first, so a designed failure costs no new connection.
func (s *Store) batchRows(ctx context.Context, pool *pgxpool.Pool, begin, lockSQL string, keys []int64, sql string, args []any, scan func(pgx.Rows) error) error {
	b, before := genericBatch(begin, lockSQL, keys, sql, args)
	if begin == "" {
		return runBatch(pool.SendBatch(ctx, b), before, false, scan)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	err = runBatch(conn.SendBatch(ctx, b), before, true, scan)
	if err != nil && conn.Conn().PgConn().TxStatus() == 'E' {
		// Best effort: if this fails too, Release closes the connection.
		_, _ = conn.Exec(ctx, `ROLLBACK`)
	}
	return err
}

// runBatch reads the results of a batch made by genericBatch (before
// statements, then the rows, then the COMMIT if committed) and closes it.
func runBatch(br pgx.BatchResults, before int, committed bool, scan func(pgx.Rows) error) error {
	defer br.Close()
	for range before {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	for rows.Next() {
		if err := scan(rows); err != nil {
			rows.Close()
			return err
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if committed {
		if _, err := br.Exec(); err != nil { // COMMIT
			return err
		}
	}
	// The transaction commits at the end of the batch (or at its COMMIT):
	// only then are the rows durable.
	return br.Close()
}

// genericBatch is batchRows' batch: sql, after begin (if any) with the
// generic plan and lockSQL (if any), then COMMIT (if begun). before is
// how many statements come before sql.
func genericBatch(begin, lockSQL string, keys []int64, sql string, args []any) (b *pgx.Batch, before int) {
	b = &pgx.Batch{}
	if begin != "" {
		b.Queue(begin)
		b.Queue(`SET LOCAL plan_cache_mode = force_generic_plan`)
	}
	if lockSQL != "" {
		b.Queue(lockSQL, keys)
	}
	before = b.Len()
	b.Queue(sql, args...)
	if begin != "" {
		b.Queue(`COMMIT`)
	}
	return b, before
}

// storedSendSQL is the message stored under the idempotency key (u.sender,
// u.cmid) in the conversation c.conv_key, as (seq, ts), or no row: through
// events_by_cmid_hash (its hash, then sender and cmid compared), then
// events_by_cmid_collided (empty in practice; migration 0013). A LATERAL
// subquery of rows u and c.
const storedSendSQL = `(SELECT e.seq, e.ts FROM events e
			 WHERE e.conv_key = c.conv_key AND parley_cmid_hash(e.sender, e.cmid) = parley_cmid_hash(u.sender, u.cmid)
			   AND e.cmid IS NOT NULL AND e.cmid_collided IS NULL AND e.sender = u.sender AND e.cmid = u.cmid)
			UNION ALL
			(SELECT e.seq, e.ts FROM events e
			 WHERE e.conv_key = c.conv_key AND e.sender = u.sender AND e.cmid = u.cmid AND e.cmid_collided)
			LIMIT 1`

// SendKey is a message's idempotency key: its conversation, sender and
// cmid.
type SendKey struct{ Conv, Sender, Cmid string }

// Sent is where a message is stored: its seq and ts (Seq 0: nowhere).
type Sent struct{ Seq, Ts int64 }

// StoredSends returns, for each of keys, the message already stored under
// it (a zero Sent if none), in one statement: an index probe per key on
// the idempotency index. The send path asks it before allocating seqs, so
// that the resend of a message that was already stored is answered with
// the original seq without allocating one (docs/consistency.md). It reads
// committed rows only: a message whose insert is still in flight is not
// found.
func (s *Store) StoredSends(ctx context.Context, keys []SendKey) ([]Sent, error) {
	out := make([]Sent, len(keys))
	at := make([]int, 0, len(keys)) // the index in keys of each key asked
	convs, senders, cmids := make([]string, 0, len(keys)), make([]string, 0, len(keys)), make([]string, 0, len(keys))
	for i, k := range keys {
		if storable(k.Conv) && storable(k.Sender) && storable(k.Cmid) { // others were never stored
			at = append(at, i)
			convs, senders, cmids = append(convs, k.Conv), append(senders, k.Sender), append(cmids, k.Cmid)
		}
	}
	if len(at) == 0 {
		return out, nil
	}
	// One statement, outside any explicit transaction (it reads one
	// snapshot either way): no BEGIN and COMMIT to pay for on the send path.
	//
	// A new message (nearly every send) costs two index probes: its
	// conversation's key, then its hash in events_by_cmid_hash, where it
	// finds nothing. events_by_cmid_collided is probed only when a row of
	// another (sender, cmid) holds the hash: a collided row is stored only
	// then, and events are never deleted, so without such a row there is
	// no collided row to find. (Each LATERAL subquery has its LIMIT so
	// that the planner keeps it a parameterized index probe per key: one
	// without is pulled up into a join, which may scan all of events.)
	rows, err := s.pool.Query(ctx, `SELECT u.i, coalesce(x.seq, h.seq), coalesce(x.ts, h.ts)
		FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS u(conv, sender, cmid, i)
		CROSS JOIN LATERAL (SELECT c.conv_key FROM conversations c WHERE c.conv_id = u.conv LIMIT 1) c
		CROSS JOIN LATERAL (SELECT h.seq, h.ts, h.sender = u.sender AND h.cmid = u.cmid AS same FROM events h
			WHERE h.conv_key = c.conv_key AND parley_cmid_hash(h.sender, h.cmid) = parley_cmid_hash(u.sender, u.cmid)
			  AND h.cmid IS NOT NULL AND h.cmid_collided IS NULL LIMIT 1) h
		LEFT JOIN LATERAL (SELECT e.seq, e.ts FROM events e
			WHERE NOT h.same AND e.conv_key = c.conv_key AND e.sender = u.sender AND e.cmid = u.cmid AND e.cmid_collided LIMIT 1) x ON true
		WHERE h.same OR x.seq IS NOT NULL`, convs, senders, cmids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var i int64
		var sent Sent
		if err := rows.Scan(&i, &sent.Seq, &sent.Ts); err != nil {
			return nil, err
		}
		if i < 1 || i > int64(len(at)) {
			return nil, fmt.Errorf("store: stored send %d of %d", i, len(at))
		}
		out[at[i-1]] = sent
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// resolveMissing explains rows that InsertMessages did not insert. The
// original of a duplicate is looked up through events_by_cmid_hash (its
// hash, then its sender and cmid compared) and events_by_cmid_collided;
// a row whose hash another (sender, cmid) holds is errCmidCollided,
// unless collided (the rows were being stored as collided ones already).
func resolveMissing(ctx context.Context, tx querier, msgs []NewMessage, missing []int, res []InsertResult, collided bool) error {
	idx, seqs, tss := make([]int64, len(missing)), make([]int64, len(missing)), make([]int64, len(missing))
	convs, senders, cmids := make([]string, len(missing)), make([]string, len(missing)), make([]string, len(missing))
	for j, i := range missing {
		idx[j], convs[j], senders[j], cmids[j], seqs[j], tss[j] = int64(i), msgs[i].Conv, msgs[i].Sender, msgs[i].Cmid, msgs[i].Seq, msgs[i].Ts
	}
	rows, err := tx.Query(ctx, `SELECT u.i, e.seq, e.ts,
			EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = u.conv AND m.user_id = u.sender AND m.to_seq IS NULL AND m.from_seq <= u.seq),
			(SELECT max(coalesce(m.muted_until, 0)) FROM membership_periods m WHERE m.conv_id = u.conv AND m.user_id = u.sender AND m.to_seq IS NULL AND `+mutedSQL+`),
			EXISTS (SELECT 1 FROM events h WHERE h.conv_key = c.conv_key AND parley_cmid_hash(h.sender, h.cmid) = parley_cmid_hash(u.sender, u.cmid)
				AND h.cmid IS NOT NULL AND h.cmid_collided IS NULL)
		FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[]) AS u(i, conv, sender, cmid, seq, ts)
		LEFT JOIN conversations c ON c.conv_id = u.conv
		LEFT JOIN LATERAL (`+storedSendSQL+`) e ON true`, idx, convs, senders, cmids, seqs, tss)
	if err != nil {
		return err
	}
	holes := map[string][]int64{}
	for rows.Next() {
		var i int64
		var seq, ts *int64
		var member bool
		var mutedUntil *int64 // not nil: refused by a mute (one in force, or one the seq falls in)
		var hashTaken bool    // another row holds the cmid hash
		if err := rows.Scan(&i, &seq, &ts, &member, &mutedUntil, &hashTaken); err != nil {
			return err
		}
		m := msgs[i]
		switch {
		case seq != nil && *seq != m.Seq:
			res[i] = InsertResult{Seq: *seq, Ts: *ts, Dup: true}
			holes[m.Conv] = append(holes[m.Conv], m.Seq)
		case seq != nil: // inserted by this very statement under another row's key: cannot happen, but is not an error
		case !member:
			res[i].Err = ErrNotMember
			holes[m.Conv] = append(holes[m.Conv], m.Seq)
		case mutedUntil != nil:
			res[i].Err = MutedErr(*mutedUntil)
			holes[m.Conv] = append(holes[m.Conv], m.Seq)
		case hashTaken && !collided: // its seq stays free for the collided insert
			res[i].Err = errCmidCollided
		default:
			res[i].Err = ErrSeqTaken
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for conv, seqs := range holes {
		if err := insertHoles(ctx, tx, conv, seqs, msgs[0].Ts); err != nil {
			return err
		}
	}
	return nil
}

// InsertHoles records seqs of conv as holes: seqs that will never hold an
// event. A seq that already holds a row (an event, or a hole) is left as it
// is; a concurrent insert of that seq waits for this and then fails, so the
// unique key decides who owns a seq (docs/consistency.md).
func (s *Store) InsertHoles(ctx context.Context, conv string, seqs []int64, ts int64) error {
	return insertHoles(ctx, s.pool, conv, seqs, ts)
}

func insertHoles(ctx context.Context, tx querier, conv string, seqs []int64, ts int64) error {
	_, err := tx.Exec(ctx, `INSERT INTO events (conv_key, seq, kind, ts)
		SELECT c.conv_key, s, 0, $3 FROM conversations c, unnest($2::bigint[]) s WHERE c.conv_id = $1 ON CONFLICT DO NOTHING`,
		conv, seqs, ts)
	return err
}

// Page is one sync page read from a single snapshot.
type Page struct {
	Epoch, MinSeq, Head int64
	// Upto is the highest seq the page covers: every seq in (after, Upto]
	// holds a committed row, so none of them can gain an event later.
	Upto   int64
	Events []Event
	// Gap is the first seq above Upto (and at most Head) that holds no row
	// yet: allocated to a send that is in flight, or that failed. 0: none.
	Gap int64
	// GapAfterTs is the ts of the first row above Gap; a gap older than the
	// hole timeout is made a hole by the caller.
	GapAfterTs int64
}

// ReadPage returns user's visible events of conv with seq > after, at most
// limit of them, and how far the page reaches. Invisible seqs (outside the
// user's membership periods, and holes) are covered without being
// returned. ErrNotMember if the user was never a member (or conv does not
// exist). The caller checks after <= Head.
func (s *Store) ReadPage(ctx context.Context, conv, user string, after int64, limit int) (Page, error) {
	var p Page
	err := s.readTx(ctx, func(tx pgx.Tx) error {
		periods, err := periodsTx(ctx, tx, conv, user)
		if err != nil {
			return err
		}
		var key, cleared int64
		if err := tx.QueryRow(ctx, `SELECT c.conv_key, c.epoch, c.min_seq, (SELECT coalesce(max(e.seq), 0) FROM events e WHERE e.conv_key = c.conv_key),
				coalesce((SELECT r.cleared_seq FROM read_positions r WHERE r.user_id = $2 AND r.conv_id = c.conv_id), 0)
			FROM conversations c WHERE c.conv_id = $1`, conv, user).Scan(&key, &p.Epoch, &p.MinSeq, &p.Head, &cleared); err != nil {
			return err
		}
		periods = clearedFrom(periods, cleared)
		p.Upto = after
		if after >= p.Head {
			return nil
		}
		return readRanges(ctx, tx, convRef{conv, key}, periods, limit, &p)
	})
	return p, err
}

// convRef names a conversation both ways: its id, and the conv_key that
// its events are stored under (migration 0006).
type convRef struct {
	id  string
	key int64
}

// Period is a membership period [From, To]; To is math.MaxInt64 while open.
type Period struct{ From, To int64 }

// clearedFrom returns the parts of periods above cleared: what a user
// who cleared the conversation up to cleared still sees ("delete for
// me" hides everything at or below it, from that user alone).
func clearedFrom(periods []Period, cleared int64) []Period {
	if cleared <= 0 {
		return periods
	}
	out := periods[:0:0]
	for _, p := range periods {
		if p.To <= cleared {
			continue
		}
		p.From = max(p.From, cleared+1)
		out = append(out, p)
	}
	return out
}

func periodsTx(ctx context.Context, tx pgx.Tx, conv, user string) ([]Period, error) {
	rows, err := tx.Query(ctx, `SELECT from_seq, coalesce(to_seq, $3) FROM membership_periods WHERE conv_id = $1 AND user_id = $2 ORDER BY from_seq`,
		conv, user, int64(math.MaxInt64))
	if err != nil {
		return nil, err
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Period, error) {
		var p Period
		return p, r.Scan(&p.From, &p.To)
	})
	if err != nil {
		return nil, err
	}
	if len(ps) == 0 {
		return nil, ErrNotMember
	}
	return ps, nil
}

// readRanges walks (p.Upto, p.Head]: visible ranges are read row by row,
// invisible ones only checked for contiguity. It stops at the first seq
// without a row, or when limit visible events are collected.
func readRanges(ctx context.Context, tx pgx.Tx, conv convRef, periods []Period, limit int, p *Page) error {
	pos := p.Upto
	var sc eventScan
	dest := sc.dest()
	for pos < p.Head && len(p.Events) < limit {
		var next *Period
		for i := range periods {
			if periods[i].To > pos {
				next = &periods[i]
				break
			}
		}
		if next == nil || next.From > pos+1 {
			end := p.Head
			if next != nil {
				end = min(next.From-1, p.Head)
			}
			gap, err := firstGap(ctx, tx, conv, pos+1, end)
			if err != nil {
				return err
			}
			if gap != 0 {
				return p.stopAt(ctx, tx, conv, gap)
			}
			pos = end
			continue
		}
		end := min(next.To, p.Head)
		want := limit - len(p.Events)
		rows, err := tx.Query(ctx, `SELECT `+eventColumns+`
			FROM events e WHERE e.conv_key = $1 AND e.seq > $2 AND e.seq <= $3 ORDER BY e.seq LIMIT $4`, conv.key, pos, end, want)
		if err != nil {
			return err
		}
		got := 0
		gap := int64(0)
		for rows.Next() {
			sc.reset()
			if err := rows.Scan(dest...); err != nil {
				rows.Close()
				return err
			}
			e, err := sc.event(conv.id)
			if err != nil {
				rows.Close()
				return err
			}
			got++
			if e.Seq != pos+1 {
				gap = pos + 1
				break
			}
			pos = e.Seq
			if e.Kind != KindHole {
				p.Events = append(p.Events, e)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if gap == 0 && got < want && pos < end {
			gap = pos + 1
		}
		if gap != 0 {
			p.Upto = pos
			return p.stopAt(ctx, tx, conv, gap)
		}
	}
	p.Upto = pos
	return nil
}

// stopAt ends the page just below gap and records how old the gap is.
func (p *Page) stopAt(ctx context.Context, tx pgx.Tx, conv convRef, gap int64) error {
	p.Upto = gap - 1
	p.Gap = gap
	return tx.QueryRow(ctx, `SELECT ts FROM events WHERE conv_key = $1 AND seq > $2 ORDER BY seq LIMIT 1`, conv.key, gap).Scan(&p.GapAfterTs)
}

// firstGap returns the first seq in [from, to] without a row, or 0.
func firstGap(ctx context.Context, tx pgx.Tx, conv convRef, from, to int64) (int64, error) {
	if from > to {
		return 0, nil
	}
	var n int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM events WHERE conv_key = $1 AND seq BETWEEN $2 AND $3`, conv.key, from, to).Scan(&n); err != nil {
		return 0, err
	}
	if n == to-from+1 {
		return 0, nil
	}
	var gap int64
	err := tx.QueryRow(ctx, `SELECT s FROM generate_series($2::bigint, $3::bigint) s
		WHERE NOT EXISTS (SELECT 1 FROM events WHERE conv_key = $1 AND seq = s) ORDER BY s LIMIT 1`, conv.key, from, to).Scan(&gap)
	return gap, err
}

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// mentionsSQL is the stored mentions of a row u of the insert: the users
// of u.mentions (a JSON array, or NULL) who are current members, in the
// order given, or NULL when none remain.
const mentionsSQL = `CASE WHEN u.mentions IS NOT NULL THEN nullif(ARRAY(
		SELECT x.usr FROM jsonb_array_elements_text(u.mentions::jsonb) WITH ORDINALITY AS x(usr, i)
		WHERE EXISTS (SELECT 1 FROM membership_periods mm WHERE mm.conv_id = u.conv AND mm.user_id = x.usr AND mm.to_seq IS NULL)
		ORDER BY x.i), '{}') END`

// mentionsJSON encodes mentions for the insert (nil when there are none).
func mentionsJSON(mentions []string) *string {
	if len(mentions) == 0 {
		return nil
	}
	b, _ := json.Marshal(mentions)
	s := string(b)
	return &s
}
