package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// resolving is a recorder that resolves its tables in the snapshot, as the
// sidecar and the host cache do.
type resolving struct {
	*recorder
	names  []string
	tables Tables
}

func (r *resolving) Snapshot(ctx context.Context, q SnapshotQuerier) error {
	t, err := ResolveTables(ctx, SnapshotText(q), r.names...)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.tables = t
	r.mu.Unlock()
	return r.recorder.Snapshot(ctx, q)
}

// TestTablesTellSameNamedRelationsApart: a publication carries item and
// shadow.item; the stream delivers both with their schema, and the tables
// resolved on the replication connection own public.item only. The
// resolution follows the search_path, and names that resolve to no table
// are configuration errors.
func TestTablesTellSameNamedRelationsApart(t *testing.T) {
	t.Parallel()
	url, pool := testDB(t,
		`CREATE TABLE item (id int PRIMARY KEY, v text)`,
		`CREATE SCHEMA shadow`,
		`CREATE TABLE shadow.item (LIKE public.item INCLUDING ALL)`,
		`CREATE TABLE other (id int PRIMARY KEY)`,
		`CREATE VIEW vw AS SELECT 1 AS x`,
		`CREATE PUBLICATION pub FOR TABLE item, shadow.item, other`)
	rec := &resolving{recorder: newRecorder(""), names: []string{"item", "other"}}
	startStream(t, Config{ConnString: url, Slot: uniqueSlot(t), Publications: []string{"pub"}}, rec)
	rec.waitFor(t, 20*time.Second, "snapshot", func() bool { return rec.snapshots == 1 })
	rec.mu.Lock()
	tables := rec.tables
	rec.mu.Unlock()
	if want := "public.item, public.other"; tables.String() != want {
		t.Fatalf("resolved tables = %q, want %q", tables, want)
	}

	exec(t, pool, `BEGIN; INSERT INTO shadow.item VALUES (1, 'shadow'); INSERT INTO item VALUES (1, 'real');
		INSERT INTO other VALUES (1); UPDATE shadow.item SET v = 'x'; DELETE FROM shadow.item; COMMIT`)
	rec.waitFor(t, 10*time.Second, "five changes", func() bool { return len(rec.changes()) >= 5 })
	rec.mu.Lock()
	ch := rec.changes()
	rec.mu.Unlock()
	var owned []string
	for _, c := range ch {
		if tables.Owns(c.Relation) {
			owned = append(owned, fmt.Sprintf("%s %s", c.Op, c.Relation.QualifiedName()))
		}
	}
	if want := []string{"insert public.item", "insert public.other"}; strings.Join(owned, ";") != strings.Join(want, ";") {
		t.Fatalf("owned changes = %q, want %q (all: %v)", owned, want, describe(ch))
	}
	if ch[0].Relation.Schema != "shadow" || ch[0].Relation.Table != "item" {
		t.Fatalf("first change is of %s, want shadow.item", ch[0].Relation.QualifiedName())
	}

	// The search_path decides which item is "ours", as it does for every
	// unqualified query on that connection.
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = "shadow, public"
	shadowFirst, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer shadowFirst.Close()
	st, err := ResolveTables(ctx, QueryText(shadowFirst), "item", "other")
	if err != nil {
		t.Fatal(err)
	}
	if want := "public.other, shadow.item"; st.String() != want {
		t.Fatalf("with search_path shadow first: %q, want %q", st, want)
	}
	if st.Owns(ch[1].Relation) || !st.Owns(ch[0].Relation) {
		t.Fatalf("shadow-first tables own public.item=%v shadow.item=%v", st.Owns(ch[1].Relation), st.Owns(ch[0].Relation))
	}

	for _, names := range [][]string{{"item", "missing"}, {"vw"}, {"Item"}, {"item; DROP TABLE item"}, nil} {
		_, err := ResolveTables(ctx, QueryText(pool), names...)
		if !errors.Is(err, errConfig) {
			t.Errorf("ResolveTables(%q) = %v, want a configuration error", names, err)
		}
	}
	if _, err := ResolveTables(ctx, QueryText(pool), "item", "missing"); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("error does not name the missing table: %v", err)
	}
	if Tables(nil).Owns(ch[1].Relation) || tables.Owns(nil) {
		t.Error("an empty table set or a nil relation is owned")
	}
	// A snapshot copy that named no schema is not a streamed relation.
	if tables.Owns(NewRelation(0, "", "item", nil)) {
		t.Error("a relation without a schema is owned")
	}
}
