package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
)

// Unread counting below the dense_seq watermark takes own messages from
// own_msg_buckets (migration 0004): whole buckets, plus a partial bucket
// at each end counted from its nearer end. This drives one conversation
// through a random history at the store level, with buckets of 4 seqs so
// it crosses hundreds of bucket boundaries: messages by three users,
// recalls of messages below and above the watermark, edits (events of
// their own that never count), clears (which raise the read position),
// holes, a leave and a
// rejoin, seqs committed out of order (so the watermark lags), and the
// watermark advanced at random moments. Throughout, it checks
//   - the buckets: each holds exactly the sender's not-recalled messages of
//     its seqs at or below dense_seq;
//   - unread: for every user and a sample of read positions (every one
//     from 0 to head at the end), parley_unread equals the SQL definition
//     (parleytest.UnreadDefinitionSQL).
//
// PARLEY_UNREAD_SEED=N replays a history.
func TestUnreadBucketsMatchDefinition(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	if s := os.Getenv("PARLEY_UNREAD_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = v
	}
	t.Logf("seed %d (replay: PARLEY_UNREAD_SEED=%d go test -run TestUnreadBucketsMatchDefinition ./store/)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, pg := bucketStore(t, ctx, 4)

	users := []string{"ana", "ben", "cy"}
	if err := st.CreateUsers(ctx, users); err != nil {
		t.Fatal(err)
	}
	const conv = "g"
	if err := st.CreateConversation(ctx, store.MembershipChange{Conv: conv, Seq: 1, Ts: 1}, "group", "", users); err != nil {
		t.Fatal(err)
	}
	next := int64(2)
	member := map[string]bool{"ana": true, "ben": true, "cy": true}
	joined := map[string]int64{"ana": 1, "ben": 1, "cy": 1} // start of the open period
	var own []int64                                         // seqs of messages, for recalls
	sender := map[int64]string{}
	var parked []int64 // allocated seqs whose message is committed later
	read, cleared := map[string]int64{}, map[string]int64{}
	leftAt := map[string]int64{} // the seq of the leave that closed a user's last period
	var log []string
	fail := func(format string, args ...any) {
		t.Helper()
		from := max(0, len(log)-30)
		t.Fatalf("seed %d: %s\nlast steps: %v", seed, fmt.Sprintf(format, args...), log[from:])
	}
	send := func(s int64, who string) {
		res, err := st.InsertMessages(ctx, []store.NewMessage{{Conv: conv, Sender: who, Cmid: fmt.Sprint("m", s), Body: []byte("x"), Seq: s, Ts: s}}, 100)
		if err != nil || res[0].Err != nil {
			fail("send %d by %s: %v %+v", s, who, err, res)
		}
		own = append(own, s)
		sender[s] = who
		log = append(log, fmt.Sprintf("msg %d %s", s, who))
	}
	anyMember := func() string {
		for {
			if u := users[rng.Intn(len(users))]; member[u] {
				return u
			}
		}
	}
	// commitParked commits parked seq s: as a hole if asked, or as a
	// message of a member whose open period began at or below s (the
	// store refuses a sender whose period does not contain the seq), or
	// as a hole if there is none.
	commitParked := func(s int64, hole bool) {
		var senders []string
		for _, u := range users {
			if member[u] && joined[u] <= s {
				senders = append(senders, u)
			}
		}
		if hole || len(senders) == 0 {
			if err := st.InsertHoles(ctx, conv, []int64{s}, s); err != nil {
				t.Fatal(err)
			}
			log = append(log, fmt.Sprintf("hole %d", s))
			return
		}
		send(s, senders[rng.Intn(len(senders))])
	}
	checkBuckets := func() {
		t.Helper()
		if err := ownBucketsMismatch(ctx, pg, conv); err != nil {
			fail("%v", err)
		}
	}
	// checkUnread compares every read position from 0 to head if all is
	// set, else a sample: the ends, around the watermark, and random ones.
	checkUnread := func(all bool) {
		t.Helper()
		head := next - 1
		var dense int64
		if err := pg.QueryRow(ctx, `SELECT dense_seq FROM conversations WHERE conv_id = $1`, conv).Scan(&dense); err != nil {
			t.Fatal(err)
		}
		var reads []int64
		if all {
			for r := int64(0); r <= head; r++ {
				reads = append(reads, r)
			}
		} else {
			reads = []int64{0, 1, max(dense-1, 0), dense, min(dense+1, head), max(head-1, 0), head}
			for range 12 {
				reads = append(reads, rng.Int63n(head+1))
			}
		}
		// One round trip for all the pairs: the queries are the same
		// either way, and waiting on each in turn is what made this test
		// slow.
		type pair struct {
			u         string
			r         int64
			got, want int64
		}
		var pairs []*pair
		b := &pgx.Batch{}
		for _, u := range users {
			for _, r := range reads {
				p := &pair{u: u, r: r}
				pairs = append(pairs, p)
				b.Queue(`SELECT parley_unread($1, $2, $3)`, conv, u, r).QueryRow(func(row pgx.Row) error { return row.Scan(&p.got) })
				b.Queue(parleytest.UnreadDefinitionSQL, u, conv, r).QueryRow(func(row pgx.Row) error { return row.Scan(&p.want) })
			}
		}
		if err := pg.SendBatch(ctx, b).Close(); err != nil {
			t.Fatal(err)
		}
		for _, p := range pairs {
			if p.got != p.want {
				fail("unread of %s above %d: %d, the definition says %d (head %d, dense_seq %d)", p.u, p.r, p.got, p.want, head, dense)
			}
		}
	}

	const steps = 400
	for i := 0; i < steps; i++ {
		switch p := rng.Intn(100); {
		case p < 60:
			send(next, anyMember())
			next++
		case p < 67: // park a seq: a later one commits first, the watermark stops below it
			parked = append(parked, next)
			log = append(log, fmt.Sprintf("park %d", next))
			next++
		case p < 75 && len(parked) > 0:
			commitParked(parked[0], rng.Intn(4) == 0)
			parked = parked[1:]
		case p < 85:
			if err := st.AdvanceDense(ctx, []string{conv}); err != nil {
				t.Fatal(err)
			}
			log = append(log, "advance")
		case p < 89 && len(own) > 0:
			target := own[rng.Intn(len(own))]
			who := sender[target]
			if !member[who] {
				continue
			}
			r, err := st.Recall(ctx, &store.MembershipChange{Conv: conv, Actor: who, Seq: next, Ts: next}, target, 1<<40)
			if err != nil {
				fail("recall %d by %s: %v", target, who, err)
			}
			if !r.Again { // a repeat takes no seq
				log = append(log, fmt.Sprintf("recall %d (seq %d)", target, next))
				next++
			}
		case p < 92 && len(own) > 0: // an edit takes a seq and changes no count
			target := own[rng.Intn(len(own))]
			who := sender[target]
			if !member[who] {
				continue
			}
			r, err := st.Edit(ctx, &store.MembershipChange{Conv: conv, Actor: who, Seq: next, Ts: next}, target, []byte(fmt.Sprint("e", next)), 1<<40)
			switch {
			case errors.Is(err, store.ErrNoMessage): // recalled: refused, no seq
				log = append(log, fmt.Sprintf("edit %d refused (recalled)", target))
			case err != nil || r.Again:
				fail("edit %d by %s: %+v %v", target, who, r, err)
			default:
				log = append(log, fmt.Sprintf("edit %d (seq %d)", target, next))
				next++
			}
		case p < 95: // a clear raises read to the cleared position; unread is counted above it
			u := users[rng.Intn(len(users))]
			var head int64 // the top seq may be parked: clear at or below the committed head
			if err := pg.QueryRow(ctx, `SELECT coalesce(max(e.seq), 0) FROM events e JOIN conversations c ON c.conv_key = e.conv_key WHERE c.conv_id = $1`, conv).Scan(&head); err != nil {
				t.Fatal(err)
			}
			seq := rng.Int63n(head + 1)
			r, err := st.Clear(ctx, u, conv, seq)
			if err != nil {
				fail("clear by %s at %d: %v", u, seq, err)
			}
			lastTo := next - 1
			if !member[u] {
				lastTo = leftAt[u]
			}
			cleared[u] = max(cleared[u], min(seq, lastTo))
			read[u] = max(read[u], cleared[u])
			var want int64
			if err := pg.QueryRow(ctx, parleytest.UnreadDefinitionSQL, u, conv, read[u]).Scan(&want); err != nil {
				t.Fatal(err)
			}
			if r.Cleared != cleared[u] || r.Read != read[u] || r.Unread != want {
				fail("clear by %s at %d: %+v; want cleared %d read %d unread %d", u, seq, r, cleared[u], read[u], want)
			}
			log = append(log, fmt.Sprintf("clear %s at %d", u, seq))
		default: // ben or cy leaves, or comes back
			u := users[1+rng.Intn(2)]
			ch := &store.MembershipChange{Conv: conv, Seq: next, Ts: next}
			var err error
			if member[u] {
				_, _, err = st.RemoveMember(ctx, ch, u)
			} else {
				_, _, _, err = st.AddMembers(ctx, ch, []string{u})
			}
			if err != nil {
				fail("membership of %s: %v", u, err)
			}
			member[u] = !member[u]
			if member[u] {
				joined[u] = next
			} else {
				leftAt[u] = next
			}
			log = append(log, fmt.Sprintf("%s member=%v at %d", u, member[u], next))
			next++
		}
		if i%10 == 9 {
			checkBuckets()
			checkUnread(false)
		}
	}
	// Commit what is parked, let the watermark reach head, check again.
	for _, s := range parked {
		commitParked(s, false)
	}
	if err := st.AdvanceDense(ctx, []string{conv}); err != nil {
		t.Fatal(err)
	}
	var dense int64
	if err := pg.QueryRow(ctx, `SELECT dense_seq FROM conversations WHERE conv_id = $1`, conv).Scan(&dense); err != nil || dense != next-1 {
		t.Fatalf("dense_seq %d (%v), want head %d", dense, err, next-1)
	}
	checkBuckets()
	checkUnread(true)
}

// ownBucketsMismatch returns an error naming the first bucket of conv in
// own_msg_buckets that does not hold exactly its sender's not-recalled
// messages at or below dense_seq (buckets of 4 seqs).
func ownBucketsMismatch(ctx context.Context, pg *pgx.Conn, conv string) error {
	var who string
	var bucket, got, want int64
	err := pg.QueryRow(ctx, `
SELECT coalesce(b.sender, x.sender), coalesce(b.bucket, x.bucket), coalesce(b.n, 0), coalesce(x.n, 0)
  FROM (SELECT * FROM own_msg_buckets WHERE conv_id = $1) b
  FULL JOIN (SELECT e.sender, e.seq >> 2 AS bucket, count(*) AS n
               FROM events e JOIN conversations c ON c.conv_key = e.conv_key
              WHERE c.conv_id = $1 AND e.seq <= c.dense_seq AND e.kind = 1 AND e.recalled_by IS NULL
              GROUP BY 1, 2) x ON x.sender = b.sender AND x.bucket = b.bucket
 WHERE coalesce(b.n, 0) <> coalesce(x.n, 0) LIMIT 1`, conv).Scan(&who, &bucket, &got, &want)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("bucket (%s, %d) holds %d, the events say %d", who, bucket, got, want)
}

// Recalls and watermark advances of the same conversation, from several
// goroutines at once (as from several parleyd processes), must leave the
// buckets exact: a recall is ordered before or after each advance by the
// conversation row lock, so every message is taken out of its bucket
// exactly when it had been counted in.
func TestOwnBucketsUnderConcurrentRecallsAndAdvances(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, pg := bucketStore(t, ctx, 8)
	if err := st.CreateUsers(ctx, []string{"ana", "ben"}); err != nil {
		t.Fatal(err)
	}
	const conv, msgs = "g", 300
	if err := st.CreateConversation(ctx, store.MembershipChange{Conv: conv, Seq: 1, Ts: 1}, "group", "", []string{"ana", "ben"}); err != nil {
		t.Fatal(err)
	}
	// Messages at seqs 2..301, committed in shuffled order while advances
	// run, then recalled (seqs 302..) while advances still run.
	order := rand.Perm(msgs)
	var next atomic.Int64
	next.Store(msgs + 2)
	done := make(chan struct{})
	var wg, recalls sync.WaitGroup
	errs := make(chan error, 8)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := st.AdvanceDense(ctx, []string{conv}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	who := func(s int64) string { return []string{"ana", "ben"}[s%2] }
	for _, k := range order {
		s := int64(k + 2)
		res, err := st.InsertMessages(ctx, []store.NewMessage{{Conv: conv, Sender: who(s), Cmid: fmt.Sprint(s), Body: []byte("x"), Seq: s, Ts: s}}, 100)
		if err != nil || res[0].Err != nil {
			t.Fatal(err, res)
		}
	}
	for w := range 3 {
		recalls.Add(1)
		go func() {
			defer recalls.Done()
			for k := w; k < msgs; k += 3 {
				target := int64(order[k] + 2)
				s := next.Add(1) - 1
				if _, err := st.Recall(ctx, &store.MembershipChange{Conv: conv, Actor: who(target), Seq: s, Ts: s}, target, 1<<40); err != nil {
					errs <- fmt.Errorf("recall %d: %w", target, err)
					return
				}
			}
		}()
	}
	// Stop the advances once the recalls are done.
	recalls.Wait()
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := st.AdvanceDense(ctx, []string{conv}); err != nil {
		t.Fatal(err)
	}
	if err := ownBucketsMismatch(ctx, pg, conv); err != nil {
		t.Fatal(err)
	}
	var left int64
	if err := pg.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM own_msg_buckets WHERE conv_id = $1`, conv).Scan(&left); err != nil || left != 0 {
		t.Fatalf("every message was recalled, yet the buckets hold %d (%v)", left, err)
	}
}

// bucketStore opens a store of maxConns connections on a database of its
// own with buckets of 4 seqs, and a plain connection to inspect it; both
// are closed when the test ends.
func bucketStore(t *testing.T, ctx context.Context, maxConns int) (*store.Store, *pgx.Conn) {
	t.Helper()
	url := testenv.PostgresURL(t)
	st, err := store.Open(ctx, url, maxConns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	parleytest.SetUnreadBucketBits(t, url, 2)
	pg, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	return st, pg
}
