package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
)

// Conversation is a conversation row plus its derived head.
type Conversation struct {
	ID      string
	Kind    string // "group" or "direct"
	Title   string
	Epoch   int64
	MinSeq  int64
	Members int64 // current member count
	Head    int64
}

// MembershipChange is one conv_create, members_add, leave/removal or
// recall: an event of the conversation's log that is not a message.
//
// Changes are ordered with the conversation's sends (docs/consistency.md,
// "Membership changes and sends"): the store takes the conversation's
// change lock, checks the change, and only then calls Alloc for the
// event's seq, so a refused change allocates nothing, and every message
// committed before the change has a lower seq and every message committed
// after it a higher one. Without Alloc (tests, and conv_create, whose
// join is seq 1) Seq is used as given. ErrSeqTaken asks the caller to
// re-seed its counter and retry.
type MembershipChange struct {
	Conv  string
	Actor string // user who made the change; "" for the admin API
	Ts    int64
	// Alloc allocates the event's seq; the store calls it at most once,
	// under the change lock, after the change was checked.
	Alloc func(ctx context.Context) (int64, error)
	// Seq is the event's seq: given (without Alloc), or set by the store
	// once Alloc returned (also when the change then failed, so the
	// caller can record it as a hole).
	Seq int64
	// BeforeLeave, if set, is called with the users a leave event
	// removes, once the removal was checked and right before its seq is
	// allocated.
	BeforeLeave func(ctx context.Context, users []string) error
}

// NewConversation is a conversation to create: its join event is seq 1,
// made by Actor ("" for the admin API), who must be among Members.
type NewConversation struct {
	ID, Kind, Title, Actor string
	Members                []string // distinct
}

// CreateConversation creates conversation ch.Conv with members and
// appends their join event at ch.Seq (1). It returns ErrExists if the id
// is taken, ErrUnknownUser if a member is not a user.
func (s *Store) CreateConversation(ctx context.Context, ch MembershipChange, kind, title string, members []string) error {
	return s.CreateConversations(ctx, []NewConversation{{ID: ch.Conv, Kind: kind, Title: title, Actor: ch.Actor, Members: members}}, ch.Ts)
}

// CreateConversations creates every conversation of cs, or none of them
// (one transaction): ErrExists (naming the id) if one is taken or named
// twice, ErrUnknownUser (naming the user) if a member is not a user.
func (s *Store) CreateConversations(ctx context.Context, cs []NewConversation, ts int64) error {
	var ids, kinds, titles, actors, pairConvs, pairUsers []string
	var counts []int64
	for _, c := range cs {
		ids, kinds, titles, actors = append(ids, c.ID), append(kinds, c.Kind), append(titles, c.Title), append(actors, c.Actor)
		counts = append(counts, int64(len(c.Members)))
		for _, u := range c.Members {
			pairConvs, pairUsers = append(pairConvs, c.ID), append(pairUsers, u)
		}
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `INSERT INTO conversations (conv_id, kind, title, member_count)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int[]) ON CONFLICT DO NOTHING RETURNING conv_id`,
			ids, kinds, titles, counts)
		if err != nil {
			return err
		}
		created, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(created) != len(ids) {
			made := make(map[string]bool, len(created))
			for _, id := range created {
				made[id] = true
			}
			for _, id := range ids {
				if !made[id] {
					return fmt.Errorf("%w: %s", ErrExists, id)
				}
				delete(made, id) // an id named twice is taken by its first
			}
		}
		if missing, err := missingUserTx(ctx, tx, pairUsers); err != nil {
			return err
		} else if missing != "" {
			return fmt.Errorf("%w: %s", ErrUnknownUser, missing)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO events (conv_key, seq, kind, sender, ts, users)
			SELECT k.conv_key, 1, $5, c.actor, $6, coalesce(m.users, '{}')
			  FROM unnest($1::text[], $2::text[]) AS c(id, actor)
			  JOIN conversations k ON k.conv_id = c.id
			  LEFT JOIN (SELECT conv, array_agg(u ORDER BY i) AS users FROM unnest($3::text[], $4::text[]) WITH ORDINALITY AS p(conv, u, i) GROUP BY conv) m
			    ON m.conv = c.id`, ids, actors, pairConvs, pairUsers, KindJoin, ts); err != nil {
			return err
		}
		// The creator of a group (its actor) owns it.
		_, err = tx.Exec(ctx, `INSERT INTO membership_periods (conv_id, user_id, from_seq, role)
			SELECT p.c, p.u, 1, CASE WHEN c.kind = 'group' AND c.actor = p.u THEN $5::smallint ELSE 0 END
			  FROM unnest($1::text[], $2::text[]) AS p(c, u)
			  JOIN unnest($3::text[], $4::text[], $6::text[]) AS c(id, actor, kind) ON c.id = p.c`,
			pairConvs, pairUsers, ids, actors, RoleOwner, kinds)
		return err
	})
}

// AddMembers adds users to the conversation and appends one join event
// listing those that were not members yet; it returns them (none, and no
// event and no seq, if all of them already are). The actor, if any, must
// be a current member (ErrNotMember); an unknown conversation is
// ErrNotFound, an unknown user ErrUnknownUser. head is the conversation's
// head after the change.
func (s *Store) AddMembers(ctx context.Context, ch *MembershipChange, users []string) (head, members int64, added []string, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		actor, err := lockActor(ctx, tx, ch)
		if err != nil {
			return err
		}
		if missing, err := missingUserTx(ctx, tx, users); err != nil {
			return err
		} else if missing != "" {
			return fmt.Errorf("%w: %s", ErrUnknownUser, missing)
		}
		rows, err := tx.Query(ctx, `SELECT DISTINCT u FROM unnest($2::text[]) u
			WHERE NOT EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = $1 AND m.user_id = u AND m.to_seq IS NULL) ORDER BY u`,
			ch.Conv, users)
		if err != nil {
			return err
		}
		added, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(added) > 0 {
			if err := checkAdd(ctx, tx, ch, actor, added); err != nil {
				return err
			}
			if err := allocate(ctx, tx, ch); err != nil {
				return err
			}
			if err := insertMembershipEvent(ctx, tx, *ch, KindJoin, added); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO membership_periods (conv_id, user_id, from_seq) SELECT $1, u, $2 FROM unnest($3::text[]) u`,
				ch.Conv, ch.Seq, added); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE conversations SET member_count = member_count + $2 WHERE conv_id = $1`, ch.Conv, len(added)); err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, `SELECT `+headSQL+`, c.member_count FROM conversations c WHERE c.conv_id = $1`,
			ch.Conv).Scan(&head, &members)
	})
	if err != nil {
		added = nil
	}
	return head, members, added, err
}

// RemoveMember closes user's current membership period at the leave
// event's seq and appends the event. ErrNotMember if user (or the actor,
// if any) is not a current member; ErrNotFound for an unknown
// conversation. head is the conversation's head after the change.
func (s *Store) RemoveMember(ctx context.Context, ch *MembershipChange, user string) (head, members int64, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockConversation(ctx, tx, ch); err != nil {
			return err
		}
		if _, ok, err := memberOf(ctx, tx, ch.Conv, user); err != nil {
			return err
		} else if !ok {
			return ErrNotMember
		}
		if err := closePeriods(ctx, tx, ch, []string{user}); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT `+headSQL+`, c.member_count FROM conversations c WHERE c.conv_id = $1`, ch.Conv).Scan(&head, &members)
	})
	return head, members, err
}

// changeLockKey is the key of conv's change lock, a transaction-level
// PostgreSQL advisory lock: membership changes, recalls, role and
// moderation changes take it exclusively; each batch of sends, and each
// edit, shared (store/events.go, store/edit.go). A hash collision of two
// conversations only makes one wait for the other.
func changeLockKey(conv string) int64 {
	h := fnv.New64a()
	h.Write([]byte(conv))
	return int64(h.Sum64())
}

// lockConversation takes the conversation's change lock exclusively (the
// conversation's sends wait until this transaction ends, and the changes
// of one conversation are serialized by it), then checks that the
// conversation exists (ErrNotFound) and that the actor, if any, is a
// current member (ErrNotMember).
func lockConversation(ctx context.Context, tx pgx.Tx, ch *MembershipChange) error {
	_, err := lockActor(ctx, tx, ch)
	return err
}

// lockActor is lockConversation, and returns the actor's membership (the
// zero member for the admin API, actor ""), read once for the change's
// own checks (role, mute).
func lockActor(ctx context.Context, tx pgx.Tx, ch *MembershipChange) (member, error) {
	return lockActorAs(ctx, tx, ch, `SELECT pg_advisory_xact_lock($1)`)
}

// lockActorShared is lockActor with the change lock taken shared, as send
// batches take it: for a change that is ordered with membership changes
// (the actor stays a member, with the role and mute read, until it
// commits) but neither changes membership nor waits for sends (edits).
func lockActorShared(ctx context.Context, tx pgx.Tx, ch *MembershipChange) (member, error) {
	return lockActorAs(ctx, tx, ch, `SELECT pg_advisory_xact_lock_shared($1)`)
}

// lockActorAs is lockActor with the change lock taken by lockSQL.
func lockActorAs(ctx context.Context, tx pgx.Tx, ch *MembershipChange, lockSQL string) (member, error) {
	// Every round trip made under the change lock holds up each send batch
	// with a message to this conversation (sends take the lock shared), so
	// the lock and the checks' read go in one. The read starts once the
	// lock is held, so it sees every change committed before.
	b := &pgx.Batch{}
	queueLockActor(b, ch, lockSQL)
	br := tx.SendBatch(ctx, b)
	m, err := readLockActor(br, ch.Actor)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return m, err
}

// queueLockActor queues on b the change lock of ch's conversation, taken
// by lockSQL, and then the read of the actor's membership; readLockActor
// reads their results, for a caller that sends more in the same batch.
func queueLockActor(b *pgx.Batch, ch *MembershipChange, lockSQL string) {
	b.Queue(lockSQL, changeLockKey(ch.Conv))
	b.Queue(`SELECT m.role, coalesce(m.muted_until, 0) FROM conversations c
		LEFT JOIN LATERAL (SELECT role, muted_until FROM membership_periods
		                   WHERE conv_id = c.conv_id AND user_id = $2 AND to_seq IS NULL LIMIT 1) m ON true
		WHERE c.conv_id = $1`, ch.Conv, ch.Actor)
}

// readLockActor reads the results of queueLockActor's statements from br,
// as lockActor returns them.
func readLockActor(br pgx.BatchResults, actor string) (member, error) {
	if _, err := br.Exec(); err != nil {
		return member{}, err
	}
	var role *Role
	var m member
	err := br.QueryRow().Scan(&role, &m.mutedUntil)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return member{}, ErrNotFound
	case err != nil || actor == "":
		return member{}, err
	case role == nil:
		return member{}, ErrNotMember
	}
	m.role = *role
	return m, nil
}

// allocate gives the change its seq, under the change lock and after the
// change was checked: ch.Alloc's, which must be above every seq committed
// in the conversation so far; a lower one (a counter Redis lost, re-seeded
// while a send with a higher seq was in flight) is ErrSeqTaken. Without
// Alloc, ch.Seq stands.
func allocate(ctx context.Context, tx pgx.Tx, ch *MembershipChange) error {
	if ch.Alloc == nil {
		return nil
	}
	var head int64
	if err := tx.QueryRow(ctx, `SELECT `+headSQL+` FROM conversations c WHERE c.conv_id = $1`, ch.Conv).Scan(&head); err != nil {
		return err
	}
	return allocateAbove(ctx, ch, head)
}

// allocateAbove is allocate for a caller that read the conversation's head
// under the change lock itself.
func allocateAbove(ctx context.Context, ch *MembershipChange, head int64) error {
	if ch.Alloc == nil {
		return nil
	}
	seq, err := ch.Alloc(ctx)
	if err != nil {
		return err
	}
	ch.Seq = seq
	if seq <= head {
		return ErrSeqTaken
	}
	return nil
}

func insertMembershipEvent(ctx context.Context, tx pgx.Tx, ch MembershipChange, kind Kind, users []string) error {
	tag, err := tx.Exec(ctx, `INSERT INTO events (conv_key, seq, kind, sender, ts, users)
		SELECT conv_key, $2, $3, $4, $5, $6 FROM conversations WHERE conv_id = $1 ON CONFLICT DO NOTHING`,
		ch.Conv, ch.Seq, kind, ch.Actor, ch.Ts, users)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrSeqTaken
	}
	return nil
}

func missingUserTx(ctx context.Context, tx pgx.Tx, ids []string) (string, error) {
	var missing string
	err := tx.QueryRow(ctx, `SELECT u FROM unnest($1::text[]) u WHERE NOT EXISTS (SELECT 1 FROM users WHERE user_id = u) LIMIT 1`, ids).Scan(&missing)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return missing, err
}

// headSQL is the head (highest committed seq) of conversation c, the
// conversations row in the statement it is part of.
const headSQL = `(SELECT coalesce(max(e.seq), 0) FROM events e WHERE e.conv_key = c.conv_key)`

// ConversationByID returns the conversation with its head, or ErrNotFound.
func (s *Store) ConversationByID(ctx context.Context, id string) (Conversation, error) {
	c := Conversation{ID: id}
	err := s.pool.QueryRow(ctx, `SELECT kind, title, epoch, min_seq, member_count,
		`+headSQL+` FROM conversations c WHERE c.conv_id = $1`, id).
		Scan(&c.Kind, &c.Title, &c.Epoch, &c.MinSeq, &c.Members, &c.Head)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, ErrNotFound
	}
	return c, err
}

// MemberState is whether a user is a current member of a conversation,
// and until when (unix ms) it is muted there (0: not muted).
type MemberState struct {
	Member     bool
	MutedUntil int64
}

// AreCurrentMembers reports, for each i, whether users[i] is a member of
// convs[i] now, and its mute, in one statement.
func (s *Store) AreCurrentMembers(ctx context.Context, convs, users []string) ([]MemberState, error) {
	// Sends ask this of every sender the membership cache has no answer
	// for: with the generic plan, an index lookup per pair.
	out := make([]MemberState, 0, len(convs))
	err := s.genericRows(ctx, `SELECT m.user_id IS NOT NULL, coalesce(m.muted_until, 0)
		FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(conv, usr, i)
		LEFT JOIN LATERAL (SELECT m.user_id, m.muted_until FROM membership_periods m
		                   WHERE m.conv_id = u.conv AND m.user_id = u.usr AND m.to_seq IS NULL LIMIT 1) m ON true
		ORDER BY u.i`, []any{convs, users}, func(rows pgx.Rows) error {
		var st MemberState
		err := rows.Scan(&st.Member, &st.MutedUntil)
		out = append(out, st)
		return err
	})
	if err == nil && len(out) != len(convs) {
		err = fmt.Errorf("store: %d membership answers for %d questions", len(out), len(convs))
	}
	return out, err
}

// Heads returns the highest committed seq of each of convs in one
// statement, and for each conversation that does not exist, ErrNotFound
// in its place in errs (errs is nil when all exist).
func (s *Store) Heads(ctx context.Context, convs []string) (heads []int64, errs []error, err error) {
	rows, err := s.pool.Query(ctx, `SELECT u.i, `+headSQL+`
		FROM unnest($1::text[]) WITH ORDINALITY AS u(conv, i)
		CROSS JOIN LATERAL (SELECT c.conv_key FROM conversations c WHERE c.conv_id = u.conv LIMIT 1) c`, convs)
	if err != nil {
		return nil, nil, err
	}
	heads = make([]int64, len(convs))
	found := make([]bool, len(convs))
	var i, head int64
	if _, err := pgx.ForEachRow(rows, []any{&i, &head}, func() error {
		heads[i-1], found[i-1] = head, true
		return nil
	}); err != nil {
		return nil, nil, err
	}
	for j, ok := range found {
		if !ok {
			if errs == nil {
				errs = make([]error, len(convs))
			}
			errs[j] = ErrNotFound
		}
	}
	return heads, errs, nil
}

// Head returns the conversation's highest committed seq, or ErrNotFound.
func (s *Store) Head(ctx context.Context, conv string) (int64, error) {
	var head int64
	err := s.pool.QueryRow(ctx, `SELECT `+headSQL+` FROM conversations c WHERE c.conv_id = $1`,
		conv).Scan(&head)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNotFound
	}
	return head, err
}

// CurrentPeriod is the start of a current membership period.
type CurrentPeriod struct {
	Conv    string
	User    string
	FromSeq int64
}

// BigMembershipsOf returns, for each of users, its current membership
// periods in conversations of at least minMembers members, in one
// statement (users without any are not in the map).
func (s *Store) BigMembershipsOf(ctx context.Context, users []string, minMembers int) (map[string][]CurrentPeriod, error) {
	// Every auth asks this, mostly of users who have no big conversation
	// at all, so it must cost a few index lookups per user: each user's
	// memberships by membership_by_user (OFFSET 0 keeps the join from
	// being flattened and hashed, and the coalesce keeps the partial index
	// membership_current, whose leading column is the conversation, from
	// being scanned whole for each user, as a generic plan made on stale
	// statistics did in every auth of a reconnect storm: BENCHMARKS.md, the
	// row "45fa4d4 against acf5b32"), then each conversation's size by its
	// key; with the generic plan.
	out := map[string][]CurrentPeriod{}
	err := s.genericRows(ctx, `SELECT u.usr, m.conv_id, m.from_seq
		FROM unnest($1::text[]) AS u(usr)
		CROSS JOIN LATERAL (SELECT m.conv_id, m.from_seq FROM membership_periods m
		                    WHERE m.user_id = u.usr AND coalesce(m.to_seq, -1) = -1 OFFSET 0) m
		WHERE (SELECT c.member_count FROM conversations c WHERE c.conv_id = m.conv_id) >= $2`, []any{users, minMembers}, func(rows pgx.Rows) error {
		var p CurrentPeriod
		if err := rows.Scan(&p.User, &p.Conv, &p.FromSeq); err != nil {
			return err
		}
		out[p.User] = append(out[p.User], p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// CurrentMembers returns the current membership periods of conv.
func (s *Store) CurrentMembers(ctx context.Context, conv string) ([]CurrentPeriod, error) {
	rows, err := s.pool.Query(ctx, `SELECT user_id, from_seq FROM membership_periods WHERE conv_id = $1 AND to_seq IS NULL`, conv)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (CurrentPeriod, error) {
		p := CurrentPeriod{Conv: conv}
		err := r.Scan(&p.User, &p.FromSeq)
		return p, err
	})
}

// CurrentMembersOf returns the current members of each of convs, in one
// statement (a conversation without any, or that does not exist, is not
// in the map).
func (s *Store) CurrentMembersOf(ctx context.Context, convs []string) (map[string][]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT conv_id, user_id FROM membership_periods WHERE conv_id = ANY($1) AND to_seq IS NULL`, convs)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string][]string, len(convs))
	for rows.Next() {
		var conv, user string
		if err := rows.Scan(&conv, &user); err != nil {
			return nil, err
		}
		out[conv] = append(out[conv], user)
	}
	return out, rows.Err()
}

// ConvSeq names one event.
type ConvSeq struct {
	Conv string
	Seq  int64
}

// Recipients returns, for each event, the users whose membership periods
// contain its seq (nobody sees an event outside their periods).
func (s *Store) Recipients(ctx context.Context, evs []ConvSeq) ([][]string, error) {
	convs := make([]string, len(evs))
	seqs := make([]int64, len(evs))
	for i, e := range evs {
		convs[i], seqs[i] = e.Conv, e.Seq
	}
	rows, err := s.pool.Query(ctx, `SELECT k.i, m.user_id
		FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS k(conv, seq, i)
		JOIN membership_periods m ON m.conv_id = k.conv AND m.from_seq <= k.seq AND (m.to_seq IS NULL OR m.to_seq >= k.seq)`,
		convs, seqs)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([][]string, len(evs))
	for rows.Next() {
		var i int64
		var u string
		if err := rows.Scan(&i, &u); err != nil {
			return nil, err
		}
		out[i-1] = append(out[i-1], u)
	}
	return out, rows.Err()
}
