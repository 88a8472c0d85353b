package main

import "testing"

func TestNextPort(t *testing.T) {
	t.Parallel()
	if got, err := nextPort("127.0.0.1:9464"); err != nil || got != "127.0.0.1:9465" {
		t.Errorf("nextPort = %q, %v", got, err)
	}
	for _, bad := range []string{"127.0.0.1:0", "127.0.0.1:65535", "nohost"} {
		if got, err := nextPort(bad); err == nil {
			t.Errorf("nextPort(%q) = %q, want an error", bad, got)
		}
	}
}
