package cuebot

import "strings"

// Operating systems. host_stat.str_os is what RQD reports for a host, and
// Cuebot reads it as a comma-separated list: one host may serve several OS
// values ("rhel7,rhel9", e.g. a host that runs frames in containers of
// either). job.str_os is the one OS a job needs; NULL or ” means any OS.
// A host may take a job when the job needs no OS or its OS equals one of
// the host's values. Values are compared exactly (case-sensitive) after
// trimming the spaces around each list element.

// HostOSes splits host_stat.str_os into the OS values the host serves:
// elements trimmed, empty ones dropped. "" gives nil (a host that serves no
// OS takes only jobs that need none).
func HostOSes(strOS string) []string {
	var out []string
	for rest := strOS; rest != ""; {
		var v string
		v, rest, _ = strings.Cut(rest, ",")
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// ServesOS reports whether a host serving oses (HostOSes) may take a job
// whose job.str_os is jobOS: an empty jobOS (NULL, ” or blanks) runs on
// any host, otherwise it must equal one of oses.
func ServesOS(oses []string, jobOS string) bool {
	jobOS = strings.TrimSpace(jobOS)
	if jobOS == "" {
		return true
	}
	for _, o := range oses {
		if o == jobOS {
			return true
		}
	}
	return false
}

// HostServesOS is ServesOS on the unsplit host_stat.str_os, without
// allocating.
func HostServesOS(strOS, jobOS string) bool {
	jobOS = strings.TrimSpace(jobOS)
	if jobOS == "" {
		return true
	}
	for rest := strOS; rest != ""; {
		var v string
		v, rest, _ = strings.Cut(rest, ",")
		if strings.TrimSpace(v) == jobOS {
			return true
		}
	}
	return false
}
