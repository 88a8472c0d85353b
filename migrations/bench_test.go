package migrations_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
)

// BenchmarkProcUpdateWAL measures the WAL written per proc UPDATE of the
// kind Cuebot makes on every host report (memory used, child processes,
// ping time), with
// proc's default replica identity (the baseline of the comparison) and with
// the REPLICA IDENTITY FULL the rollout sets, for an empty and a 4 KB
// incompressible (so TOASTed out of line) bytea_children. Reported as wal-bytes/update.
func BenchmarkProcUpdateWAL(b *testing.B) {
	const procs = 200
	for _, children := range []int{0, 4096} {
		for _, ident := range []string{"DEFAULT", "FULL"} {
			b.Run(fmt.Sprintf("identity=%s/children=%dB", ident, children), func(b *testing.B) {
				ctx := context.Background()
				conn := connect(b, cuebotdb.Database(b))
				exec(b, conn, `INSERT INTO host (pk_host, pk_alloc, str_name, str_lock_state) VALUES ('h', '00000000-0000-0000-0000-000000000000', 'h', 'OPEN')`)
				exec(b, conn, `INSERT INTO proc (pk_proc, pk_host, pk_job, pk_show, pk_layer, int_cores_reserved, int_mem_reserved, bytea_children)
					SELECT gen_random_uuid(), 'h', gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 100, 4194304,
					       (SELECT decode(string_agg(md5(g::text || '.' || i::text), ''), 'hex') FROM generate_series(1, $1 / 16) i)
					  FROM generate_series(1, $2) g`, children, procs)
				exec(b, conn, `ALTER TABLE proc REPLICA IDENTITY `+ident)
				// Cuebot's UPDATE_PROC_MEMORY_USAGE rewrites the memory
				// columns, bytea_children and ts_ping once a minute.
				update := `UPDATE proc SET int_mem_used = int_mem_used + 1, int_virt_used = int_virt_used + 1, ts_ping = now(),
					bytea_children = overlay(bytea_children PLACING int4send(int_mem_used::int) FROM 1)`
				exec(b, conn, update) // first touch after load
				var start, end string
				b.ResetTimer()
				if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&start); err != nil {
					b.Fatal(err)
				}
				for i := 0; i < b.N; i++ {
					exec(b, conn, update)
				}
				if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&end); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				var bytes float64
				if err := conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)`, end, start).Scan(&bytes); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(bytes/float64(b.N*procs), "wal-bytes/update")
			})
		}
	}
}
