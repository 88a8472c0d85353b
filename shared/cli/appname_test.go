package cli

import (
	"strings"
	"testing"
)

func TestWithAppName(t *testing.T) {
	got, err := WithAppName("postgres://u@db:5432/cuebot?sslmode=disable", "scheduler", "node1:42")
	if err != nil || !strings.Contains(got, "application_name=cuesched-scheduler%2Fnode1%3A42") || !strings.Contains(got, "sslmode=disable") {
		t.Fatalf("url form: %q %v", got, err)
	}
	kept, _ := WithAppName("postgres://u@db/cuebot?application_name=mine", "scheduler", "x")
	if !strings.Contains(kept, "application_name=mine") || strings.Contains(kept, "cuesched-") {
		t.Fatalf("an explicit application_name must win: %q", kept)
	}
	dsn, _ := WithAppName("host=db dbname=cuebot", "sidecar", "n")
	if dsn != "host=db dbname=cuebot application_name='cuesched-sidecar/n'" {
		t.Fatalf("dsn form: %q", dsn)
	}
	if _, err := WithAppName("postgres://%zz", "scheduler", "x"); err == nil {
		t.Fatal("a malformed URL must be an error")
	}
}
