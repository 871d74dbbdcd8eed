package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// Roles and moderation (docs/protocol.md §9), on two gateways over one
// PostgreSQL and one Redis: every user has one device on each gateway,
// moderators act from gateway A, and their targets and the other members
// are seen (and act) on gateway B. Every accepted change is checked
// against the events it must append, the pushes every member's devices
// get and what sync returns; every refused one against nothing at all:
// the head does not move, sync shows no new seq, no device is pushed
// anything, and the next message takes the very next seq (no hole).

// modDev is one connected device and what it was pushed.
type modDev struct {
	id, user string
	c        *client.Conn

	mu     sync.Mutex
	pushes map[string][]wire.Message // conversation → pushes, in arrival order
	raw    chan wire.Message         // replies to frames written by rawDo
}

func (d *modDev) onFrame(m wire.Message) {
	if m.T == wire.TPush {
		d.mu.Lock()
		d.pushes[m.Conv] = append(d.pushes[m.Conv], m)
		d.mu.Unlock()
		return
	}
	if strings.HasPrefix(m.Rid, "raw-") {
		select {
		case d.raw <- m:
		default:
		}
	}
}

// pushesOf returns the pushes of conv with a seq in (from, to].
func (d *modDev) pushesOf(conv string, from, to int64) []wire.Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []wire.Message
	for _, m := range d.pushes[conv] {
		if m.Seq > from && m.Seq <= to {
			out = append(out, m)
		}
	}
	return out
}

// do sends q and waits (at most 10 s) for its reply.
func (d *modDev) do(q wire.Request) (wire.Message, error) {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return d.c.Do(c, q)
}

// modUser is a user with device a on gateway A and device b on gateway B.
type modUser struct {
	id   string
	a, b *modDev
}

// modNet is the two gateways, the users, and the test's own account of
// each conversation's members, roles and mutes, kept from the changes the
// test made (never read back from the server except to compare).
type modNet struct {
	a, b  *parleytest.Env
	users map[string]*modUser

	mu      sync.Mutex
	members map[string]map[string]*modMember // conversation → user → membership
	direct  map[string]bool
	rawN    atomic.Int64
}

// modMember is what the test expects of one current member.
type modMember struct {
	role       string
	mutedUntil int64
	fromSeq    int64
}

// newModNet starts two gateways with cfg and provisions users, each with a
// device connected to each gateway.
func newModNet(t *testing.T, cfg config.Config, users ...string) *modNet {
	t.Helper()
	n := &modNet{a: parleytest.Start(t, cfg), b: parleytest.Start(t, cfg), users: map[string]*modUser{},
		members: map[string]map[string]*modMember{}, direct: map[string]bool{}}
	for _, u := range users {
		devs := n.a.User(t, u, 2)
		n.users[u] = &modUser{id: u, a: n.dial(t, n.a, devs[0]), b: n.dial(t, n.b, devs[1])}
	}
	return n
}

func (n *modNet) dial(t *testing.T, env *parleytest.Env, dev parleytest.Device) *modDev {
	t.Helper()
	d := &modDev{id: dev.ID, user: dev.User, pushes: map[string][]wire.Message{}, raw: make(chan wire.Message, 16)}
	c, err := client.Dial(ctx(t), env.Addr, dev.ID, dev.Token, client.DialOptions{OnServerFrame: d.onFrame})
	if err != nil {
		t.Fatalf("dial %s: %v", dev.ID, err)
	}
	t.Cleanup(func() { c.Close() })
	d.c = c
	return d
}

// devices returns every connected device, sorted by id.
func (n *modNet) devices() []*modDev {
	var out []*modDev
	for _, u := range n.users {
		out = append(out, u.a, u.b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// memberIDs returns the users the test expects to be current members of
// conv, sorted.
func (n *modNet) memberIDs(conv string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for u := range n.members[conv] {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

func (n *modNet) isMember(conv, user string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.members[conv][user] != nil
}

// head reads conv's head through the admin API (gateway B's).
func (n *modNet) head(t *testing.T, conv string) int64 {
	t.Helper()
	var c struct{ Head int64 }
	if st := n.b.Admin(t, "GET", "/v1/conversations/"+conv, nil, &c); st != http.StatusOK {
		t.Fatalf("GET /v1/conversations/%s: status %d", conv, st)
	}
	return c.Head
}

// createGroup has creator's device on gateway A create group conv with
// members (the creator is its owner) and waits until every other device of
// every member has the creation's join.
func (n *modNet) createGroup(t *testing.T, conv, creator string, members ...string) {
	t.Helper()
	r, err := n.users[creator].a.c.CreateGroup(ctx(t), conv, "", members...)
	if err != nil || r.Head != 1 {
		t.Fatalf("%s creates %s: %s", creator, conv, brief(r, err))
	}
	n.mu.Lock()
	m := map[string]*modMember{creator: {role: wire.RoleOwner, fromSeq: 1}}
	for _, u := range members {
		if u != creator {
			m[u] = &modMember{role: wire.RoleMember, fromSeq: 1}
		}
	}
	n.members[conv] = m
	n.mu.Unlock()
	n.waitPushed(t, conv, 1, n.users[creator].a)
}

// adminGroup creates group conv with members through the admin API (it
// has no owner) and waits for the creation's join on every device.
func (n *modNet) adminGroup(t *testing.T, conv string, members ...string) {
	t.Helper()
	if head := n.a.Group(t, conv, members...); head != 1 {
		t.Fatalf("creating %s: head %d", conv, head)
	}
	n.mu.Lock()
	m := map[string]*modMember{}
	for _, u := range members {
		m[u] = &modMember{role: wire.RoleMember, fromSeq: 1}
	}
	n.members[conv] = m
	n.mu.Unlock()
	n.waitPushed(t, conv, 1, nil)
}

// waitPushed waits until every device of every current member of conv
// (but except) has been pushed seq.
func (n *modNet) waitPushed(t *testing.T, conv string, seq int64, except *modDev) {
	t.Helper()
	for _, d := range n.memberDevices(conv, nil) {
		if d == except {
			continue
		}
		testenv.CheckFor(t, 10*time.Second, 2*time.Millisecond, func() error {
			if len(d.pushesOf(conv, seq-1, seq)) == 0 {
				return fmt.Errorf("%s has no push of %s/%d", d.id, conv, seq)
			}
			return nil
		})
	}
}

// memberDevices returns the devices of the current members of conv and of
// extra users.
func (n *modNet) memberDevices(conv string, extra []string) []*modDev {
	users := map[string]bool{}
	for _, u := range n.memberIDs(conv) {
		users[u] = true
	}
	for _, u := range extra {
		users[u] = true
	}
	var out []*modDev
	for _, d := range n.devices() {
		if users[d.user] {
			out = append(out, d)
		}
	}
	return out
}

// Requests.

func reqRole(conv, user, role string) wire.Request {
	return wire.Request{T: wire.TRole, Conv: conv, User: user, Role: role}
}

func reqRemove(conv string, users ...string) wire.Request {
	return wire.Request{T: wire.TMembersRemove, Conv: conv, Users: users}
}

func reqMute(conv, user string, until int64) wire.Request {
	return wire.Request{T: wire.TMemberMute, Conv: conv, User: user, MutedUntil: until}
}

func reqBan(conv, user string) wire.Request {
	return wire.Request{T: wire.TBan, Conv: conv, User: user}
}

func reqUnban(conv, user string) wire.Request {
	return wire.Request{T: wire.TUnban, Conv: conv, User: user}
}

func reqTitle(conv, title string) wire.Request {
	return wire.Request{T: wire.TConvUpdate, Conv: conv, Title: title}
}

func reqInvite(conv, invite string) wire.Request {
	return wire.Request{T: wire.TConvUpdate, Conv: conv, Invite: invite}
}

func reqAdd(conv string, users ...string) wire.Request {
	return wire.Request{T: wire.TMembersAdd, Conv: conv, Users: users}
}

func reqSend(conv, cmid string) wire.Request {
	return wire.Request{T: wire.TSend, Conv: conv, Cmid: cmid, Body: []byte("body-" + cmid)}
}

func reqRecall(conv string, seq int64) wire.Request {
	return wire.Request{T: wire.TRecall, Conv: conv, Seq: seq}
}

func reqEdit(conv string, seq int64) wire.Request {
	return wire.Request{T: wire.TEdit, Conv: conv, Seq: seq, Body: []byte("edited")}
}

// Expected events (their seqs are filled in by accepted).

func evUpdate(sender string, users []string, u wire.Update) wire.Event {
	return wire.Event{Kind: wire.KindUpdate, Sender: sender, Users: users, Update: u}
}

func evRole(sender, user, role string) wire.Event {
	return evUpdate(sender, []string{user}, wire.Update{Role: role})
}

func evMute(sender, user string, until int64) wire.Event {
	return evUpdate(sender, []string{user}, wire.Update{MutedUntil: &until})
}

func evBanned(sender, user string, banned bool) wire.Event {
	return evUpdate(sender, []string{user}, wire.Update{Banned: &banned})
}

func evLeave(sender string, users ...string) wire.Event {
	return wire.Event{Kind: "leave", Sender: sender, Users: users}
}

func evJoin(sender string, users ...string) wire.Event {
	return wire.Event{Kind: "join", Sender: sender, Users: users}
}

func evMsg(sender, cmid string) wire.Event {
	return wire.Event{Kind: "msg", Sender: sender, Cmid: cmid, Body: []byte("body-" + cmid)}
}

// brief describes a reply in one short line.
func brief(m wire.Message, err error) string {
	switch {
	case m.T == wire.TError:
		return fmt.Sprintf("error %s %q", m.Code, m.Msg)
	case err != nil:
		return err.Error()
	}
	return fmt.Sprintf("%s conv=%s seq=%d head=%d", m.T, m.Conv, m.Seq, m.Head)
}

func ptr[T any](v T) *T { return &v }

// evKey is what a client sees of an event, without its seq and ts.
func evKey(e wire.Event) string {
	users := slices.Clone(e.Users)
	slices.Sort(users)
	s := fmt.Sprintf("%s sender=%q users=%v", e.Kind, e.Sender, users)
	if e.Cmid != "" || len(e.Body) > 0 {
		s += fmt.Sprintf(" cmid=%q body=%q", e.Cmid, e.Body)
	}
	if e.Target != 0 {
		s += fmt.Sprintf(" target=%d", e.Target)
	}
	if e.Recalled {
		s += " recalled"
	}
	if e.Role != "" {
		s += " role=" + e.Role
	}
	if e.MutedUntil != nil {
		s += fmt.Sprintf(" muted_until=%d", *e.MutedUntil)
	}
	if e.Banned != nil {
		s += fmt.Sprintf(" banned=%v", *e.Banned)
	}
	if e.Title != nil {
		s += fmt.Sprintf(" title=%q", *e.Title)
	}
	if e.Invite != "" {
		s += " invite=" + e.Invite
	}
	return s
}

// evFull is evKey with the seq and ts: what must be identical between
// every push of an event and every sync of it.
func evFull(e wire.Event) string { return fmt.Sprintf("%d ts=%d %s", e.Seq, e.Ts, evKey(e)) }

// syncFrom returns every event dev may see in conv above after (all pages).
func syncFrom(t *testing.T, dev *modDev, conv string, after int64) (events []wire.Event, head int64) {
	t.Helper()
	for page := 0; page < 100; page++ {
		p, err := dev.do(wire.Request{T: wire.TSync, Conv: conv, After: after, Limit: 1000, Has: wire.FLimit})
		if err != nil {
			t.Fatalf("%s: sync %s after %d: %v", dev.id, conv, after, err)
		}
		events = append(events, p.Events...)
		head = p.Head
		if !p.More {
			return events, head
		}
		if p.Upto == after {
			time.Sleep(5 * time.Millisecond) // a seq still being committed
		}
		after = p.Upto
	}
	t.Fatalf("%s: sync %s: more than 100 pages", dev.id, conv)
	return nil, 0
}

// accepted has dev send q, which must succeed and append exactly want, in
// order, at the seqs right above the head. Every device of every user
// who is a member before or after the change, dev excepted, must be pushed
// exactly those events, identical on every device, and a sync by each of
// them must return the same; devices of other users and dev itself get no
// push of them. The test's account of the members follows the join, leave
// and update events of want. It returns the reply.
func (n *modNet) accepted(t *testing.T, what, conv string, dev *modDev, q wire.Request, want ...wire.Event) wire.Message {
	t.Helper()
	return n.acceptedDo(t, what, conv, dev, func() (wire.Message, error) { return dev.do(q) }, want...)
}

// acceptedDo is accepted with the change made by do (on dev's behalf; nil:
// through the admin API, so every member's devices are pushed).
func (n *modNet) acceptedDo(t *testing.T, what, conv string, dev *modDev, do func() (wire.Message, error), want ...wire.Event) wire.Message {
	t.Helper()
	before := n.head(t, conv)
	reached := n.memberIDs(conv)
	who := "the admin API"
	if dev != nil {
		who = dev.id
	}
	m, err := do()
	if err != nil {
		t.Fatalf("%s: refused (%s): %v", what, who, err)
	}
	top := before + int64(len(want))
	switch m.T {
	case wire.TUpdateOK, wire.TRecallOK, wire.TSendOK, wire.TEditOK:
		if m.Seq != before+1 {
			t.Fatalf("%s: %s.seq = %d, want %d (head before: %d)", what, m.T, m.Seq, before+1, before)
		}
	case wire.TMembersOK:
		if m.Head != top {
			t.Fatalf("%s: members_ok.head = %d, want %d", what, m.Head, top)
		}
	default:
		t.Fatalf("%s: reply %s to %s", what, brief(m, nil), who)
	}
	if h := n.head(t, conv); h != top {
		t.Fatalf("%s: head %d after the change, want %d (%d before, %d events)", what, h, top, before, len(want))
	}
	for i := range want {
		want[i].Seq = before + 1 + int64(i)
		n.apply(conv, want[i])
		for _, u := range want[i].Users {
			if want[i].Kind == "join" && !slices.Contains(reached, u) {
				reached = append(reached, u)
			}
		}
	}
	var ref []string // the pushes the first device got, in full
	for _, d := range n.devices() {
		if !slices.Contains(reached, d.user) || d == dev {
			continue
		}
		var got []wire.Message
		testenv.CheckFor(t, 10*time.Second, 2*time.Millisecond, func() error {
			if got = d.pushesOf(conv, before, top); len(got) < len(want) {
				return fmt.Errorf("%s: %s has %d of the %d pushes of seqs %d..%d: %v, want %v", what, d.id, len(got), len(want), before+1, top, pushKeys(got), eventKeys(want))
			}
			return nil
		})
		slices.SortFunc(got, func(a, b wire.Message) int { return int(a.Seq - b.Seq) })
		var full []string
		for i, p := range got {
			ev := p.Event()
			if i >= len(want) || ev.Seq != want[i].Seq || evKey(ev) != evKey(want[i]) {
				t.Fatalf("%s: %s was pushed %v, want %v", what, d.id, pushKeys(got), eventKeys(want))
			}
			full = append(full, evFull(ev))
		}
		if ref == nil {
			ref = full
		} else if !slices.Equal(full, ref) {
			t.Fatalf("%s: %s was pushed %v, another device %v", what, d.id, full, ref)
		}
		synced, _ := syncFrom(t, d, conv, before)
		var sfull []string
		for _, ev := range synced {
			if ev.Seq <= top {
				sfull = append(sfull, evFull(ev))
			}
		}
		if !slices.Equal(sfull, ref) {
			t.Fatalf("%s: %s syncs %v, was pushed %v", what, d.id, sfull, ref)
		}
	}
	for _, d := range n.devices() {
		if slices.Contains(reached, d.user) && d != dev {
			continue
		}
		if got := d.pushesOf(conv, before, top); len(got) > 0 {
			t.Fatalf("%s: %s (not to be pushed these) was pushed %v", what, d.id, pushKeys(got))
		}
	}
	return m
}

// apply updates the test's account of conv's members with ev.
func (n *modNet) apply(conv string, ev wire.Event) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.members[conv]
	switch ev.Kind {
	case "join":
		for _, u := range ev.Users {
			if m[u] == nil {
				m[u] = &modMember{role: wire.RoleMember, fromSeq: ev.Seq}
			}
		}
	case "leave":
		for _, u := range ev.Users {
			delete(m, u)
		}
	case wire.KindUpdate:
		for _, u := range ev.Users {
			if m[u] == nil {
				continue
			}
			if ev.Role == wire.RoleOwner {
				for _, o := range m {
					if o.role == wire.RoleOwner {
						o.role = wire.RoleAdmin
					}
				}
			}
			if ev.Role != "" {
				m[u].role = ev.Role
			}
			if ev.MutedUntil != nil {
				m[u].mutedUntil = *ev.MutedUntil
			}
		}
	}
}

func pushKeys(ms []wire.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%d %s", m.Seq, evKey(m.Event())))
	}
	return out
}

func eventKeys(evs []wire.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%d %s", e.Seq, evKey(e)))
	}
	return out
}

// refused has dev send q, which must be refused with code and change
// nothing (see unchanged).
func (n *modNet) refused(t *testing.T, what, conv string, code wire.Code, dev *modDev, q wire.Request) {
	t.Helper()
	before := n.head(t, conv)
	m, err := dev.do(q)
	if wire.CodeOf(err) != code {
		t.Fatalf("%s: %s by %s: %s, want %s", what, q.T, dev.id, brief(m, err), code)
	}
	n.unchanged(t, what, conv, before)
}

// refusedRaw is refused with a frame written as fields are (rawDo).
func (n *modNet) refusedRaw(t *testing.T, what, conv string, code wire.Code, dev *modDev, fields map[string]any) {
	t.Helper()
	before := n.head(t, conv)
	if m := n.rawDo(t, dev, fields); m.T != wire.TError || m.Code != code {
		t.Fatalf("%s: %v by %s: %s, want %s", what, fields, dev.id, brief(m, nil), code)
	}
	n.unchanged(t, what, conv, before)
}

// refusedAdmin has an operator call the admin API, which must answer
// status and change nothing.
func (n *modNet) refusedAdmin(t *testing.T, what, conv string, status int, method, path string, body any) {
	t.Helper()
	before := n.head(t, conv)
	var e struct{ Code, Msg string }
	if st := n.a.Admin(t, method, path, body, &e); st != status {
		t.Fatalf("%s: %s %s: %d %+v, want %d", what, method, path, st, e, status)
	}
	n.unchanged(t, what, conv, before)
}

// putRole sets user's role in conv through the admin API.
func (n *modNet) putRole(t *testing.T, conv, user, role string) func() (wire.Message, error) {
	return func() (wire.Message, error) {
		var out struct {
			Seq       int64
			Code, Msg string
		}
		st := n.a.Admin(t, "PUT", "/v1/conversations/"+conv+"/members/"+user+"/role", map[string]string{"role": role}, &out)
		if st != http.StatusOK {
			return wire.Message{}, fmt.Errorf("PUT role: status %d %s %s", st, out.Code, out.Msg)
		}
		m := wire.Message{T: wire.TUpdateOK, Conv: conv}
		m.Seq = out.Seq
		return m, nil
	}
}

// noop has dev send q, which must succeed without appending anything:
// update_ok.seq (or members_ok.head) is the head.
func (n *modNet) noop(t *testing.T, what, conv string, dev *modDev, q wire.Request) {
	t.Helper()
	before := n.head(t, conv)
	m, err := dev.do(q)
	if err != nil {
		t.Fatalf("%s: %s by %s: %v", what, q.T, dev.id, err)
	}
	if got := max(m.Seq, m.Head); (m.T != wire.TUpdateOK && m.T != wire.TMembersOK) || got != before {
		t.Fatalf("%s: reply %s, want update_ok or members_ok naming the head %d", what, brief(m, nil), before)
	}
	n.unchanged(t, what, conv, before)
}

// unchanged checks that conv still has head before: the admin API says
// so, a member's sync above it is empty, no device was pushed anything
// above it, and a message sent now (by obs if a member, else by the first
// member) takes seq before+1, so no seq was allocated and left a hole;
// every other device of every member gets that message pushed and
// nothing else above before.
func (n *modNet) unchanged(t *testing.T, what, conv string, before int64) {
	t.Helper()
	if h := n.head(t, conv); h != before {
		t.Fatalf("%s moved head %d -> %d", what, before, h)
	}
	members := n.memberIDs(conv)
	marker := "obs"
	if !slices.Contains(members, marker) {
		marker = members[0]
	}
	md := n.users[marker].a
	evs, head := syncFrom(t, md, conv, before)
	if len(evs) > 0 || head != before {
		t.Fatalf("%s: sync above %d returns head %d, events %v", what, before, head, eventKeys(evs))
	}
	cmid := fmt.Sprintf("marker-%d", time.Now().UnixNano())
	r, err := md.do(reqSend(conv, cmid))
	if err != nil || r.Seq != before+1 {
		t.Fatalf("%s: the next message: %s, want seq %d (a seq taken by the refused request?)", what, brief(r, err), before+1)
	}
	for _, d := range n.devices() {
		if d == md || !slices.Contains(members, d.user) {
			continue
		}
		testenv.CheckFor(t, 10*time.Second, 2*time.Millisecond, func() error {
			if len(d.pushesOf(conv, before, before+1)) == 0 {
				return fmt.Errorf("%s: %s has no push of the message %s/%d", what, d.id, conv, before+1)
			}
			return nil
		})
	}
	for _, d := range n.devices() {
		for _, p := range d.pushesOf(conv, before, 1<<62) {
			if p.Seq != before+1 || p.Cmid != cmid {
				t.Fatalf("%s: %s was pushed %s/%d %s", what, d.id, conv, p.Seq, evKey(p.Event()))
			}
		}
	}
}

// memberView is one element of GET /v1/conversations/{id}/members.
type memberView struct {
	User       string `json:"user"`
	Role       string `json:"role"`
	MutedUntil *int64 `json:"muted_until"`
	FromSeq    int64  `json:"from_seq"`
}

// checkMembers compares the admin API's member list of conv with the
// test's account: the same users, roles, from_seq, and muted_until
// exactly for those muted until a time still in the future.
func (n *modNet) checkMembers(t *testing.T, what, conv string) {
	t.Helper()
	var out struct{ Members []memberView }
	if st := n.b.Admin(t, "GET", "/v1/conversations/"+conv+"/members", nil, &out); st != http.StatusOK {
		t.Fatalf("%s: GET members of %s: status %d", what, conv, st)
	}
	var got, want []string
	for _, m := range out.Members {
		s := fmt.Sprintf("%s role=%s from=%d", m.User, m.Role, m.FromSeq)
		if m.MutedUntil != nil && *m.MutedUntil != 0 { // absent and 0 both say "not muted"
			s += fmt.Sprintf(" muted_until=%d", *m.MutedUntil)
		}
		got = append(got, s)
	}
	now := time.Now().UnixMilli()
	n.mu.Lock()
	for u, m := range n.members[conv] {
		s := fmt.Sprintf("%s role=%s from=%d", u, m.role, m.fromSeq)
		if m.mutedUntil > now {
			s += fmt.Sprintf(" muted_until=%d", m.mutedUntil)
		}
		want = append(want, s)
	}
	n.mu.Unlock()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s: members of %s:\n got  %v\n want %v", what, conv, got, want)
	}
}

// rawDo writes a request frame built from fields as they are (so a
// required key can be left out) and returns its reply.
func (n *modNet) rawDo(t *testing.T, dev *modDev, fields map[string]any) wire.Message {
	t.Helper()
	rid := fmt.Sprintf("raw-%d", n.rawN.Add(1))
	fields["rid"] = rid
	if err := dev.c.Write(fields); err != nil {
		t.Fatalf("writing %v: %v", fields, err)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-dev.raw:
			if m.Rid == rid {
				return m
			}
		case <-deadline:
			t.Fatalf("no reply to %v", fields)
		}
	}
}

// modUsers are the users of TestModerationRules: the owner, two admins,
// two plain members, obs (a plain member who sends the markers), out
// (never a member unless added) and x.
var modUsers = []string{"own", "adm", "adm2", "mem", "mem2", "obs", "out", "x"}

// setupRoles makes conv a group of own (its owner), adm and adm2 (admins),
// mem, mem2 and obs (plain members), checking the two role changes.
func (n *modNet) setupRoles(t *testing.T, conv string) {
	t.Helper()
	own := n.users["own"].a
	n.createGroup(t, conv, "own", "adm", "adm2", "mem", "mem2", "obs")
	n.accepted(t, "own makes adm an admin", conv, own, reqRole(conv, "adm", wire.RoleAdmin), evRole("own", "adm", wire.RoleAdmin))
	n.accepted(t, "own makes adm2 an admin", conv, own, reqRole(conv, "adm2", wire.RoleAdmin), evRole("own", "adm2", wire.RoleAdmin))
	n.checkMembers(t, "after the setup", conv)
}

// TestModerationRules checks every rule of "who may" (roles, removals,
// mutes, bans, the conversation's title and invite policy, recalls by
// moderators), direct conversations, malformed requests and the admin
// calls, each allowed and each refused, across two gateways.
func TestModerationRules(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	cfg.RecallWindow = 500 * time.Millisecond
	n := newModNet(t, cfg, modUsers...)
	u := func(id string) *modUser { return n.users[id] }
	own, adm, adm2, mem, mem2, obs, out := u("own"), u("adm"), u("adm2"), u("mem"), u("mem2"), u("obs"), u("out")
	hour := time.Now().Add(time.Hour).UnixMilli()

	t.Run("role", func(t *testing.T) {
		const g = "role"
		n.createGroup(t, g, "own", "adm", "adm2", "mem", "mem2", "obs")
		n.refused(t, "a plain member gives a role", g, wire.Forbidden, mem.b, reqRole(g, "mem2", wire.RoleAdmin))
		n.refused(t, "a plain member makes itself admin", g, wire.Forbidden, mem.b, reqRole(g, "mem", wire.RoleAdmin))
		n.accepted(t, "the owner makes adm an admin", g, own.a, reqRole(g, "adm", wire.RoleAdmin), evRole("own", "adm", wire.RoleAdmin))
		n.noop(t, "the owner gives adm the role it has", g, own.a, reqRole(g, "adm", wire.RoleAdmin))
		n.refused(t, "an admin gives a role", g, wire.Forbidden, adm.a, reqRole(g, "mem", wire.RoleAdmin))
		n.refused(t, "an admin demotes itself", g, wire.Forbidden, adm.a, reqRole(g, "adm", wire.RoleMember))
		n.refused(t, "an admin takes ownership", g, wire.Forbidden, adm.a, reqRole(g, "adm", wire.RoleOwner))
		n.refused(t, "the owner makes itself an admin", g, wire.Forbidden, own.a, reqRole(g, "own", wire.RoleAdmin))
		n.refused(t, "the owner makes itself a member", g, wire.Forbidden, own.a, reqRole(g, "own", wire.RoleMember))
		n.refused(t, "the owner gives a non-member a role", g, wire.NotMember, own.a, reqRole(g, "out", wire.RoleAdmin))
		if _, err := own.a.do(reqRole(g, "out", wire.RoleAdmin)); err == nil || !strings.HasSuffix(err.Error(), "not a member: out") {
			t.Errorf("a role for a non-member: %v, want a message naming the user", err)
		}
		n.refused(t, "a non-member gives a role", g, wire.NotMember, out.a, reqRole(g, "mem", wire.RoleAdmin))
		n.refused(t, "a role in a conversation that does not exist", "role", wire.NotMember, own.a, reqRole("no-such-conv", "adm", wire.RoleAdmin))
		n.accepted(t, "the owner makes mem an admin", g, own.a, reqRole(g, "mem", wire.RoleAdmin), evRole("own", "mem", wire.RoleAdmin))
		n.accepted(t, "the owner makes mem a member again", g, own.a, reqRole(g, "mem", wire.RoleMember), evRole("own", "mem", wire.RoleMember))
		n.checkMembers(t, "before the transfer", g)
		// Transfer: adm becomes the owner, own an admin.
		n.accepted(t, "the owner hands the group to adm", g, own.a, reqRole(g, "adm", wire.RoleOwner), evRole("own", "adm", wire.RoleOwner))
		n.checkMembers(t, "after the transfer", g)
		n.refused(t, "the old owner gives a role", g, wire.Forbidden, own.a, reqRole(g, "mem", wire.RoleAdmin))
		n.refused(t, "the old owner takes ownership back", g, wire.Forbidden, own.a, reqRole(g, "own", wire.RoleOwner))
		n.accepted(t, "the new owner makes adm2 an admin", g, adm.b, reqRole(g, "adm2", wire.RoleAdmin), evRole("adm", "adm2", wire.RoleAdmin))
		n.accepted(t, "the new owner demotes the old one", g, adm.a, reqRole(g, "own", wire.RoleMember), evRole("adm", "own", wire.RoleMember))
		n.refused(t, "the new owner demotes itself", g, wire.Forbidden, adm.a, reqRole(g, "adm", wire.RoleAdmin))
		n.checkMembers(t, "at the end", g)
	})

	t.Run("members_remove", func(t *testing.T) {
		const g = "remove"
		n.setupRoles(t, g)
		n.refused(t, "a plain member removes a member", g, wire.Forbidden, mem.b, reqRemove(g, "mem2"))
		n.refused(t, "a plain member removes itself", g, wire.Forbidden, mem.b, reqRemove(g, "mem"))
		n.refused(t, "an admin removes an admin", g, wire.Forbidden, adm.a, reqRemove(g, "adm2"))
		n.refused(t, "an admin removes the owner", g, wire.Forbidden, adm.a, reqRemove(g, "own"))
		n.refused(t, "an admin removes itself", g, wire.Forbidden, adm.a, reqRemove(g, "adm"))
		n.refused(t, "the owner removes itself", g, wire.Forbidden, own.a, reqRemove(g, "own"))
		n.refused(t, "the owner removes itself and a member", g, wire.Forbidden, own.a, reqRemove(g, "mem", "own"))
		n.refused(t, "an admin removes a member and an admin", g, wire.Forbidden, adm.a, reqRemove(g, "mem", "adm2"))
		n.refused(t, "a non-member removes a member", g, wire.NotMember, out.a, reqRemove(g, "mem"))
		n.refused(t, "a removal in a conversation that does not exist", g, wire.NotMember, own.a, reqRemove("no-such-conv", "mem"))
		n.checkMembers(t, "after the refusals", g)
		n.noop(t, "an admin removes non-members only", g, adm.a, reqRemove(g, "out", "x"))
		n.accepted(t, "an admin removes a member and a non-member", g, adm.a, reqRemove(g, "out", "mem"), evLeave("adm", "mem"))
		n.refused(t, "the removed member sends", g, wire.NotMember, mem.b, reqSend(g, "after-removal"))
		n.refused(t, "the removed member removes", g, wire.NotMember, mem.b, reqRemove(g, "mem2"))
		n.accepted(t, "the owner removes an admin and a member", g, own.a, reqRemove(g, "mem2", "adm2"), evLeave("own", "adm2", "mem2"))
		n.refused(t, "the removed admin removes", g, wire.NotMember, adm2.b, reqRemove(g, "obs"))
		n.checkMembers(t, "after the removals", g)
		// Re-added, mem is a plain member with a new period.
		n.accepted(t, "an admin adds mem back", g, adm.a, reqAdd(g, "mem"), evJoin("adm", "mem"))
		n.checkMembers(t, "after the re-add", g)
	})

	t.Run("member_mute", func(t *testing.T) {
		const g = "mute"
		n.setupRoles(t, g)
		m1 := n.accepted(t, "mem sends", g, mem.b, reqSend(g, "m1"), evMsg("mem", "m1"))
		n.refused(t, "a plain member mutes a member", g, wire.Forbidden, mem2.b, reqMute(g, "mem", hour))
		n.refused(t, "an admin mutes an admin", g, wire.Forbidden, adm.a, reqMute(g, "adm2", hour))
		n.refused(t, "an admin mutes the owner", g, wire.Forbidden, adm.a, reqMute(g, "own", hour))
		n.refused(t, "an admin mutes itself", g, wire.Forbidden, adm.a, reqMute(g, "adm", hour))
		n.refused(t, "the owner mutes itself", g, wire.Forbidden, own.a, reqMute(g, "own", hour))
		n.refused(t, "an admin mutes a non-member", g, wire.NotMember, adm.a, reqMute(g, "out", hour))
		n.refused(t, "a non-member mutes a member", g, wire.NotMember, out.a, reqMute(g, "mem", hour))
		n.accepted(t, "an admin mutes a member", g, adm.a, reqMute(g, "mem", hour), evMute("adm", "mem", hour))
		n.noop(t, "the same mute again", g, adm.a, reqMute(g, "mem", hour))
		n.checkMembers(t, "mem muted", g)
		n.refused(t, "the muted member sends", g, wire.Forbidden, mem.b, reqSend(g, "muted-1"))
		n.refused(t, "the muted member sends from its other device", g, wire.Forbidden, mem.a, reqSend(g, "muted-2"))
		n.refused(t, "the muted member edits", g, wire.Forbidden, mem.b, reqEdit(g, m1.Seq))
		n.accepted(t, "the owner mutes an admin", g, own.a, reqMute(g, "adm2", hour), evMute("own", "adm2", hour))
		n.refused(t, "the muted admin sends", g, wire.Forbidden, adm2.b, reqSend(g, "muted-3"))
		n.accepted(t, "an admin unmutes the member", g, adm.a, reqMute(g, "mem", 0), evMute("adm", "mem", 0))
		n.noop(t, "unmuting again", g, adm.a, reqMute(g, "mem", 0))
		n.accepted(t, "the unmuted member sends", g, mem.b, reqSend(g, "m2"), evMsg("mem", "m2"))
		n.accepted(t, "the unmuted member edits", g, mem.b, reqEdit(g, m1.Seq),
			wire.Event{Kind: "edit", Sender: "mem", Target: m1.Seq, Body: []byte("edited")})
		n.checkMembers(t, "mem unmuted", g)
		// A mute that runs out.
		soon := time.Now().Add(1500 * time.Millisecond).UnixMilli() // room for two replies on a loaded host
		n.accepted(t, "the owner mutes mem2 briefly", g, own.a, reqMute(g, "mem2", soon), evMute("own", "mem2", soon))
		n.refused(t, "mem2 sends while muted", g, wire.Forbidden, mem2.b, reqSend(g, "brief-1"))
		time.Sleep(time.Until(time.UnixMilli(soon + 20))) // the mute running out is what is tested
		n.accepted(t, "mem2 sends once the mute ran out", g, mem2.b, reqSend(g, "brief-2"), evMsg("mem2", "brief-2"))
		n.checkMembers(t, "mem2's mute ran out", g)
		// Removed and added back, a muted member starts unmuted.
		n.accepted(t, "the owner mutes mem2 again", g, own.a, reqMute(g, "mem2", hour), evMute("own", "mem2", hour))
		n.accepted(t, "the owner removes the muted mem2", g, own.a, reqRemove(g, "mem2"), evLeave("own", "mem2"))
		n.accepted(t, "the owner adds mem2 back", g, own.a, reqAdd(g, "mem2"), evJoin("own", "mem2"))
		n.checkMembers(t, "mem2 added back", g)
		n.accepted(t, "mem2, added back, sends", g, mem2.b, reqSend(g, "back"), evMsg("mem2", "back"))
	})

	t.Run("ban", func(t *testing.T) {
		const g = "ban"
		n.setupRoles(t, g)
		n.refused(t, "a plain member bans a member", g, wire.Forbidden, mem2.b, reqBan(g, "mem"))
		n.refused(t, "a plain member bans a non-member", g, wire.Forbidden, mem2.b, reqBan(g, "out"))
		n.refused(t, "a plain member unbans", g, wire.Forbidden, mem2.b, reqUnban(g, "out"))
		n.refused(t, "an admin bans an admin", g, wire.Forbidden, adm.a, reqBan(g, "adm2"))
		n.refused(t, "an admin bans the owner", g, wire.Forbidden, adm.a, reqBan(g, "own"))
		n.refused(t, "an admin bans itself", g, wire.Forbidden, adm.a, reqBan(g, "adm"))
		n.refused(t, "the owner bans itself", g, wire.Forbidden, own.a, reqBan(g, "own"))
		n.refused(t, "an admin bans an unknown user", g, wire.NotFound, adm.a, reqBan(g, "no-such-user"))
		n.refused(t, "a non-member bans", g, wire.NotMember, out.a, reqBan(g, "mem"))
		n.noop(t, "unbanning a user who is not banned", g, adm.a, reqUnban(g, "mem"))
		n.accepted(t, "an admin bans a member", g, adm.a, reqBan(g, "mem"), evBanned("adm", "mem", true), evLeave("adm", "mem"))
		n.checkMembers(t, "mem banned", g)
		n.noop(t, "banning mem again", g, adm.a, reqBan(g, "mem"))
		n.refused(t, "the banned user sends", g, wire.NotMember, mem.b, reqSend(g, "banned-1"))
		n.refused(t, "the owner adds the banned user", g, wire.Forbidden, own.a, reqAdd(g, "mem"))
		n.refused(t, "an admin adds the banned user", g, wire.Forbidden, adm2.a, reqAdd(g, "mem"))
		n.refused(t, "a plain member adds the banned user", g, wire.Forbidden, obs.b, reqAdd(g, "mem"))
		n.refused(t, "the owner adds the banned user and another", g, wire.Forbidden, own.a, reqAdd(g, "out", "mem"))
		n.accepted(t, "the owner bans the admin adm2", g, own.a, reqBan(g, "adm2"), evBanned("own", "adm2", true), evLeave("own", "adm2"))
		n.accepted(t, "an admin bans a non-member before it is added", g, adm.a, reqBan(g, "out"), evBanned("adm", "out", true))
		n.refused(t, "the owner adds the pre-banned user", g, wire.Forbidden, own.a, reqAdd(g, "out"))
		n.accepted(t, "an admin unbans mem", g, adm.a, reqUnban(g, "mem"), evBanned("adm", "mem", false))
		n.noop(t, "unbanning mem again", g, adm.a, reqUnban(g, "mem"))
		n.checkMembers(t, "mem unbanned, not added back", g)
		n.refused(t, "the unbanned user sends (not a member)", g, wire.NotMember, mem.b, reqSend(g, "unbanned-1"))
		n.accepted(t, "a plain member adds the unbanned user", g, obs.b, reqAdd(g, "mem"), evJoin("obs", "mem"))
		n.accepted(t, "mem, added back, sends", g, mem.b, reqSend(g, "back"), evMsg("mem", "back"))
		// Operators are not subject to bans.
		var r struct{ Head int64 }
		before := n.head(t, g)
		if st := n.b.Admin(t, "POST", "/v1/conversations/"+g+"/members", map[string]any{"users": []string{"out"}}, &r); st != http.StatusOK || r.Head != before+1 {
			t.Fatalf("the admin API adds a banned user: status %d, head %d (was %d)", st, r.Head, before)
		}
		n.apply(g, wire.Event{Kind: "join", Seq: before + 1, Users: []string{"out"}})
		n.waitPushed(t, g, before+1, nil)
		n.checkMembers(t, "out added by an operator", g)
	})

	t.Run("conv_update", func(t *testing.T) {
		const g = "update"
		n.setupRoles(t, g)
		n.refused(t, "a plain member sets the title", g, wire.Forbidden, mem.b, reqTitle(g, "mine"))
		n.refused(t, "a plain member sets the invite policy", g, wire.Forbidden, mem.b, reqInvite(g, wire.InviteAll))
		n.refused(t, "a non-member sets the title", g, wire.NotMember, out.a, reqTitle(g, "theirs"))
		n.accepted(t, "an admin sets the title", g, adm.a, reqTitle(g, "Trip"), evUpdate("adm", nil, wire.Update{Title: ptr("Trip")}))
		n.noop(t, "the same title again", g, adm.a, reqTitle(g, "Trip"))
		for _, d := range []*modDev{mem.b, own.a, obs.b} {
			c, err := d.c.Convs(ctx(t), 0, "")
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, it := range c.Items {
				if it.Conv == g {
					found = true
					if it.Title != "Trip" {
						t.Fatalf("%s: convs item of %s has title %q, want Trip", d.id, g, it.Title)
					}
				}
			}
			if !found {
				t.Fatalf("%s: convs lists no %s", d.id, g)
			}
		}
		n.accepted(t, "a plain member adds out (invite: all)", g, mem.b, reqAdd(g, "out"), evJoin("mem", "out"))
		n.accepted(t, "the owner restricts invites to admins", g, own.a, reqInvite(g, wire.InviteAdmins), evUpdate("own", nil, wire.Update{Invite: wire.InviteAdmins}))
		n.noop(t, "the same invite policy again", g, adm.a, reqInvite(g, wire.InviteAdmins))
		n.refused(t, "a plain member adds x (invite: admins)", g, wire.Forbidden, mem.b, reqAdd(g, "x"))
		n.accepted(t, "an admin adds x (invite: admins)", g, adm.a, reqAdd(g, "x"), evJoin("adm", "x"))
		n.accepted(t, "an admin sets title and invite at once", g, adm2.a, wire.Request{T: wire.TConvUpdate, Conv: g, Title: "Trip 2", Invite: wire.InviteAll},
			evUpdate("adm2", nil, wire.Update{Title: ptr("Trip 2"), Invite: wire.InviteAll}))
		n.accepted(t, "the owner removes x", g, own.a, reqRemove(g, "x"), evLeave("own", "x"))
		n.accepted(t, "a plain member adds x (invite: all again)", g, mem.b, reqAdd(g, "x"), evJoin("mem", "x"))
	})

	t.Run("recall", func(t *testing.T) {
		const g = "recall"
		n.setupRoles(t, g)
		r1 := n.accepted(t, "mem2 sends", g, mem2.b, reqSend(g, "r1"), evMsg("mem2", "r1"))
		a1 := n.accepted(t, "adm sends", g, adm.b, reqSend(g, "a1"), evMsg("adm", "a1"))
		m1 := n.accepted(t, "mem sends", g, mem.b, reqSend(g, "m1"), evMsg("mem", "m1"))
		time.Sleep(cfg.RecallWindow + 50*time.Millisecond) // the window passing is what is tested
		n.refused(t, "a plain member recalls another's message", g, wire.NotSender, mem.b, reqRecall(g, r1.Seq))
		n.refused(t, "a plain member recalls its own message after the window", g, wire.RecallWindow, mem2.b, reqRecall(g, r1.Seq))
		n.refused(t, "a non-member recalls", g, wire.NotMember, out.a, reqRecall(g, r1.Seq))
		rc := n.accepted(t, "an admin recalls a member's message after the window", g, adm.a, reqRecall(g, r1.Seq),
			wire.Event{Kind: "recall", Sender: "adm", Target: r1.Seq})
		if rc.Target != r1.Seq {
			t.Fatalf("recall_ok target %d, want %d", rc.Target, r1.Seq)
		}
		before := n.head(t, g)
		if again, err := adm.a.do(reqRecall(g, r1.Seq)); err != nil || again.Seq != rc.Seq {
			t.Fatalf("recalling again: %s, want the first recall_ok (seq %d)", brief(again, err), rc.Seq)
		}
		n.unchanged(t, "recalling a recalled message again", g, before)
		n.accepted(t, "the owner recalls an admin's message", g, own.a, reqRecall(g, a1.Seq),
			wire.Event{Kind: "recall", Sender: "own", Target: a1.Seq})
		n.accepted(t, "another admin recalls a member's message", g, adm2.a, reqRecall(g, m1.Seq),
			wire.Event{Kind: "recall", Sender: "adm2", Target: m1.Seq})
		fresh := n.accepted(t, "mem sends again", g, mem.b, reqSend(g, "m2"), evMsg("mem", "m2"))
		n.refused(t, "a plain member recalls another's fresh message", g, wire.NotSender, obs.b, reqRecall(g, fresh.Seq))
		evs, _ := syncFrom(t, obs.b, g, 0)
		for _, ev := range evs {
			if recalled := ev.Seq == r1.Seq || ev.Seq == a1.Seq || ev.Seq == m1.Seq; ev.Kind == "msg" && (ev.Recalled != recalled || recalled && len(ev.Body) > 0) {
				t.Fatalf("sync after the recalls: %s", evFull(ev))
			}
		}
	})

	t.Run("direct", func(t *testing.T) {
		r, err := own.a.c.CreateDirect(ctx(t), "mem")
		if err != nil {
			t.Fatal(err)
		}
		d := r.Conv
		n.mu.Lock()
		n.members[d] = map[string]*modMember{"own": {role: wire.RoleMember, fromSeq: 1}, "mem": {role: wire.RoleMember, fromSeq: 1}}
		n.direct[d] = true
		n.mu.Unlock()
		n.waitPushed(t, d, 1, own.a)
		m := n.accepted(t, "mem sends in the direct conversation", d, mem.b, reqSend(d, "dm"), evMsg("mem", "dm"))
		for _, c := range []struct {
			what string
			q    wire.Request
		}{
			{"role", reqRole(d, "mem", wire.RoleAdmin)},
			{"role owner", reqRole(d, "mem", wire.RoleOwner)},
			{"members_remove", reqRemove(d, "mem")},
			{"member_mute", reqMute(d, "mem", hour)},
			{"ban", reqBan(d, "mem")},
			{"unban", reqUnban(d, "mem")},
			{"conv_update title", reqTitle(d, "ours")},
			{"conv_update invite", reqInvite(d, wire.InviteAdmins)},
		} {
			n.refused(t, c.what+" in a direct conversation", d, wire.Forbidden, own.a, c.q)
		}
		n.refused(t, "recall of the other's message in a direct conversation", d, wire.NotSender, own.a, reqRecall(d, m.Seq))
		n.checkMembers(t, "a direct conversation", d)
		n.refusedAdmin(t, "PUT role in a direct conversation", d, http.StatusForbidden, "PUT", "/v1/conversations/"+d+"/members/own/role", map[string]string{"role": wire.RoleOwner})
	})

	t.Run("bad_request", func(t *testing.T) {
		const g = "bad"
		n.setupRoles(t, g)
		for _, c := range []struct {
			what string
			q    wire.Request
		}{
			{"role: an unknown role", reqRole(g, "mem", "boss")},
			{"role: an empty role", reqRole(g, "mem", "")},
			{"role: an empty user", reqRole(g, "", wire.RoleAdmin)},
			{"conv_update without title or invite", wire.Request{T: wire.TConvUpdate, Conv: g}},
			{"conv_update: an unknown invite policy", reqInvite(g, "everyone")},
			{"conv_update: a title and an unknown invite policy", wire.Request{T: wire.TConvUpdate, Conv: g, Title: "t", Invite: "friends"}},
			{"member_mute: an empty user", reqMute(g, "", hour)},
			{"ban: an empty user", reqBan(g, "")},
			{"unban: an empty user", reqUnban(g, "")},
			{"ban: an empty conv", reqBan("", "mem")},
		} {
			n.refused(t, c.what, g, wire.BadRequest, own.a, c.q)
		}
		for _, c := range []struct {
			what   string
			fields map[string]any
		}{
			{"role without role", map[string]any{"t": wire.TRole, "conv": g, "user": "mem"}},
			{"role without user", map[string]any{"t": wire.TRole, "conv": g, "role": wire.RoleAdmin}},
			{"role without conv", map[string]any{"t": wire.TRole, "user": "mem", "role": wire.RoleAdmin}},
			{"role: role not a string", map[string]any{"t": wire.TRole, "conv": g, "user": "mem", "role": 1}},
			{"members_remove without users", map[string]any{"t": wire.TMembersRemove, "conv": g}},
			{"members_remove: users not a list", map[string]any{"t": wire.TMembersRemove, "conv": g, "users": "mem"}},
			{"member_mute without muted_until", map[string]any{"t": wire.TMemberMute, "conv": g, "user": "mem"}},
			{"member_mute: muted_until not an integer", map[string]any{"t": wire.TMemberMute, "conv": g, "user": "mem", "muted_until": "soon"}},
			{"ban without user", map[string]any{"t": wire.TBan, "conv": g}},
			{"unban without user", map[string]any{"t": wire.TUnban, "conv": g}},
			{"conv_update without conv", map[string]any{"t": wire.TConvUpdate, "title": "t"}},
			{"conv_update: title not a string", map[string]any{"t": wire.TConvUpdate, "conv": g, "title": 7}},
		} {
			n.refusedRaw(t, c.what, g, wire.BadRequest, own.a, c.fields)
		}
		n.checkMembers(t, "after the bad requests", g)
	})

	t.Run("admin_api", func(t *testing.T) {
		const g = "admin-api"
		n.adminGroup(t, g, "own", "adm", "mem", "obs")
		n.checkMembers(t, "a group created through the admin API", g)
		n.refused(t, "a role in a group without an owner", g, wire.Forbidden, own.a, reqRole(g, "adm", wire.RoleAdmin))
		n.refused(t, "a mute in a group without an owner", g, wire.Forbidden, own.a, reqMute(g, "mem", hour))
		n.refused(t, "a removal in a group without an owner", g, wire.Forbidden, own.a, reqRemove(g, "mem"))
		n.refused(t, "a title in a group without an owner", g, wire.Forbidden, own.a, reqTitle(g, "t"))
		n.acceptedDo(t, "an operator makes own the owner", g, nil, n.putRole(t, g, "own", wire.RoleOwner), evRole("", "own", wire.RoleOwner))
		n.checkMembers(t, "own is the owner", g)
		n.accepted(t, "the owner makes adm an admin", g, own.a, reqRole(g, "adm", wire.RoleAdmin), evRole("own", "adm", wire.RoleAdmin))
		n.acceptedDo(t, "an operator makes mem an admin", g, nil, n.putRole(t, g, "mem", wire.RoleAdmin), evRole("", "mem", wire.RoleAdmin))
		n.acceptedDo(t, "an operator makes mem a member again", g, nil, n.putRole(t, g, "mem", wire.RoleMember), evRole("", "mem", wire.RoleMember))
		n.checkMembers(t, "after the operator's changes", g)
		path := func(conv, user string) string { return "/v1/conversations/" + conv + "/members/" + user + "/role" }
		n.refusedAdmin(t, "PUT role in an unknown conversation", g, http.StatusNotFound, "PUT", path("no-such-conv", "own"), map[string]string{"role": wire.RoleAdmin})
		n.refusedAdmin(t, "PUT role of a non-member", g, http.StatusNotFound, "PUT", path(g, "out"), map[string]string{"role": wire.RoleAdmin})
		n.refusedAdmin(t, "PUT role of an unknown user", g, http.StatusNotFound, "PUT", path(g, "no-such-user"), map[string]string{"role": wire.RoleAdmin})
		n.refusedAdmin(t, "PUT an unknown role", g, http.StatusBadRequest, "PUT", path(g, "mem"), map[string]string{"role": "boss"})
		n.refusedAdmin(t, "PUT an empty role", g, http.StatusBadRequest, "PUT", path(g, "mem"), map[string]string{})
		// A mute shows in the member list while it lasts.
		n.accepted(t, "the owner mutes mem", g, own.a, reqMute(g, "mem", hour), evMute("own", "mem", hour))
		n.checkMembers(t, "mem muted", g)
		// The owner leaves: no owner, admins keep their powers.
		n.accepted(t, "the owner leaves", g, own.b, wire.Request{T: wire.TLeave, Conv: g}, evLeave("own", "own"))
		n.checkMembers(t, "after the owner left", g)
		n.refused(t, "an admin gives a role in a group whose owner left", g, wire.Forbidden, adm.a, reqRole(g, "obs", wire.RoleAdmin))
		n.accepted(t, "an admin unmutes mem in a group whose owner left", g, adm.a, reqMute(g, "mem", 0), evMute("adm", "mem", 0))
		n.acceptedDo(t, "an operator makes adm the owner", g, nil, n.putRole(t, g, "adm", wire.RoleOwner), evRole("", "adm", wire.RoleOwner))
		n.checkMembers(t, "adm is the owner", g)
		n.accepted(t, "the new owner makes obs an admin", g, adm.a, reqRole(g, "obs", wire.RoleAdmin), evRole("adm", "obs", wire.RoleAdmin))
		n.checkMembers(t, "at the end", g)
	})
}

// sendRecord is one send of a racing sender: when it was written, when
// its reply came back, and the reply.
type sendRecord struct {
	issued, done time.Time
	seq          int64
	err          error
}

// racingSender has dev send to conv from workers goroutines, as fast as
// replies come back, until stop is closed, maxSends sends were made, 10 s
// passed, or (if stopAfterNotMember > 0) each worker got that many
// NOT_MEMBER replies. confirmed is closed once warm sends were confirmed.
// wait returns every send made; since counts the sends written after a
// time that were answered so far, confirmed and refused.
func racingSender(dev *modDev, conv string, workers, maxSends, warm, stopAfterNotMember int, stop <-chan struct{}) (wait func() []sendRecord, confirmed <-chan struct{}, since func(time.Time) (ok, refused int)) {
	var mu sync.Mutex
	var recs []sendRecord
	var wg sync.WaitGroup
	var made, ok atomic.Int64
	warmed := make(chan struct{})
	var once sync.Once
	deadline := time.Now().Add(10 * time.Second)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			notMember := 0
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if made.Add(1) > int64(maxSends) || time.Now().After(deadline) {
					return
				}
				issued := time.Now()
				r, err := dev.do(reqSend(conv, fmt.Sprintf("w%d-%d", w, i)))
				rec := sendRecord{issued: issued, done: time.Now(), seq: r.Seq, err: err}
				mu.Lock()
				recs = append(recs, rec)
				mu.Unlock()
				if err == nil && ok.Add(1) == int64(warm) {
					once.Do(func() { close(warmed) })
				}
				if wire.CodeOf(err) == wire.NotMember {
					if notMember++; stopAfterNotMember > 0 && notMember >= stopAfterNotMember {
						return
					}
				}
			}
		}()
	}
	return func() []sendRecord {
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(recs)
		}, warmed, func(from time.Time) (ok, refused int) {
			mu.Lock()
			defer mu.Unlock()
			for _, r := range recs {
				switch {
				case !r.issued.After(from):
				case r.err == nil:
					ok++
				default:
					refused++
				}
			}
			return ok, refused
		}
}

// warmedUp waits (at most 10 s) until warm, a racing sender's, is
// closed: its first sends were confirmed. prefix starts the failure.
func warmedUp(t *testing.T, prefix string, warm <-chan struct{}) {
	t.Helper()
	select {
	case <-warm:
	case <-time.After(10 * time.Second):
		t.Fatalf("%sthe sender's first sends were not confirmed", prefix)
	}
}

// logHoldsConfirmed checks that the seqs of mem's messages stored in the
// log are exactly those of its confirmed sends (it sorts both). prefix
// starts the failure.
func logHoldsConfirmed(t *testing.T, prefix string, stored, confirmed []int64) {
	t.Helper()
	slices.Sort(stored)
	slices.Sort(confirmed)
	if !slices.Equal(stored, confirmed) {
		t.Errorf("%sthe log holds %d messages of mem, %d were confirmed (first difference: %v)", prefix, len(stored), len(confirmed), firstDiff(stored, confirmed))
	}
}

// TestModerationMuteRacingSends: a member sends as fast as it can on
// gateway B while the owner, on gateway A, mutes and unmutes it a few
// times. No send is confirmed with a seq between a mute and the unmute
// after it; a send written after the mute's update_ok came back is never
// confirmed before the unmute, one written after the unmute's update_ok
// is never refused; the log holds exactly the confirmed sends.
func TestModerationMuteRacingSends(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	n := newModNet(t, cfg, "own", "mem", "obs")
	const g = "mute-race"
	n.createGroup(t, g, "own", "mem", "obs")
	own, mem, obs := n.users["own"].a, n.users["mem"].b, n.users["obs"].b

	// Refused sends are answered in well under a millisecond: the bound
	// is generous, so that the sender outlasts the mutes.
	stop := make(chan struct{})
	wait, warm, since := racingSender(mem, g, 2, 20000, 5, 0, stop)
	warmedUp(t, "", warm)
	type window struct {
		muteIssued, muteDone, unmuteIssued, unmuteDone time.Time
		mute, unmute                                   int64
		until                                          int64
	}
	var windows []window
	for i := 0; i < 4; i++ {
		w := window{until: time.Now().Add(time.Hour).UnixMilli() + int64(i)}
		w.muteIssued = time.Now()
		r, err := own.do(reqMute(g, "mem", w.until))
		w.muteDone = time.Now()
		if err != nil || r.T != wire.TUpdateOK {
			t.Fatalf("mute %d: %s", i, brief(r, err))
		}
		w.mute = r.Seq
		// Muted for at least 30 ms and until a send written since was
		// answered (bounded): every window sees sends.
		settle(t, fmt.Sprintf("window %d: a send written after the mute's update_ok refused", i), 30*time.Millisecond,
			func() bool { _, refused := since(w.muteDone); return refused > 0 })
		w.unmuteIssued = time.Now()
		r, err = own.do(reqMute(g, "mem", 0))
		w.unmuteDone = time.Now()
		if err != nil || r.T != wire.TUpdateOK {
			t.Fatalf("unmute %d: %s", i, brief(r, err))
		}
		w.unmute = r.Seq
		windows = append(windows, w)
		settle(t, fmt.Sprintf("window %d: a send written after the unmute's update_ok confirmed", i), 30*time.Millisecond,
			func() bool { ok, _ := since(w.unmuteDone); return ok > 0 })
	}
	stopped := time.Now()
	close(stop)
	sends := wait()

	var confirmed []int64
	refused := 0
	for _, s := range sends {
		switch {
		case s.err == nil:
			confirmed = append(confirmed, s.seq)
		case wire.CodeOf(s.err) == wire.Forbidden:
			refused++
		default:
			t.Errorf("a send of the muted member: %v, want send_ok or FORBIDDEN", s.err)
		}
	}
	t.Logf("%d sends: %d confirmed, %d refused", len(sends), len(confirmed), refused)
	for i, w := range windows {
		t.Logf("window %d: mute at seq %d (update_ok after %v), unmute at seq %d %v later (update_ok after %v)",
			i, w.mute, w.muteDone.Sub(w.muteIssued), w.unmute, w.unmuteIssued.Sub(w.muteDone), w.unmuteDone.Sub(w.unmuteIssued))
	}
	for i, w := range windows {
		if w.unmute <= w.mute {
			t.Fatalf("window %d: unmute seq %d not above mute seq %d", i, w.unmute, w.mute)
		}
		next := stopped
		if i+1 < len(windows) {
			next = windows[i+1].muteIssued
		}
		refusedIn, confirmedAfter := 0, 0
		for _, s := range sends {
			if s.err == nil && s.seq > w.mute && s.seq < w.unmute {
				t.Errorf("window %d: a send confirmed with seq %d, between the mute at %d and the unmute at %d", i, s.seq, w.mute, w.unmute)
			}
			if s.err == nil && s.issued.After(w.muteDone) && s.seq < w.mute {
				t.Errorf("window %d: a send written %v after the mute's update_ok came back was confirmed with seq %d, below the mute's %d",
					i, s.issued.Sub(w.muteDone), s.seq, w.mute)
			}
			if s.issued.After(w.muteDone) && s.done.Before(w.unmuteIssued) {
				if s.err == nil {
					t.Errorf("window %d: a send written after the mute's update_ok and answered before the unmute was sent was confirmed (seq %d)", i, s.seq)
				} else {
					refusedIn++
				}
			}
			if s.issued.After(w.unmuteDone) && s.done.Before(next) {
				if s.err != nil {
					t.Errorf("window %d: a send written after the unmute's update_ok came back was refused: %v", i, s.err)
				} else {
					confirmedAfter++
				}
			}
		}
		if refusedIn == 0 || confirmedAfter == 0 {
			t.Errorf("window %d: %d sends refused while muted, %d confirmed after the unmute: the race did not happen", i, refusedIn, confirmedAfter)
		}
	}

	// The log: exactly the confirmed sends, the mutes and unmutes, and no
	// seq taken by a refused send (obs sees every seq since 1).
	evs, head := syncFrom(t, obs, g, 0)
	var stored []int64
	updates := map[int64]int64{}
	for _, ev := range evs {
		switch {
		case ev.Kind == "msg" && ev.Sender == "mem":
			stored = append(stored, ev.Seq)
		case ev.Kind == wire.KindUpdate:
			if ev.Sender != "own" || !slices.Equal(ev.Users, []string{"mem"}) || ev.MutedUntil == nil {
				t.Errorf("update event %s", evFull(ev))
				continue
			}
			updates[ev.Seq] = *ev.MutedUntil
		}
	}
	logHoldsConfirmed(t, "", stored, confirmed)
	for i, w := range windows {
		if u, ok := updates[w.mute]; !ok || u != w.until {
			t.Errorf("window %d: the mute at %d is %v in the log, want muted_until %d", i, w.mute, u, w.until)
		}
		if u, ok := updates[w.unmute]; !ok || u != 0 {
			t.Errorf("window %d: the unmute at %d is %v in the log, want muted_until 0", i, w.unmute, u)
		}
	}
	if len(updates) != 2*len(windows) {
		t.Errorf("%d update events in the log, want %d", len(updates), 2*len(windows))
	}
	// A refused send takes no seq, but for the one exception of
	// docs/protocol.md §3: a send already on its way when the mute
	// committed (allocated after the mute's seq by a gateway that had not
	// heard of it yet) is refused at the commit and its seq is a hole. So
	// holes may only lie strictly between a mute and its unmute: a send
	// below the mute's seq is judged by its seq and accepted, whenever it
	// commits.
	t.Run("holes_only_inside_mutes", func(t *testing.T) {
		seen := map[int64]bool{}
		for _, ev := range evs {
			seen[ev.Seq] = true
		}
		var holes, outside []int64
		for s := int64(1); s <= head; s++ {
			if seen[s] {
				continue
			}
			holes = append(holes, s)
			inside := false
			for _, w := range windows {
				inside = inside || (s > w.mute && s < w.unmute)
			}
			if !inside {
				outside = append(outside, s)
			}
		}
		t.Logf("%d holes of 1..%d: %v", len(holes), head, holes)
		if len(outside) > 0 {
			t.Errorf("seqs %v of 1..%d are holes outside every muted interval (mute/unmute seqs: %v)", outside, head, updates)
		}
	})
}

// settle waits at least min, then until cond holds (at most 5 s; then
// the test fails with what, and goes on).
func settle(t *testing.T, what string, min time.Duration, cond func() bool) {
	t.Helper()
	time.Sleep(min)
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("%s: not within 5 s", what)
			return
		}
	}
}

// firstDiff describes where two sorted lists of seqs first differ.
func firstDiff(a, b []int64) string {
	for i := 0; i < len(a) || i < len(b); i++ {
		switch {
		case i >= len(a):
			return fmt.Sprintf("%d only in the second", b[i])
		case i >= len(b):
			return fmt.Sprintf("%d only in the first", a[i])
		case a[i] != b[i]:
			return fmt.Sprintf("%d vs %d at index %d", a[i], b[i], i)
		}
	}
	return "none"
}

// TestModerationBanRacingAdd: an admin on gateway A bans x while a member
// on gateway B adds x, at once, several times. Either the add came first
// (x joined, then the ban removed x: update then leave) or it is refused
// FORBIDDEN; x never ends banned and a member.
func TestModerationBanRacingAdd(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	n := newModNet(t, cfg, "own", "adm", "obs", "x")
	const g = "ban-race"
	n.createGroup(t, g, "own", "adm", "obs")
	adm := n.users["adm"].a
	n.accepted(t, "own makes adm an admin", g, n.users["own"].a, reqRole(g, "adm", wire.RoleAdmin), evRole("own", "adm", wire.RoleAdmin))
	obs, x := n.users["obs"].b, n.users["x"]
	const rounds = 16
	addWon := 0
	for round := 0; round < rounds; round++ {
		adder := n.users["obs"].b
		if round%2 == 1 {
			adder = n.users["own"].b
		}
		before := n.head(t, g)
		start := make(chan struct{})
		var wg sync.WaitGroup
		var banR, addR wire.Message
		var banErr, addErr error
		wg.Add(2)
		go func() { defer wg.Done(); <-start; banR, banErr = adm.do(reqBan(g, "x")) }()
		go func() { defer wg.Done(); <-start; addR, addErr = adder.do(reqAdd(g, "x")) }()
		close(start)
		wg.Wait()
		if banErr != nil || banR.T != wire.TUpdateOK {
			t.Fatalf("round %d: ban: %s", round, brief(banR, banErr))
		}
		if addErr != nil && wire.CodeOf(addErr) != wire.Forbidden {
			t.Fatalf("round %d: add: %v, want members_ok or FORBIDDEN", round, addErr)
		}
		evs, head := syncFrom(t, obs, g, before)
		var got []string
		for _, ev := range evs {
			got = append(got, fmt.Sprintf("%d %s", ev.Seq-before, evKey(ev)))
		}
		var want []string
		if addErr == nil {
			addWon++
			want = []string{
				"1 " + evKey(evJoin(adder.user, "x")),
				"2 " + evKey(evBanned("adm", "x", true)),
				"3 " + evKey(evLeave("adm", "x")),
			}
			if banR.Seq != before+2 || addR.Head < before+1 {
				t.Fatalf("round %d: the add (head %d) came first, but the ban's update_ok.seq is %d (head before %d)", round, addR.Head, banR.Seq, before)
			}
		} else {
			want = []string{"1 " + evKey(evBanned("adm", "x", true))}
			if banR.Seq != before+1 {
				t.Fatalf("round %d: ban's update_ok.seq %d, want %d", round, banR.Seq, before+1)
			}
		}
		if !slices.Equal(got, want) || head != before+int64(len(want)) {
			t.Fatalf("round %d (add %s): log above %d: %v (head %d), want %v", round, brief(addR, addErr), before, got, head, want)
		}
		// x is banned and not a member.
		n.checkMembers(t, fmt.Sprintf("round %d", round), g)
		if r, err := x.b.do(reqSend(g, fmt.Sprintf("x-%d", round))); wire.CodeOf(err) != wire.NotMember {
			t.Fatalf("round %d: x sends: %s, want NOT_MEMBER", round, brief(r, err))
		}
		n.refused(t, fmt.Sprintf("round %d: the owner adds the banned x", round), g, wire.Forbidden, n.users["own"].a, reqAdd(g, "x"))
		if r, err := adm.do(reqUnban(g, "x")); err != nil || r.T != wire.TUpdateOK || r.Seq != n.head(t, g) {
			t.Fatalf("round %d: unban: %s", round, brief(r, err))
		}
	}
	t.Logf("the add came first in %d of %d rounds", addWon, rounds)
	// x's devices got nothing outside x's periods.
	evs, _ := syncFrom(t, obs, g, 0)
	in := map[int64]bool{}
	var from int64 = -1
	for _, ev := range evs {
		if ev.Kind == "join" && slices.Contains(ev.Users, "x") {
			from = ev.Seq
		}
		if from >= 0 {
			in[ev.Seq] = true
		}
		if ev.Kind == "leave" && slices.Contains(ev.Users, "x") {
			from = -1
		}
	}
	for _, d := range []*modDev{x.a, x.b} {
		for _, p := range d.pushesOf(g, 0, 1<<62) {
			if !in[p.Seq] {
				t.Errorf("%s was pushed %d %s, outside x's periods", d.id, p.Seq, evKey(p.Event()))
			}
		}
	}
}

// TestModerationTierInvariance: the same moderation history in a group of
// each fan-out tier (thresholds set small) gives every member's devices
// the same pushes and the same sync: only the tier differs.
func TestModerationTierInvariance(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	cfg.WriteFanoutMax, cfg.OnlineFanoutMax = 5, 7 // push below 5 members, pull above 7
	fillers := []string{"f0", "f1", "f2", "f3", "f4", "f5"}
	n := newModNet(t, cfg, append([]string{"own", "adm", "mem", "obs"}, fillers...)...)
	u := func(id string) *modDev { return n.users[id].a }
	hour := time.Now().Add(time.Hour).UnixMilli()
	groups := []struct {
		conv, mode string
		extra      []string
	}{
		{"t-push", "push", nil},             // 4 members (3 while mem is out)
		{"t-online", "online", fillers[:2]}, // 6 (5)
		{"t-pull", "pull", fillers},         // 10 (9)
	}
	views := map[string]string{}
	for _, gr := range groups {
		g := gr.conv
		n.createGroup(t, g, "own", append([]string{"adm", "mem", "obs"}, gr.extra...)...)
		mode := func(when string) {
			t.Helper()
			var c struct{ Mode string }
			if st := n.b.Admin(t, "GET", "/v1/conversations/"+g, nil, &c); st != http.StatusOK || c.Mode != gr.mode {
				t.Fatalf("%s %s: mode %q (status %d), want %q", g, when, c.Mode, st, gr.mode)
			}
		}
		mode("at the start")
		n.accepted(t, g+": own makes adm an admin", g, u("own"), reqRole(g, "adm", wire.RoleAdmin), evRole("own", "adm", wire.RoleAdmin))
		n.accepted(t, g+": adm mutes mem", g, u("adm"), reqMute(g, "mem", hour), evMute("adm", "mem", hour))
		n.refused(t, g+": the muted mem sends", g, wire.Forbidden, n.users["mem"].b, reqSend(g, "muted"))
		n.accepted(t, g+": adm unmutes mem", g, u("adm"), reqMute(g, "mem", 0), evMute("adm", "mem", 0))
		m := n.accepted(t, g+": mem sends", g, n.users["mem"].b, reqSend(g, "m1"), evMsg("mem", "m1"))
		n.accepted(t, g+": adm recalls it", g, u("adm"), reqRecall(g, m.Seq), wire.Event{Kind: "recall", Sender: "adm", Target: m.Seq})
		n.accepted(t, g+": adm sets the title", g, u("adm"), reqTitle(g, "Tiers"), evUpdate("adm", nil, wire.Update{Title: ptr("Tiers")}))
		n.accepted(t, g+": own restricts invites", g, u("own"), reqInvite(g, wire.InviteAdmins), evUpdate("own", nil, wire.Update{Invite: wire.InviteAdmins}))
		n.accepted(t, g+": adm bans mem", g, u("adm"), reqBan(g, "mem"), evBanned("adm", "mem", true), evLeave("adm", "mem"))
		mode("with mem banned")
		n.refused(t, g+": obs adds mem", g, wire.Forbidden, n.users["obs"].b, reqAdd(g, "mem"))
		n.accepted(t, g+": own unbans mem", g, u("own"), reqUnban(g, "mem"), evBanned("own", "mem", false))
		n.accepted(t, g+": adm adds mem back", g, u("adm"), reqAdd(g, "mem"), evJoin("adm", "mem"))
		n.accepted(t, g+": own hands the group to adm", g, u("own"), reqRole(g, "adm", wire.RoleOwner), evRole("own", "adm", wire.RoleOwner))
		n.checkMembers(t, g+" at the end", g)
		mode("at the end")

		// What the four users' devices saw, above the creation (whose
		// join lists the fillers): pushes and sync.
		var view strings.Builder
		for _, id := range []string{"own", "adm", "mem", "obs"} {
			for _, d := range []*modDev{n.users[id].a, n.users[id].b} {
				pushes := d.pushesOf(g, 1, 1<<62)
				slices.SortFunc(pushes, func(a, b wire.Message) int { return int(a.Seq - b.Seq) })
				fmt.Fprintf(&view, "%s pushed:", d.id)
				for _, p := range pushes {
					fmt.Fprintf(&view, " [%d %s]", p.Seq, tierKey(p.Event()))
				}
				evs, head := syncFrom(t, d, g, 1)
				fmt.Fprintf(&view, "\n%s synced (head %d):", d.id, head)
				for _, ev := range evs {
					fmt.Fprintf(&view, " [%d %s]", ev.Seq, tierKey(ev))
				}
				view.WriteString("\n")
			}
		}
		views[g] = view.String()
	}
	for _, gr := range groups[1:] {
		if views[gr.conv] != views[groups[0].conv] {
			t.Errorf("%s (%s) differs from %s (%s):\n%s\nvs\n%s", gr.conv, gr.mode, groups[0].conv, groups[0].mode, views[gr.conv], views[groups[0].conv])
		}
	}
}

// tierKey is evKey with the markers' cmids and bodies (which hold a
// time) left out.
func tierKey(e wire.Event) string {
	if strings.HasPrefix(e.Cmid, "marker-") {
		e.Cmid, e.Body = "marker", nil
	}
	return evKey(e)
}

// TestModerationRemovalRacingSends: a member sends as fast as it can on
// gateway B while the owner removes it (members_remove) on gateway A,
// several times. Every send confirmed has a seq below the leave; nothing
// of the member's is stored above it; every send written after the
// removal's members_ok came back is refused NOT_MEMBER; the member's
// devices get the leave and nothing after it.
func TestModerationRemovalRacingSends(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	n := newModNet(t, cfg, "own", "mem", "obs")
	own, mem, obs := n.users["own"], n.users["mem"], n.users["obs"]
	const iterations = 8
	for it := 0; it < iterations; it++ {
		g := fmt.Sprintf("rm-race-%d", it)
		n.createGroup(t, g, "own", "mem", "obs")
		wait, warm, _ := racingSender(mem.b, g, 2, 1000, 4, 3, nil)
		warmedUp(t, fmt.Sprintf("iteration %d: ", it), warm)
		r, err := own.a.do(reqRemove(g, "mem"))
		removed := time.Now()
		if err != nil || r.T != wire.TMembersOK {
			t.Fatalf("iteration %d: removal: %s", it, brief(r, err))
		}
		sends := wait()

		evs, _ := syncFrom(t, obs.b, g, 0)
		var leave int64
		var stored []int64
		for _, ev := range evs {
			switch {
			case ev.Kind == "leave":
				if leave != 0 || ev.Sender != "own" || !slices.Equal(ev.Users, []string{"mem"}) {
					t.Fatalf("iteration %d: leave event %s (another at %d)", it, evFull(ev), leave)
				}
				leave = ev.Seq
			case ev.Sender == "mem":
				stored = append(stored, ev.Seq)
			}
		}
		if leave == 0 || r.Head < leave {
			t.Fatalf("iteration %d: leave at %d, members_ok.head %d", it, leave, r.Head)
		}
		var confirmed []int64
		for _, s := range sends {
			switch {
			case s.err == nil:
				confirmed = append(confirmed, s.seq)
				if s.seq > leave {
					t.Errorf("iteration %d: a send of mem confirmed with seq %d, after mem's leave at %d", it, s.seq, leave)
				}
				if s.issued.After(removed) {
					t.Errorf("iteration %d: a send written after members_ok came back was confirmed (seq %d)", it, s.seq)
				}
			case wire.CodeOf(s.err) != wire.NotMember:
				t.Errorf("iteration %d: a send of mem: %v, want send_ok or NOT_MEMBER", it, s.err)
			}
		}
		for _, s := range stored {
			if s > leave {
				t.Errorf("iteration %d: an event of mem stored at %d, above mem's leave at %d", it, s, leave)
			}
		}
		logHoldsConfirmed(t, fmt.Sprintf("iteration %d: ", it), stored, confirmed)
		// Both of mem's devices get the leave (mem.b sent the messages,
		// not the removal); after a message that reached every device,
		// none of them got anything above it.
		n.apply(g, wire.Event{Kind: "leave", Seq: leave, Users: []string{"mem"}})
		for _, d := range []*modDev{mem.a, mem.b} {
			testenv.CheckFor(t, 10*time.Second, 2*time.Millisecond, func() error {
				for _, p := range d.pushesOf(g, leave-1, leave) {
					if p.Kind == "leave" {
						return nil
					}
				}
				return fmt.Errorf("iteration %d: %s has no push of its leave at %d", it, d.id, leave)
			})
		}
		n.unchanged(t, fmt.Sprintf("iteration %d: after the race", it), g, n.head(t, g))
		for _, d := range []*modDev{mem.a, mem.b} {
			if got := d.pushesOf(g, leave, 1<<62); len(got) > 0 {
				t.Errorf("iteration %d: %s was pushed %v after its leave at %d", it, d.id, pushKeys(got), leave)
			}
		}
	}
}
