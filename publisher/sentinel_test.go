package publisher_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/config"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// TestSentinelFromOneConfig books through a Sentinel-managed primary with the
// same publisher code a single node uses: only ClientConfig differs.
func TestSentinelFromOneConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := testenv.RedisBinary(); err != nil {
		t.Skip(err)
	}
	primary, err := testenv.StartRedis(ctx, testenv.RedisOptions{Databases: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(primary.Stop)

	// The Sentinel asks for a password of its own (accounting.sentinel_password).
	// StartSentinel retries on another port if this one is taken first.
	sn, err := testenv.StartSentinel(ctx, testenv.SentinelProcOptions{Dir: t.TempDir(), Password: "sentinel-pw",
		Conf: fmt.Sprintf("requirepass sentinel-pw\nsentinel monitor acct 127.0.0.1 %d 1\n", primary.Port())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sn.Stop)

	acct := config.Accounting{
		RedisURL:       "redis://127.0.0.1:1/2", // DB number (and credentials) for the primary; address ignored
		SentinelMaster: "acct", SentinelAddrs: []string{sn.Addr()},
		SentinelPassword: "sentinel-pw",
	}
	cc, err := publisher.ClientConfigFrom(acct)
	if err != nil {
		t.Fatal(err)
	}
	rdb, err := publisher.NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	pub, err := publisher.New(rdb, publisher.Options{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testenv.Patience(10 * time.Second))
	for {
		_, err = pub.WriteLimits(ctx, publisher.Limits{
			Subs:    []publisher.SubLimits{{ShowID: "S", AllocID: "A", Burst: 1000}},
			Folders: []publisher.FolderLimits{{FolderID: "F", ShowID: "S", MaxCores: -1, MaxGPUs: -1}},
			Jobs:    []publisher.JobLimits{{JobID: "J", MaxCores: 1000, MaxGPUs: 100}},
		}, 0)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("sentinel never answered: %v", err)
	}
	if err := pub.BeginBootstrap(ctx, "e"); err != nil {
		t.Fatal(err)
	}
	if err := pub.MarkSeeded(ctx, "S", "e"); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Book(ctx, booking("p1", 300)); err != nil {
		t.Fatalf("Book through sentinel: %v", err)
	}
	// Without the Sentinel's password the primary is never found.
	acct.SentinelPassword = ""
	cc, err = publisher.ClientConfigFrom(acct)
	if err != nil {
		t.Fatal(err)
	}
	noAuth, err := publisher.NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer noAuth.Close()
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err = noAuth.Ping(pctx).Err()
	cancel()
	if err == nil {
		t.Error("a client without sentinel_password reached the primary through a Sentinel that requires one")
	}
	// It landed on the primary, in DB 2.
	direct, err := publisher.NewClient(publisher.ClientConfig{URL: primary.URL(2)})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if v := direct.HGet(ctx, publisher.SubKey("S", "A"), "int_cores").Val(); v != "3" {
		t.Errorf("primary DB 2 sub int_cores = %q, want 3", v)
	}
}
