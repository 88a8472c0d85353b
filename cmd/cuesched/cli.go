package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// The convention every command follows: -h and --help print the command's
// own usage on stdout and exit 0; a bad flag or argument is named on stderr
// and exits 2.

// flagSet is a leaf command's flags and usage.
type flagSet struct {
	*flag.FlagSet
	c     *cli
	name  string // "cuesched show list"
	usage string // everything printed before the flag list
}

func newFlagSet(c *cli, name, usage string) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() {} // parse prints the usage where it belongs
	return &flagSet{FlagSet: fs, c: c, name: name, usage: usage}
}

// newFlagSetOn wraps a bare flag.FlagSet, to register a command's flags on
// it (a group's lead flags).
func newFlagSetOn(fs *flag.FlagSet) *flagSet { return &flagSet{FlagSet: fs} }

// printUsage writes the usage text and the flags to w.
func (f *flagSet) printUsage(w io.Writer) {
	fmt.Fprint(w, f.usage)
	n := 0
	f.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	f.SetOutput(w)
	f.PrintDefaults()
	f.SetOutput(f.c.stderr)
}

// parse parses args. When done is true the command ends with code: 0 after
// printing the usage for -h/--help, 2 after a bad flag (the flag package has
// named it on stderr).
func (f *flagSet) parse(args []string) (code int, done bool) {
	err := f.Parse(args)
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		f.printUsage(f.c.stdout)
		return 0, true
	default:
		fmt.Fprintf(f.c.stderr, "Run '%s -h' for usage.\n", f.name)
		return 2, true
	}
}

// parseInterleaved is parse for commands whose flags may come before,
// between and after their positional arguments; it returns the positionals.
func (f *flagSet) parseInterleaved(args []string) (pos []string, code int, done bool) {
	rest := args
	for {
		if code, done := f.parse(rest); done {
			return nil, code, true
		}
		if f.NArg() == 0 {
			return pos, 0, false
		}
		pos = append(pos, f.Arg(0))
		rest = f.Args()[1:]
	}
}

// fail reports bad usage on stderr and returns exit code 2.
func (f *flagSet) fail(format string, a ...any) int {
	fmt.Fprintf(f.c.stderr, "%s: %s\nRun '%s -h' for usage.\n", f.name, fmt.Sprintf(format, a...), f.name)
	return 2
}

// subcommand is one entry of a command group (migrate, show, accounting).
type subcommand struct {
	name    string
	args    string // positional arguments, for the group's usage ("<show> on|off")
	summary string
	run     func(ctx context.Context, c *cli, args []string) int
}

// group is a command made of subcommands. Its run dispatches through subs,
// which is also what the help lists and what the tests walk.
type group struct {
	name  string // "cuesched show"
	intro string // paragraph after the usage line; may be empty
	subs  []subcommand
	// lead, when set, defines the flags accepted before the subcommand
	// ("cuesched migrate --database-url URL up"); they are handed on to it.
	lead func(fs *flag.FlagSet)
}

// command makes the group an entry of commands().
func (g group) command(summary string) command {
	return command{summary: summary, run: g.run, subs: g.subs}
}

func (g group) usage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s <subcommand> [flags]\n", g.name)
	if g.intro != "" {
		fmt.Fprintf(w, "\n%s", ensureNewline(g.intro))
	}
	fmt.Fprintln(w, "\nsubcommands:")
	width := 0
	for _, s := range g.subs {
		width = max(width, len(strings.TrimSpace(s.name+" "+s.args)))
	}
	for _, s := range g.subs {
		head := fmt.Sprintf("  %-*s   ", width, strings.TrimSpace(s.name+" "+s.args))
		lines := wrap(s.summary, 78-len(head))
		for i, l := range lines {
			if i > 0 {
				head = strings.Repeat(" ", len(head))
			}
			fmt.Fprintf(w, "%s%s\n", head, l)
		}
	}
	fmt.Fprintf(w, "\nRun '%s <subcommand> -h' for its usage and flags.\n", g.name)
}

func (g group) names() string {
	n := make([]string, len(g.subs))
	for i, s := range g.subs {
		n[i] = s.name
	}
	return strings.Join(n, ", ")
}

func (g group) run(ctx context.Context, c *cli, args []string) int {
	var lead []string
	if g.lead != nil {
		fs := flag.NewFlagSet(g.name, flag.ContinueOnError)
		fs.SetOutput(c.stderr)
		fs.Usage = func() {}
		g.lead(fs)
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				g.usage(c.stdout)
				return 0
			}
			fmt.Fprintf(c.stderr, "Run '%s -h' for usage.\n", g.name)
			return 2
		}
		lead = args[:len(args)-fs.NArg()]
		args = fs.Args()
	}
	if len(args) == 0 {
		fmt.Fprintf(c.stderr, "%s: missing subcommand (%s)\n\n", g.name, g.names())
		g.usage(c.stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		g.usage(c.stdout)
		return 0
	case "help":
		if len(args) == 1 {
			g.usage(c.stdout)
			return 0
		}
		// "help <subcommand>" is "<subcommand> -h".
		args = []string{args[1], "-h"}
	}
	for _, s := range g.subs {
		if s.name == args[0] {
			return s.run(ctx, c, append(lead[:len(lead):len(lead)], args[1:]...))
		}
	}
	fmt.Fprintf(c.stderr, "%s: unknown subcommand %q (want %s)\n\n", g.name, args[0], g.names())
	g.usage(c.stderr)
	return 2
}

// wrap splits text into lines of at most width characters at spaces.
func wrap(text string, width int) []string {
	var lines []string
	var cur string
	for _, w := range strings.Fields(text) {
		if cur != "" && len(cur)+1+len(w) > width {
			lines = append(lines, cur)
			cur = ""
		}
		if cur != "" {
			cur += " "
		}
		cur += w
	}
	if cur != "" || len(lines) == 0 {
		lines = append(lines, cur)
	}
	return lines
}
