package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// flagSet is a flag.FlagSet for one subcommand that knows short aliases
// (-d for --device) and prints conventional usage: the synopsis, what the
// command does, and one line per flag with its aliases together.
type flagSet struct {
	*flag.FlagSet
	e        *env
	synopsis string
	doc      string
	opts     [][]string // flag names in definition order, long name first
	pos      []string   // the positional arguments parse found
}

// newFlagSet returns the FlagSet of command name. synopsis is what follows
// the command on the usage line besides the flags; doc says what the
// command does.
func newFlagSet(name, synopsis, doc string, e *env) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet("goverbs "+name, flag.ContinueOnError), e: e, synopsis: synopsis, doc: doc}
	// Parse errors are reported by run, in one line with a hint; the
	// usage is printed by parse, and only when asked for.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// String defines a string flag called long, with the alias short if it
// is not empty.
func (fs *flagSet) String(p *string, long, short, value, usage string) {
	fs.StringVar(p, long, value, usage)
	fs.alias(long, short)
}

// Bool defines a boolean flag.
func (fs *flagSet) Bool(p *bool, long, short string, usage string) {
	fs.BoolVar(p, long, false, usage)
	fs.alias(long, short)
}

// Duration defines a duration flag.
func (fs *flagSet) Duration(p *time.Duration, long, short string, value time.Duration, usage string) {
	fs.DurationVar(p, long, value, usage)
	fs.alias(long, short)
}

// Int defines an int flag.
func (fs *flagSet) Int(p *int, long, short string, value int, usage string) {
	fs.IntVar(p, long, value, usage)
	fs.alias(long, short)
}

// Value defines a flag of a custom type.
func (fs *flagSet) Value(v flag.Value, long, short, usage string) {
	fs.Var(v, long, usage)
	fs.alias(long, short)
}

// Hidden defines a boolean flag that the usage does not list: an
// interface between goverbs processes, not for users.
func (fs *flagSet) Hidden(p *bool, long, usage string) {
	fs.BoolVar(p, long, false, usage)
}

func (fs *flagSet) alias(long, short string) {
	names := []string{long}
	if short != "" {
		f := fs.Lookup(long)
		fs.Var(f.Value, short, f.Usage)
		names = append(names, short)
	}
	fs.opts = append(fs.opts, names)
}

// parse parses args, whose flags may come before, between and after the
// positional arguments (goverbs kv get KEY -a ADDR); "--" ends the flags,
// so that a positional argument may begin with "-". Args, NArg and Arg
// then give the positional arguments. For -h or --help it prints the
// usage on stdout and returns flag.ErrHelp; for a bad flag it returns a
// usage error.
func (fs *flagSet) parse(args []string) error {
	fs.pos = fs.pos[:0]
	for {
		err := fs.FlagSet.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fs.printUsage(fs.e.stdout)
			return err
		}
		if err != nil {
			return usageError("%v", err)
		}
		rest := fs.FlagSet.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			fs.pos = append(fs.pos, rest...)
			return nil
		}
		if len(rest) == 0 {
			return nil
		}
		fs.pos, args = append(fs.pos, rest[0]), rest[1:]
	}
}

// isSet reports whether the command line set the flag called long (or by
// its alias).
func (fs *flagSet) isSet(long string) bool {
	set := false
	for _, names := range fs.opts {
		if names[0] == long {
			fs.Visit(func(f *flag.Flag) { set = set || slices.Contains(names, f.Name) })
		}
	}
	return set
}

// Args returns the positional arguments parse found.
func (fs *flagSet) Args() []string { return fs.pos }

// NArg returns the number of positional arguments.
func (fs *flagSet) NArg() int { return len(fs.pos) }

// Arg returns positional argument i, or "" if there is none.
func (fs *flagSet) Arg(i int) string {
	if i < 0 || i >= len(fs.pos) {
		return ""
	}
	return fs.pos[i]
}

// parseInterspersed parses args as parse does and returns the positional
// arguments.
func (fs *flagSet) parseInterspersed(args []string) ([]string, error) {
	if err := fs.parse(args); err != nil {
		return nil, err
	}
	return fs.pos, nil
}

func (fs *flagSet) printUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s [flags]", fs.Name())
	if fs.synopsis != "" {
		fmt.Fprintf(w, " %s", fs.synopsis)
	}
	fmt.Fprintf(w, "\n\n%s\n", fs.doc)
	if len(fs.opts) == 0 {
		return
	}
	fmt.Fprintf(w, "\nFlags:\n")
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for _, names := range fs.opts {
		f := fs.Lookup(names[0])
		typ, usage := flag.UnquoteUsage(f)
		var spell string
		if len(names) > 1 {
			spell = fmt.Sprintf("-%s, --%s", names[1], names[0])
		} else {
			spell = fmt.Sprintf("    --%s", names[0])
		}
		if typ != "" {
			spell += " " + typ
		}
		if def := f.DefValue; def != "" && def != "false" && def != "0" {
			if typ == "string" {
				def = fmt.Sprintf("%q", def)
			}
			usage += fmt.Sprintf(" (default %s)", def)
		}
		fmt.Fprintf(tw, "  %s\t%s\n", spell, strings.ReplaceAll(usage, "\n", "\n  \t"))
	}
	tw.Flush()
}
