// Package redact keeps secrets out of messages: a connection URL or DSN
// (PostgreSQL, Redis) is never formatted raw. Every error or log line that
// could hold one goes through URL or Error; ParseURL is url.Parse whose
// error names the problem, not the URL.
//
// The password is found by shape, not by parsing, so a URL that url.Parse
// rejects (a bad port, a stray '%') is redacted too: the userinfo of
// scheme://user:password@host, a password= query parameter, and the
// password= key of a libpq key=value DSN.
package redact

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
)

// Mask replaces a password.
const Mask = "xxxxx"

// kvPassword is password=VALUE in a key=value DSN or a URL query; VALUE may
// be single-quoted with backslash escapes (libpq).
var kvPassword = regexp.MustCompile(`(?i)\b(password|sslpassword|pass|pwd)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&#]*)`)

// userinfos finds the passwords of every scheme://user:password@host in
// s: their [start, end) offsets.
func userinfos(s string) [][2]int {
	var out [][2]int
	off := 0
	for {
		i := strings.Index(s[off:], "://")
		if i < 0 {
			return out
		}
		begin := off + i + 3
		auth := s[begin:]
		// The authority ends at the query or fragment, or where the URL
		// ends inside a message (space, quote); a raw '/' or '@' inside
		// a password stays inside it by taking the last '@' before that.
		if q := strings.IndexAny(auth, "?# \t\n\"'`<>"); q >= 0 {
			auth = auth[:q]
		}
		off = begin
		at := strings.LastIndex(auth, "@")
		if at < 0 {
			continue
		}
		if c := strings.Index(auth[:at], ":"); c >= 0 {
			out = append(out, [2]int{begin + c + 1, begin + at})
		}
		off = begin + at
	}
}

// URL returns raw with its passwords replaced by Mask. raw may be any
// string: a URL, a malformed URL, a key=value DSN, a message holding some,
// or none of these.
func URL(raw string) string {
	s := raw
	ui := userinfos(s)
	for i := len(ui) - 1; i >= 0; i-- {
		s = s[:ui[i][0]] + Mask + s[ui[i][1]:]
	}
	return kvPassword.ReplaceAllString(s, "${1}${2}"+Mask)
}

// Passwords are the passwords raw holds (raw and percent-decoded), for
// scrubbing a message that may quote them some other way.
func Passwords(raw string) []string {
	var out []string
	add := func(p string) {
		p = strings.Trim(p, "'")
		if p == "" || p == Mask {
			return
		}
		out = append(out, p)
		if d, err := url.PathUnescape(p); err == nil && d != p {
			out = append(out, d)
		}
		if d, err := url.QueryUnescape(p); err == nil && d != p {
			out = append(out, d)
		}
	}
	for _, r := range userinfos(raw) {
		add(raw[r[0]:r[1]])
	}
	for _, m := range kvPassword.FindAllStringSubmatch(raw, -1) {
		add(m[3])
	}
	return out
}

// String returns msg with every raw replaced by its redacted form and every
// password any raw holds replaced by Mask.
func String(msg string, raws ...string) string {
	for _, raw := range raws {
		if raw == "" {
			continue
		}
		if r := URL(raw); r != raw {
			msg = strings.ReplaceAll(msg, raw, r)
		}
	}
	for _, raw := range raws {
		for _, p := range Passwords(raw) {
			msg = strings.ReplaceAll(msg, p, Mask)
		}
	}
	// Whatever else looks like a URL or DSN with a password.
	return URL(msg)
}

// Error returns err with its message passed through String. errors.Is and
// errors.As still see the original chain; its text is never printed by
// the returned error. A nil err stays nil.
func Error(err error, raws ...string) error {
	if err == nil {
		return nil
	}
	return &redacted{msg: String(err.Error(), raws...), err: err}
}

type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }

// ParseURL is url.Parse with an error that does not quote raw: "invalid
// port \":bad\" after host", not `parse "scheme://user:password@…"`.
func ParseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			return nil, Error(ue.Err, raw)
		}
		return nil, Error(err, raw)
	}
	return u, nil
}
