package redact

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

const secret = "S3cretPW"

func TestURL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"postgres://postgres:S3cretPW@127.0.0.1:bad/cuebot", "postgres://postgres:xxxxx@127.0.0.1:bad/cuebot"},
		{"postgres://postgres:S3cretPW@db/cuebot?sslmode=verify-full", "postgres://postgres:xxxxx@db/cuebot?sslmode=verify-full"},
		{"redis://:S3cretPW@r:6379/0", "redis://:xxxxx@r:6379/0"},
		{"rediss://acct:S3c%zzretPW@r:6379/0", "rediss://acct:xxxxx@r:6379/0"},
		{"redis://u:S3c/ret@PW@r/0", "redis://u:xxxxx@r/0"},
		{"postgres://db/cuebot?user=u&password=S3cretPW&sslmode=require", "postgres://db/cuebot?user=u&password=xxxxx&sslmode=require"},
		{"host=db user=u password=S3cretPW port=bad", "host=db user=u password=xxxxx port=bad"},
		{"host=db password='S3c ret\\'PW' port=1", "host=db password=xxxxx port=1"},
		{"host=db sslpassword=S3cretPW", "host=db sslpassword=xxxxx"},
		{"redis://r:6379/0", "redis://r:6379/0"},
		{"postgres://u@db/cuebot", "postgres://u@db/cuebot"},
		{`parse "redis://u:S3cretPW@h:bad/0": invalid port, dial u@h`, `parse "redis://u:xxxxx@h:bad/0": invalid port, dial u@h`},
		{"", ""},
	} {
		if got := URL(c.in); got != c.want {
			t.Errorf("URL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestErrorKeepsChainDropsSecret(t *testing.T) {
	t.Parallel()
	raw := "postgres://u:S3c%2FretPW@h:bad/db"
	_, perr := url.Parse(raw) //lint:ignore SA1007 a malformed URL on purpose
	err := Error(perr, raw)
	if strings.Contains(err.Error(), "S3c") || !strings.Contains(err.Error(), "invalid port") {
		t.Errorf("Error: %q", err)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		t.Error("errors.As lost the *url.Error")
	}
	// A message quoting the decoded password some other way.
	err = Error(errors.New("auth failed for password S3c/retPW"), raw)
	if strings.Contains(err.Error(), "S3c/retPW") {
		t.Errorf("decoded password kept: %q", err)
	}
	if Error(nil, raw) != nil {
		t.Error("Error(nil) != nil")
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"postgres://postgres:" + secret + "@127.0.0.1:bad/cuebot",
		"redis://u:" + secret + "%zz@h/0",
		"postgres://u:" + secret + "@[::1/db",
	} {
		_, err := ParseURL(raw)
		if err == nil {
			t.Fatalf("ParseURL(%q): no error", raw)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("ParseURL error quotes the password: %q", err)
		}
	}
	if u, err := ParseURL("redis://h:1/2"); err != nil || u.Host != "h:1" {
		t.Errorf("ParseURL of a good URL: %v %v", u, err)
	}
}
