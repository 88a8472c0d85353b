package cli

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

// FlagSet is a leaf command's flags and usage.
type FlagSet struct {
	*flag.FlagSet
	c     *Env
	name  string // "cuesched show list"
	usage string // everything printed before the flag list
}

// NewFlagSet makes the flag set of the command name, whose -h prints usage.
func NewFlagSet(c *Env, name, usage string) *FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.Stderr)
	fs.Usage = func() {} // parse prints the usage where it belongs
	return &FlagSet{FlagSet: fs, c: c, name: name, usage: usage}
}

// FlagSetOn wraps a bare flag.FlagSet, to register a command's flags on
// it (a group's lead flags).
func FlagSetOn(fs *flag.FlagSet) *FlagSet { return &FlagSet{FlagSet: fs} }

// PrintUsage writes the usage text and the flags to w.
func (f *FlagSet) PrintUsage(w io.Writer) {
	fmt.Fprint(w, f.usage)
	n := 0
	f.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	f.SetOutput(w)
	f.PrintDefaults()
	f.SetOutput(f.c.Stderr)
}

// ParseArgs parses args. When done is true the command ends with code: 0 after
// printing the usage for -h/--help, 2 after a bad flag (the flag package has
// named it on stderr).
func (f *FlagSet) ParseArgs(args []string) (code int, done bool) {
	err := f.Parse(args)
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		f.PrintUsage(f.c.Stdout)
		return 0, true
	default:
		fmt.Fprintf(f.c.Stderr, "Run '%s -h' for usage.\n", f.name)
		return 2, true
	}
}

// ParseInterleaved is ParseArgs for commands whose flags may come before,
// between and after their positional arguments; it returns the positionals.
func (f *FlagSet) ParseInterleaved(args []string) (pos []string, code int, done bool) {
	rest := args
	for {
		if code, done := f.ParseArgs(rest); done {
			return nil, code, true
		}
		if f.NArg() == 0 {
			return pos, 0, false
		}
		pos = append(pos, f.Arg(0))
		rest = f.Args()[1:]
	}
}

// Fail reports bad usage on stderr and returns exit code 2.
func (f *FlagSet) Fail(format string, a ...any) int {
	fmt.Fprintf(f.c.Stderr, "%s: %s\nRun '%s -h' for usage.\n", f.name, fmt.Sprintf(format, a...), f.name)
	return 2
}

// Subcommand is one entry of a command group (migrate, show, accounting).
type Subcommand struct {
	Name    string
	Args    string // positional arguments, for the group's usage ("<show> on|off")
	Summary string
	Run     func(ctx context.Context, c *Env, args []string) int
}

// Group is a command made of subcommands. Its run dispatches through subs,
// which is also what the help lists and what the tests walk.
type Group struct {
	Name  string // "cuesched show"
	Intro string // paragraph after the usage line; may be empty
	Subs  []Subcommand
	// lead, when set, defines the flags accepted before the subcommand
	// ("cuesched migrate --database-url URL up"); they are handed on to it.
	Lead func(fs *flag.FlagSet)
}

// Command makes the group an entry of a binary's command table.
func (g Group) Command(summary string) Command {
	return Command{Summary: summary, Run: g.Run, Subs: g.Subs}
}

// Usage prints the group's usage and subcommands to w.
func (g Group) Usage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s <subcommand> [flags]\n", g.Name)
	if g.Intro != "" {
		fmt.Fprintf(w, "\n%s", EnsureNewline(g.Intro))
	}
	fmt.Fprintln(w, "\nsubcommands:")
	width := 0
	for _, s := range g.Subs {
		width = max(width, len(strings.TrimSpace(s.Name+" "+s.Args)))
	}
	for _, s := range g.Subs {
		head := fmt.Sprintf("  %-*s   ", width, strings.TrimSpace(s.Name+" "+s.Args))
		lines := wrap(s.Summary, 78-len(head))
		for i, l := range lines {
			if i > 0 {
				head = strings.Repeat(" ", len(head))
			}
			fmt.Fprintf(w, "%s%s\n", head, l)
		}
	}
	fmt.Fprintf(w, "\nRun '%s <subcommand> -h' for its usage and flags.\n", g.Name)
}

// Names lists the subcommands, comma-separated.
func (g Group) Names() string {
	n := make([]string, len(g.Subs))
	for i, s := range g.Subs {
		n[i] = s.Name
	}
	return strings.Join(n, ", ")
}

// Run dispatches args to a subcommand.
func (g Group) Run(ctx context.Context, c *Env, args []string) int {
	var lead []string
	if g.Lead != nil {
		fs := flag.NewFlagSet(g.Name, flag.ContinueOnError)
		fs.SetOutput(c.Stderr)
		fs.Usage = func() {}
		g.Lead(fs)
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				g.Usage(c.Stdout)
				return 0
			}
			fmt.Fprintf(c.Stderr, "Run '%s -h' for usage.\n", g.Name)
			return 2
		}
		lead = args[:len(args)-fs.NArg()]
		args = fs.Args()
	}
	if len(args) == 0 {
		fmt.Fprintf(c.Stderr, "%s: missing subcommand (%s)\n\n", g.Name, g.Names())
		g.Usage(c.Stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		g.Usage(c.Stdout)
		return 0
	case "help":
		if len(args) == 1 {
			g.Usage(c.Stdout)
			return 0
		}
		// "help <subcommand>" is "<subcommand> -h".
		args = []string{args[1], "-h"}
	}
	for _, s := range g.Subs {
		if s.Name == args[0] {
			return s.Run(ctx, c, append(lead[:len(lead):len(lead)], args[1:]...))
		}
	}
	fmt.Fprintf(c.Stderr, "%s: unknown subcommand %q (want %s)\n\n", g.Name, args[0], g.Names())
	g.Usage(c.Stderr)
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

// EnsureNewline ends s with a newline.
func EnsureNewline(s string) string {
	if strings.HasSuffix(s, "\n") {
		return s
	}
	return s + "\n"
}
