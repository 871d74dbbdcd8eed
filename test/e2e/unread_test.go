package e2e_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// urQuerier is what pgx connections and transactions have in common.
type urQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// unreadAbove evaluates the definition for an explicit read position.
func unreadAbove(t testing.TB, q urQuerier, user, conv string, read int64) int64 {
	t.Helper()
	var n int64
	if err := q.QueryRow(context.Background(), parleytest.UnreadDefinitionSQL, user, conv, read).Scan(&n); err != nil {
		t.Fatalf("unread definition: %v", err)
	}
	return n
}

// urReadPosition is user's stored read position in conv (0 if none).
func urReadPosition(t testing.TB, q urQuerier, user, conv string) int64 {
	t.Helper()
	var v int64
	err := q.QueryRow(context.Background(), `SELECT read_seq FROM read_positions WHERE user_id = $1 AND conv_id = $2`, user, conv).Scan(&v)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return v
}

// unreadByDefinition evaluates the definition at user's stored read
// position.
func unreadByDefinition(t testing.TB, q urQuerier, user, conv string) int64 {
	t.Helper()
	return unreadAbove(t, q, user, conv, urReadPosition(t, q, user, conv))
}

// TestUnreadMatchesDefinitionRandomized runs random histories (seeded;
// the seed is logged; PARLEY_UNREAD_SEED=N replays one) over 3–4 users,
// some with two devices, in one or two groups: sends, recalls (by the
// sender within the window, plus refused ones by others and repeated
// ones), leaves and rejoins (client leave / members_add and the admin
// API), reads at random seqs (above head, and above the leave point for
// former members), acks. It keeps its own model of the history. After
// every read and ack the reply is checked against the model and the SQL
// definition; at random points and at the end of each history, for every
// user and conversation, convs (from a random device of the user) and
// snapshot must give read = the stored read position = the model's, and
// unread = the SQL definition on PostgreSQL = the model's count; and
// always unread <= head - read, read <= head, read <= the end of the
// user's last membership period, delivered = the model's (cursors only
// grow, never above head, and reads never move them).
func TestUnreadMatchesDefinitionRandomized(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	seed := time.Now().UnixNano()
	if s := os.Getenv("PARLEY_UNREAD_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("PARLEY_UNREAD_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (replay: PARLEY_UNREAD_SEED=%d go test -run TestUnreadMatchesDefinitionRandomized ./server/)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	cfg.HoleTimeout = 100 * time.Millisecond // a lost seq is fenced by the next sync soon after
	env := parleytest.Start(t, cfg)
	// Buckets of 4 seqs: short histories cross many bucket boundaries, so
	// unread counting uses whole buckets and partial ones at both ends.
	parleytest.SetUnreadBucketBits(t, env.Cfg.PostgresURL, 2)
	rdb := parleytest.RedisClient(t, env.Cfg)
	pg, err := pgx.Connect(context.Background(), env.Cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(context.Background())

	const histories, maxOps = 30, 60
	start := time.Now()
	budget := 35 * time.Second
	var ops, checks, done int
	stats := map[string]int{}
	for h := 0; h < histories; h++ {
		if time.Since(start) > budget {
			t.Logf("time budget of %s used up after %d histories", budget, h)
			break
		}
		hs := newURHistory(t, env, pg, rand.New(rand.NewSource(rng.Int63())), h)
		hs.rdb = rdb
		hs.run(10 + hs.rng.Intn(maxOps-9))
		if h%3 == 0 {
			hs.burst()
			hs.check()
		}
		hs.close()
		ops += hs.ops
		checks += hs.checks
		for k, v := range hs.stats {
			stats[k] += v
		}
		done++
	}
	t.Logf("%d histories, %d operations, %d full checks in %s; outcomes %v", done, ops, checks, time.Since(start).Round(time.Millisecond), stats)
}

type urUser struct {
	id    string
	devs  []parleytest.Device
	conns []*client.Conn
}

type urPeriod struct{ from, to int64 } // to 0: open

type urMsg struct {
	seq       int64
	sender    string
	recalled  bool
	recallSeq int64
	body      string // the newest edit's ("x" until edited)
	editSeq   int64  // the newest edit's seq (0: never edited)
}

type urConv struct {
	id      string
	periods map[string][]urPeriod
	msgs    []*urMsg
	read    map[string]int64
	cleared map[string]int64 // "delete for me" positions
}

type urHistory struct {
	t     *testing.T
	env   *parleytest.Env
	pg    *pgx.Conn
	rdb   redis.UniversalClient
	rng   *rand.Rand
	n     int
	users []*urUser
	convs []*urConv
	deliv map[string]map[string]int64 // device -> conv -> delivered
	log   []string
	c     context.Context

	ops, checks int
	cmid        int
	stats       map[string]int
}

func newURHistory(t *testing.T, env *parleytest.Env, pg *pgx.Conn, rng *rand.Rand, n int) *urHistory {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	h := &urHistory{t: t, env: env, pg: pg, rng: rng, n: n, c: c, deliv: map[string]map[string]int64{}, stats: map[string]int{}}
	nu := 3 + rng.Intn(2)
	for i := 0; i < nu; i++ {
		nd := 1
		if i == 0 || rng.Intn(2) == 0 {
			nd = 2
		}
		u := &urUser{id: fmt.Sprintf("r%02d-u%d", n, i)}
		u.devs = env.User(t, u.id, nd)
		for _, d := range u.devs {
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, err := client.Dial(dctx, env.Addr, d.ID, d.Token, client.DialOptions{})
			cancel()
			if err != nil {
				t.Fatalf("dial %s: %v", d.ID, err)
			}
			u.conns = append(u.conns, c)
			h.deliv[d.ID] = map[string]int64{}
		}
		h.users = append(h.users, u)
	}
	ng := 1 + rng.Intn(2)
	for g := 0; g < ng; g++ {
		c := &urConv{id: fmt.Sprintf("r%02d-g%d", n, g), periods: map[string][]urPeriod{}, read: map[string]int64{}, cleared: map[string]int64{}}
		var members []string
		for _, u := range h.users {
			if rng.Intn(3) != 0 {
				members = append(members, u.id)
			}
		}
		if len(members) == 0 {
			members = []string{h.users[rng.Intn(nu)].id}
		}
		if head := env.Group(t, c.id, members...); head != 1 {
			t.Fatalf("group %s: head %d", c.id, head)
		}
		for _, m := range members {
			c.periods[m] = []urPeriod{{from: 1}}
		}
		h.convs = append(h.convs, c)
		h.logf("create %s members %v", c.id, members)
	}
	return h
}

func (h *urHistory) close() {
	for _, u := range h.users {
		for _, c := range u.conns {
			c.Close()
		}
	}
}

func (h *urHistory) logf(format string, args ...any) {
	h.log = append(h.log, fmt.Sprintf(format, args...))
}

// fail stops the test with the history so far.
func (h *urHistory) fail(format string, args ...any) {
	h.t.Helper()
	h.t.Fatal(h.failure(format, args...))
}

// failure describes a failure with the history so far.
func (h *urHistory) failure(format string, args ...any) string {
	from := max(0, len(h.log)-40)
	return fmt.Sprintf("history %d: %s\nlast operations:\n  %s", h.n, fmt.Sprintf(format, args...), strings.Join(h.log[from:], "\n  "))
}

// ctx is the history's context (one per history: a history takes a few
// seconds at most).
func (h *urHistory) ctx() context.Context { return h.c }

// ---- the model ----

func (c *urConv) member(u string) bool {
	ps := c.periods[u]
	return len(ps) > 0 && ps[len(ps)-1].to == 0
}

func (c *urConv) ever(u string) bool { return len(c.periods[u]) > 0 }

// lastTo is the end of u's last membership period (MaxInt64 while open).
func (c *urConv) lastTo(u string) int64 {
	ps := c.periods[u]
	if len(ps) == 0 || ps[len(ps)-1].to == 0 {
		return math.MaxInt64
	}
	return ps[len(ps)-1].to
}

func (c *urConv) visible(u string, seq int64) bool {
	for _, p := range c.periods[u] {
		if seq >= p.from && (p.to == 0 || seq <= p.to) {
			return true
		}
	}
	return false
}

func (c *urConv) unread(u string) int64 {
	var n int64
	for _, m := range c.msgs {
		if m.seq > c.read[u] && !m.recalled && m.sender != u && c.visible(u, m.seq) {
			n++
		}
	}
	return n
}

func (c *urConv) currentMembers() []string {
	var out []string
	for u := range c.periods {
		if c.member(u) {
			out = append(out, u)
		}
	}
	return out
}

// ---- helpers ----

func (h *urHistory) head(conv string) int64 {
	var v int64
	if err := h.pg.QueryRow(h.ctx(), `SELECT coalesce(max(seq), 0) FROM events WHERE conv_key = (SELECT conv_key FROM conversations WHERE conv_id = $1)`, conv).Scan(&v); err != nil {
		h.t.Fatal(err)
	}
	return v
}

func (h *urHistory) user(id string) *urUser {
	for _, u := range h.users {
		if u.id == id {
			return u
		}
	}
	h.t.Fatalf("no user %s", id)
	return nil
}

func (h *urHistory) pick(u *urUser) (*client.Conn, string) {
	i := h.rng.Intn(len(u.conns))
	return u.conns[i], u.devs[i].ID
}

func (h *urHistory) wantCode(what string, err error, code wire.Code) {
	h.t.Helper()
	if wire.CodeOf(err) != code {
		h.fail("%s: %v, want %s", what, err, code)
	}
	h.stats[string(code)]++
}

// otherMember: one time in five, a current member of c other than m's
// sender, to try what only the sender may do (nil otherwise).
func (h *urHistory) otherMember(c *urConv, m *urMsg) *urUser {
	others := c.currentMembers()
	if h.rng.Intn(5) != 0 || len(others) == 0 {
		return nil
	}
	if a := h.user(others[h.rng.Intn(len(others))]); a.id != m.sender {
		return a
	}
	return nil
}

// positionSeq picks the seq of a read or clear by a user whose last
// membership period ends at lastTo: 10 in 100 above head; below pastLeave
// in 100, if the period ended below head, beyond its end (a former member
// reads beyond the leave point); below atHead in 100, head itself; else
// any seq up to head.
func (h *urHistory) positionSeq(head, lastTo int64, pastLeave, atHead int) int64 {
	switch p := h.rng.Intn(100); {
	case p < 10:
		return head + 1 + h.rng.Int63n(3)
	case p < pastLeave && lastTo < head:
		return lastTo + 1 + h.rng.Int63n(head-lastTo)
	case p < atHead:
		return head
	default:
		return h.rng.Int63n(head + 1)
	}
}

// positionRefused checks the reply to op (read, clear or ack) of seq by u
// in c, whose head is head: refused NOT_MEMBER if u was never a member,
// CURSOR_AHEAD above head, else accepted. It reports whether op was
// refused (the model does not change).
func (h *urHistory) positionRefused(op string, c *urConv, u *urUser, seq, head int64, err error) bool {
	h.t.Helper()
	switch {
	case !c.ever(u.id):
		h.wantCode(op+" by a never-member", err, wire.NotMember)
		return true
	case seq > head:
		h.wantCode(op+" above head", err, wire.CursorAhead)
		return true
	case err != nil:
		h.fail("%s: %v", op, err)
	}
	return false
}

func (h *urHistory) run(n int) {
	for i := 0; i < n; i++ {
		h.ops++
		c := h.convs[h.rng.Intn(len(h.convs))]
		u := h.users[h.rng.Intn(len(h.users))]
		switch p := h.rng.Intn(100); {
		case p < 30:
			h.send(c, u)
		case p < 32:
			h.loseSeq(c)
		case p < 36:
			h.sync(c, u)
		case p < 40:
			h.recall(c)
		case p < 44:
			h.edit(c)
		case p < 50:
			h.leave(c, u)
		case p < 56:
			h.add(c, u)
		case p < 78:
			h.read(c, u)
		case p < 82:
			h.clear(c, u)
		case p < 94:
			h.ack(c, u)
		default:
			h.check()
		}
	}
	h.check()
}

func (h *urHistory) send(c *urConv, u *urUser) {
	conn, dev := h.pick(u)
	h.cmid++
	r, err := conn.Send(h.ctx(), c.id, fmt.Sprintf("m%d", h.cmid), []byte("x"))
	h.logf("send %s by %s (%s): %+v %v", c.id, u.id, dev, r.Seq, err)
	if !c.member(u.id) {
		h.wantCode("send by a non-member", err, wire.NotMember)
		return
	}
	if err != nil {
		h.fail("send: %v", err)
	}
	if n := len(c.msgs); n > 0 && r.Seq <= c.msgs[n-1].seq {
		h.fail("send got seq %d after %d", r.Seq, c.msgs[n-1].seq)
	}
	c.msgs = append(c.msgs, &urMsg{seq: r.Seq, sender: u.id, body: "x"})
	h.stats["send"]++
}

// loseSeq allocates a seq in Redis that is never committed: a sender that
// died between INCR and COMMIT. Until a sync fences it as a hole, the seq
// holds no row (unread must not count it).
func (h *urHistory) loseSeq(c *urConv) {
	s, err := allocByHand(h.ctx(), h.rdb, h.env.Cfg.RedisPrefix+"seq:{"+c.id+"}")
	if err != nil {
		h.fail("allocating a seq by hand: %v", err)
	}
	h.logf("seq %s/%d allocated and never committed", c.id, s)
	h.stats["lost-seq"]++
}

// sync pages through c from 0 as u (by upto only): the messages it returns
// are exactly those inside u's periods and above u's cleared position,
// recalled ones marked, edited ones with their newest body.
func (h *urHistory) sync(c *urConv, u *urUser) {
	conn, dev := h.pick(u)
	var after int64
	got := map[int64]bool{}
	bodies := map[int64]string{}
	neverMember := false
	// A page with more and no events: a lost seq, fenced after the hole
	// timeout. Try again shortly.
	testenv.CheckFor(h.t, 10*time.Second, 20*time.Millisecond, func() error {
		for {
			r, err := conn.Sync(h.ctx(), c.id, after, 1000)
			if !c.ever(u.id) {
				h.logf("sync %s by %s: %v", c.id, dev, err)
				h.wantCode("sync by a never-member", err, wire.NotMember)
				neverMember = true
				return nil
			}
			if err != nil {
				h.fail("sync: %v", err)
			}
			for _, e := range r.Events {
				if e.Kind == "msg" {
					got[e.Seq] = e.Recalled
					bodies[e.Seq] = string(e.Body)
				}
				if e.Seq <= c.cleared[u.id] {
					h.fail("sync of %s by %s returned seq %d, at or below the cleared position %d", c.id, dev, e.Seq, c.cleared[u.id])
				}
			}
			after = r.Upto
			if !r.More {
				return nil
			}
			if len(r.Events) == 0 {
				return errors.New(h.failure("sync of %s by %s did not reach head %d: upto %d", c.id, dev, r.Head, r.Upto))
			}
		}
	})
	if neverMember {
		return
	}
	want := 0
	for _, m := range c.msgs {
		if !c.visible(u.id, m.seq) || m.seq <= c.cleared[u.id] {
			continue
		}
		want++
		if rec, ok := got[m.seq]; !ok || rec != m.recalled {
			h.fail("sync of %s by %s: message %d (recalled %v) returned %v (recalled %v)", c.id, dev, m.seq, m.recalled, ok, rec)
		}
		wantBody := m.body
		if m.recalled {
			wantBody = ""
		}
		if bodies[m.seq] != wantBody {
			h.fail("sync of %s by %s: message %d has body %q, want %q", c.id, dev, m.seq, bodies[m.seq], wantBody)
		}
	}
	h.logf("sync %s by %s: %d messages up to %d", c.id, dev, len(got), after)
	if len(got) != want {
		h.fail("sync of %s by %s returned %d messages, %d are visible", c.id, dev, len(got), want)
	}
	h.stats["sync"]++
}

func (h *urHistory) recall(c *urConv) {
	if len(c.msgs) == 0 {
		return
	}
	m := c.msgs[h.rng.Intn(len(c.msgs))]
	sender := h.user(m.sender)
	if a := h.otherMember(c, m); a != nil {
		// Someone else tries: NOT_SENDER (or NOT_MEMBER: not a member).
		conn, _ := h.pick(a)
		_, err := conn.Recall(h.ctx(), c.id, m.seq)
		h.logf("recall %s/%d by %s (not the sender): %v", c.id, m.seq, a.id, err)
		h.wantCode("recall by another user", err, wire.NotSender)
		return
	}
	conn, _ := h.pick(sender)
	r, err := conn.Recall(h.ctx(), c.id, m.seq)
	h.logf("recall %s/%d by %s: %+v %v", c.id, m.seq, sender.id, r.Seq, err)
	if !c.member(sender.id) {
		h.wantCode("recall by a sender who left", err, wire.NotMember)
		return
	}
	if err != nil || r.Target != m.seq {
		h.fail("recall %d: %+v %v", m.seq, r, err)
	}
	if m.recalled {
		if r.Seq != m.recallSeq {
			h.fail("recalling %d again: seq %d, first recall was %d", m.seq, r.Seq, m.recallSeq)
		}
		h.stats["recall-again"]++
		return
	}
	m.recalled, m.recallSeq = true, r.Seq
	h.stats["recall"]++
}

// edit: the sender edits one of c's messages (or someone else tries, or
// the sender retries the newest edit). Edits take seqs and never count
// as unread.
func (h *urHistory) edit(c *urConv) {
	if len(c.msgs) == 0 {
		return
	}
	m := c.msgs[h.rng.Intn(len(c.msgs))]
	sender := h.user(m.sender)
	if a := h.otherMember(c, m); a != nil {
		conn, _ := h.pick(a)
		_, err := conn.Edit(h.ctx(), c.id, m.seq, []byte("not mine"))
		h.logf("edit %s/%d by %s (not the sender): %v", c.id, m.seq, a.id, err)
		code := wire.NotSender
		if m.recalled {
			code = wire.NotFound
		}
		h.wantCode("edit by another user", err, code)
		return
	}
	body := m.body
	retry := m.editSeq != 0 && h.rng.Intn(4) == 0
	if !retry {
		h.cmid++
		body = fmt.Sprintf("e%d", h.cmid)
	}
	conn, _ := h.pick(sender)
	r, err := conn.Edit(h.ctx(), c.id, m.seq, []byte(body))
	h.logf("edit %s/%d by %s to %q: %+v %v", c.id, m.seq, sender.id, body, r.Seq, err)
	switch {
	case !c.member(sender.id):
		h.wantCode("edit by a sender who left", err, wire.NotMember)
		return
	case m.recalled:
		h.wantCode("edit of a recalled message", err, wire.NotFound)
		return
	case err != nil || r.Target != m.seq:
		h.fail("edit %d: %+v %v", m.seq, r, err)
	case retry:
		if r.Seq != m.editSeq {
			h.fail("edit of %d retried: seq %d, the edit was %d", m.seq, r.Seq, m.editSeq)
		}
		h.stats["edit-again"]++
		return
	}
	m.body, m.editSeq = body, r.Seq
	h.stats["edit"]++
}

// clear: u clears c up to a random seq ("delete for me"): the cleared
// position max-merges (capped like read) and raises read.
func (h *urHistory) clear(c *urConv, u *urUser) {
	head := h.head(c.id)
	lastTo := c.lastTo(u.id)
	seq := h.positionSeq(head, lastTo, 30, 0)
	conn, dev := h.pick(u)
	r, err := conn.Clear(h.ctx(), c.id, seq)
	h.logf("clear %s by %s (%s) at %d (head %d, last period ends %d): cleared %d read %d unread %d %v", c.id, u.id, dev, seq, head, lastTo, r.Cleared, r.Read, r.Unread, err)
	if h.positionRefused("clear", c, u, seq, head, err) {
		return
	}
	c.cleared[u.id] = max(c.cleared[u.id], min(seq, lastTo))
	c.read[u.id] = max(c.read[u.id], c.cleared[u.id])
	def := unreadByDefinition(h.t, h.pg, u.id, c.id)
	if r.Cleared != c.cleared[u.id] || r.Read != c.read[u.id] || r.Unread != def || def != c.unread(u.id) {
		h.fail("clear_ok cleared %d read %d unread %d; model cleared %d read %d unread %d; SQL definition unread %d",
			r.Cleared, r.Read, r.Unread, c.cleared[u.id], c.read[u.id], c.unread(u.id), def)
	}
	h.stats["clear"]++
}

func (h *urHistory) leave(c *urConv, u *urUser) {
	viaAdmin := h.rng.Intn(2) == 0
	member := c.member(u.id)
	var head int64
	if viaAdmin {
		var out struct {
			Head int64 `json:"head"`
		}
		st := h.env.Admin(h.t, "DELETE", "/v1/conversations/"+c.id+"/members/"+u.id, nil, &out)
		h.logf("admin remove %s from %s: %d head %d", u.id, c.id, st, out.Head)
		if !member {
			if st != http.StatusNotFound {
				h.fail("removing a non-member: status %d, want 404", st)
			}
			h.stats["remove-non-member"]++
			return
		}
		if st != http.StatusOK {
			h.fail("admin remove: status %d", st)
		}
		head = out.Head
	} else {
		conn, _ := h.pick(u)
		r, err := conn.Leave(h.ctx(), c.id)
		h.logf("leave %s by %s: head %d %v", c.id, u.id, r.Head, err)
		if !member {
			h.wantCode("leave by a non-member", err, wire.NotMember)
			return
		}
		if err != nil {
			h.fail("leave: %v", err)
		}
		head = r.Head
	}
	ps := c.periods[u.id]
	ps[len(ps)-1].to = head
	h.stats["leave"]++
}

func (h *urHistory) add(c *urConv, u *urUser) {
	members := c.currentMembers()
	var head int64
	if len(members) == 0 || h.rng.Intn(2) == 0 {
		var out struct {
			Head int64 `json:"head"`
		}
		st := h.env.Admin(h.t, "POST", "/v1/conversations/"+c.id+"/members", map[string]any{"users": []string{u.id}}, &out)
		h.logf("admin add %s to %s: %d head %d", u.id, c.id, st, out.Head)
		if st != http.StatusOK {
			h.fail("admin add: status %d", st)
		}
		head = out.Head
	} else {
		a := h.user(members[h.rng.Intn(len(members))])
		conn, _ := h.pick(a)
		r, err := conn.AddMembers(h.ctx(), c.id, u.id)
		h.logf("members_add %s to %s by %s: head %d %v", u.id, c.id, a.id, r.Head, err)
		if err != nil {
			h.fail("members_add: %v", err)
		}
		head = r.Head
	}
	if c.member(u.id) {
		h.stats["add-member-again"]++
		return // already a member: nothing changes
	}
	c.periods[u.id] = append(c.periods[u.id], urPeriod{from: head})
	h.stats["join"]++
}

func (h *urHistory) read(c *urConv, u *urUser) {
	head := h.head(c.id)
	lastTo := c.lastTo(u.id)
	seq := h.positionSeq(head, lastTo, 40, 55)
	conn, dev := h.pick(u)
	r, err := conn.Read(h.ctx(), c.id, seq)
	h.logf("read %s by %s (%s) at %d (head %d, last period ends %d): read %d unread %d %v", c.id, u.id, dev, seq, head, lastTo, r.Read, r.Unread, err)
	if h.positionRefused("read", c, u, seq, head, err) {
		return
	}
	want := max(c.read[u.id], min(seq, lastTo))
	c.read[u.id] = want
	def := unreadByDefinition(h.t, h.pg, u.id, c.id)
	if r.Read != want || r.Unread != def || def != c.unread(u.id) {
		h.fail("read_ok read %d unread %d; model read %d unread %d; SQL definition unread %d", r.Read, r.Unread, want, c.unread(u.id), def)
	}
	if seq > lastTo {
		h.stats["read-capped"]++
	} else {
		h.stats["read"]++
	}
}

func (h *urHistory) ack(c *urConv, u *urUser) {
	head := h.head(c.id)
	seq := h.rng.Int63n(head + 1)
	if h.rng.Intn(10) == 0 {
		seq = head + 1
	}
	conn, dev := h.pick(u)
	r, err := conn.Ack(h.ctx(), c.id, seq)
	h.logf("ack %s by %s at %d: %d %v", c.id, dev, seq, r.Delivered, err)
	if h.positionRefused("ack", c, u, seq, head, err) {
		return
	}
	want := max(h.deliv[dev][c.id], seq)
	h.deliv[dev][c.id] = want
	if r.Delivered != want {
		h.fail("ack_ok delivered %d, want %d", r.Delivered, want)
	}
	h.stats["ack"]++
}

// check compares every user's convs and snapshot with the SQL definition
// and the model, and checks on the stored tables that no delivery cursor
// is above head and no read position above head or the end of the user's
// last membership period.
func (h *urHistory) check() {
	h.checks++
	heads := map[string]int64{}
	for _, c := range h.convs {
		heads[c.id] = h.head(c.id)
	}
	for _, u := range h.users {
		conn, dev := h.pick(u)
		cr, err := conn.Convs(h.ctx(), 1000, "")
		if err != nil {
			h.fail("convs of %s: %v", u.id, err)
		}
		items := map[string]wire.Item{}
		for _, it := range cr.Items {
			items[it.Conv] = it
		}
		// Snapshots from the head (nothing to send), from the start and
		// from a random seq: the unread count is the same whether the
		// reply's events cover the read position or not.
		var snaps [3]wire.Message
		for k := range snaps {
			var req []wire.ConvAfter
			for _, c := range h.convs {
				after := heads[c.id]
				if k == 1 {
					after = 0
				} else if k == 2 {
					after = h.rng.Int63n(heads[c.id] + 1)
				}
				req = append(req, wire.ConvAfter{Conv: c.id, After: after})
			}
			sr, err := conn.Snapshot(h.ctx(), req)
			if err != nil || len(sr.Items) != len(h.convs) {
				h.fail("snapshot of %s: %+v %v", u.id, sr, err)
			}
			snaps[k] = sr
		}
		for i, c := range h.convs {
			it, listed := items[c.id]
			si := snaps[0].Items[i]
			if !c.ever(u.id) {
				if listed || si.Error != string(wire.NotMember) {
					h.fail("%s was never in %s: convs item %+v, snapshot %+v", u.id, c.id, it, si)
				}
				continue
			}
			if !listed {
				h.fail("convs of %s lacks %s", u.id, c.id)
			}
			stored := urReadPosition(h.t, h.pg, u.id, c.id)
			def := unreadByDefinition(h.t, h.pg, u.id, c.id)
			mRead, mUnread := c.read[u.id], c.unread(u.id)
			head := heads[c.id]
			if it.Cleared != c.cleared[u.id] {
				h.fail("%s/%s convs on %s: cleared %d, model %d", u.id, c.id, dev, it.Cleared, c.cleared[u.id])
			}
			if it.Head != head || it.Read != stored || it.Read != mRead || it.Unread != def || def != mUnread || it.Delivered != h.deliv[dev][c.id] {
				h.fail("%s/%s convs on %s: head %d read %d unread %d delivered %d; SQL head %d read_positions %d definition unread %d; model read %d unread %d delivered %d",
					u.id, c.id, dev, it.Head, it.Read, it.Unread, it.Delivered, head, stored, def, mRead, mUnread, h.deliv[dev][c.id])
			}
			for k, sr := range snaps {
				if si := sr.Items[i]; si.Error != "" || si.Head != head || si.Read != stored || si.Unread != def {
					h.fail("%s/%s snapshot %d: %+v; want head %d read %d unread %d", u.id, c.id, k, si, head, stored, def)
				}
			}
			if it.Unread > it.Head-it.Read || it.Read > it.Head || it.Read > c.lastTo(u.id) {
				h.fail("%s/%s: head %d read %d unread %d, last period ends %d", u.id, c.id, it.Head, it.Read, it.Unread, c.lastTo(u.id))
			}
		}
	}
	// Read positions and delivery cursors within their bounds, on the
	// stored tables of this history.
	var badRead, badCursor int
	prefix := fmt.Sprintf("r%02d-", h.n)
	if err := h.pg.QueryRow(h.ctx(), `SELECT count(*) FROM read_positions rp
		WHERE rp.conv_id LIKE $1 || '%' AND (
		      rp.read_seq > (SELECT coalesce(max(seq), 0) FROM events e WHERE e.conv_key = (SELECT conv_key FROM conversations WHERE conv_id = rp.conv_id))
		   OR rp.read_seq > (SELECT max(coalesce(p.to_seq, 9223372036854775807)) FROM membership_periods p
		                      WHERE p.conv_id = rp.conv_id AND p.user_id = rp.user_id)
		   OR NOT EXISTS (SELECT 1 FROM membership_periods p WHERE p.conv_id = rp.conv_id AND p.user_id = rp.user_id))`,
		prefix).Scan(&badRead); err != nil {
		h.t.Fatal(err)
	}
	if err := h.pg.QueryRow(h.ctx(), `SELECT count(*) FROM device_cursors dc
		WHERE dc.conv_id LIKE $1 || '%'
		  AND dc.delivered_seq > (SELECT coalesce(max(seq), 0) FROM events e WHERE e.conv_key = (SELECT conv_key FROM conversations WHERE conv_id = dc.conv_id))`,
		prefix).Scan(&badCursor); err != nil {
		h.t.Fatal(err)
	}
	if badRead != 0 || badCursor != 0 {
		h.fail("%d read positions above head or the end of the last period, %d cursors above head", badRead, badCursor)
	}
	h.logf("check ok")
}

// burst: the current members of one conversation send at the same time
// while every user polls convs and sometimes reads at the head it sees.
// Every convs reply must be one consistent snapshot (unread <= head -
// read, read <= head, head never going back for a device); the sends and
// reads are then folded into the model, and check compares everything
// again.
func (h *urHistory) burst() {
	c := h.convs[h.rng.Intn(len(h.convs))]
	senders := c.currentMembers()
	if len(senders) == 0 {
		return
	}
	const perSender = 8
	h.logf("burst in %s by %v", c.id, senders)
	var mu sync.Mutex
	var errs []string
	failf := func(format string, args ...any) {
		mu.Lock()
		errs = append(errs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	var sent []*urMsg
	reads := map[string]int64{}
	var sendWG, pollWG sync.WaitGroup
	stop := make(chan struct{})
	for i, id := range senders {
		conn, _ := h.pick(h.user(id))
		sendWG.Add(1)
		go func() {
			defer sendWG.Done()
			for k := 0; k < perSender; k++ {
				r, err := conn.Send(h.ctx(), c.id, fmt.Sprintf("burst-%d-%d", i, k), []byte("b"))
				if err != nil {
					failf("burst send by %s: %v", id, err)
					return
				}
				mu.Lock()
				sent = append(sent, &urMsg{seq: r.Seq, sender: id})
				mu.Unlock()
			}
		}()
	}
	for _, u := range h.users {
		if !c.ever(u.id) {
			continue
		}
		conn, _ := h.pick(u)
		doRead := h.rng.Intn(2) == 0
		pollWG.Add(1)
		go func() {
			defer pollWG.Done()
			var lastHead int64
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				r, err := conn.Convs(h.ctx(), 1000, "")
				if err != nil {
					failf("convs of %s during the burst: %v", u.id, err)
					return
				}
				for _, it := range r.Items {
					if it.Conv != c.id {
						continue
					}
					if it.Unread > it.Head-it.Read || it.Read > it.Head || it.Head < lastHead {
						failf("%s/%s during the burst: head %d (before %d) read %d unread %d", u.id, c.id, it.Head, lastHead, it.Read, it.Unread)
					}
					lastHead = it.Head
					if doRead && n%3 == 1 {
						rr, err := conn.Read(h.ctx(), c.id, it.Head)
						if err != nil || rr.Read < it.Read {
							failf("read %d by %s during the burst: %+v %v", it.Head, u.id, rr, err)
							return
						}
						mu.Lock()
						reads[u.id] = max(reads[u.id], it.Head)
						mu.Unlock()
					}
				}
			}
		}()
	}
	sendWG.Wait()
	close(stop)
	pollWG.Wait()
	if len(errs) > 0 {
		h.fail("burst: %s", strings.Join(errs, "; "))
	}
	slices.SortFunc(sent, func(a, b *urMsg) int { return cmp.Compare(a.seq, b.seq) })
	c.msgs = append(c.msgs, sent...)
	for u, seq := range reads {
		c.read[u] = max(c.read[u], min(seq, c.lastTo(u)))
		h.logf("burst read %s by %s up to %d", c.id, u, seq)
	}
	h.stats["burst-send"] += len(sent)
}
