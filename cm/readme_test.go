package cm_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestREADMEExample keeps the example in the README at the root of the
// repository the same as server and client in example_test.go: the
// README's first Go code block after the marker below must be their
// source, as it stands there.
func TestREADMEExample(t *testing.T) {
	const marker = "<!-- example: cm/example_test.go server client -->"
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatalf("read the README: %v", err)
	}
	_, after, ok := strings.Cut(string(readme), marker)
	if !ok {
		t.Fatalf("README.md has no line %q before the example", marker)
	}
	_, block, ok := strings.Cut(after, "```go\n")
	if !ok {
		t.Fatal("README.md has no ```go block after the example marker")
	}
	block, _, _ = strings.Cut(block, "```")

	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "example_test.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, name := range []string{"server", "client"} {
		i := slices.IndexFunc(f.Decls, func(d ast.Decl) bool {
			fd, ok := d.(*ast.FuncDecl)
			return ok && fd.Name.Name == name
		})
		if i < 0 {
			t.Fatalf("example_test.go has no func %s", name)
		}
		fd := f.Decls[i].(*ast.FuncDecl)
		want = append(want, string(src[fset.Position(fd.Doc.Pos()).Offset:fset.Position(fd.End()).Offset]))
	}
	if got, want := strings.TrimSpace(block), strings.Join(want, "\n\n"); got != want {
		t.Errorf("the README's example differs from server and client in cm/example_test.go; copy them into the README.\nREADME:\n%s\nexample:\n%s", got, want)
	}
}
