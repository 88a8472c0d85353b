package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Package publisher is the only Go caller of the Redis Lua scripts: the
// scripts' calling conventions and replies are parsed in one place. No other
// production package imports package lua, builds a script
// (redis.NewScript) or sends one (EVAL, EVALSHA, SCRIPT LOAD, FCALL).
const (
	scriptOwner = "github.com/cuesched/cuesched/publisher"
	luaPkg      = "github.com/cuesched/cuesched/lua"
	goRedis     = "github.com/redis/go-redis/v9"
)

// scriptMethods are go-redis calls that send a script to the server.
var scriptMethods = []string{"Eval", "EvalSha", "EvalRO", "EvalShaRO", "ScriptLoad", "FCall", "FCallRO", "FunctionLoad"}

// scriptCalls returns "file:line: call" for every script call in f.
func scriptCalls(fset *token.FileSet, f *ast.File) []string {
	redisName := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == goRedis {
			redisName = "redis"
			if imp.Name != nil {
				redisName = imp.Name.Name
			}
		}
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		id, _ := sel.X.(*ast.Ident)
		isNewScript := sel.Sel.Name == "NewScript" && id != nil && redisName != "" && id.Name == redisName
		if isNewScript || slices.Contains(scriptMethods, sel.Sel.Name) {
			pos := fset.Position(call.Pos())
			out = append(out, filepath.Base(pos.Filename)+":"+strconv.Itoa(pos.Line)+": "+sel.Sel.Name)
		}
		return true
	})
	return out
}

func TestOnlyPublisherRunsScripts(t *testing.T) {
	t.Parallel()
	lines := goList(t, "-f", `{{.ImportPath}}|{{.Dir}}|{{join .GoFiles ","}}|{{join .Imports ","}}`, "github.com/cuesched/cuesched/...")
	checked := 0
	for _, l := range lines {
		parts := strings.SplitN(l, "|", 4)
		if len(parts) != 4 {
			t.Fatalf("go list line %q", l)
		}
		pkg, dir, files, imports := parts[0], parts[1], parts[2], parts[3]
		if pkg == scriptOwner || pkg == luaPkg || hasPrefix(pkg, notProduction) {
			continue
		}
		checked++
		if slices.Contains(strings.Split(imports, ","), luaPkg) {
			t.Errorf("%s imports %s: only package publisher runs the Lua scripts (add a typed call there)", pkg, luaPkg)
		}
		fset := token.NewFileSet()
		for _, name := range strings.Split(files, ",") {
			if name == "" {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range scriptCalls(fset, f) {
				t.Errorf("%s: %s: only package publisher runs Redis scripts (add a typed call there)", pkg, c)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d production packages", checked)
	}
}

// The rule itself catches what it is for.
func TestScriptCallsRule(t *testing.T) {
	t.Parallel()
	src := `package x

import (
	"context"

	rds "github.com/redis/go-redis/v9"
)

var s = rds.NewScript("return 1")

func f(ctx context.Context, c rds.UniversalClient) {
	s.EvalSha(ctx, c, nil)
	c.Eval(ctx, "return 1", nil)
	c.Get(ctx, "k")
	NewScript()
}

func NewScript() {}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(scriptCalls(fset, f), "; ")
	want := "x.go:9: NewScript; x.go:12: EvalSha; x.go:13: Eval"
	if got != want {
		t.Fatalf("scriptCalls = %q, want %q", got, want)
	}
}
