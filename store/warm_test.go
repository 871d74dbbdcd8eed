package store

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/internal/testenv"
)

// A new connection is warmed (warmHot): every hot statement is prepared
// on it, with its plan, before it serves a request. Before the migrations
// the schema is missing, and the connection is left cold, not refused.
func TestNewConnectionsPrepareTheHotStatements(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	cfg, err := poolConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig) // the pool's session settings, without its warm-up
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := warmHot(ctx, conn); err != nil {
		t.Fatalf("warming before the migrations: %v", err)
	}
	st, err := Open(ctx, url, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := warmHot(ctx, conn); err != nil {
		t.Fatalf("warming: %v", err)
	}
	for _, sql := range []string{insertMessagesPlainSQL, mergeCursorsSQL, markReadsSQL, conversationsSQL} {
		var generic, custom int64
		err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`, sql).Scan(&generic, &custom)
		if err != nil || generic != 1 || custom != 0 {
			t.Errorf("statement %.40q…: %d generic and %d custom plans (%v); want it prepared and planned once, generically", sql, generic, custom, err)
		}
	}
}
