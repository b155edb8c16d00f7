package verbs

import (
	"bytes"
	"flag"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the documentation types.go copies from package driver")

// TestAliasDocs keeps the documentation of the names types.go aliases
// from package driver the same as driver's, so that go doc and
// pkg.go.dev show it on the verbs names: each aliased type carries the
// driver type's doc comment and, for a struct, its definition with every
// field; each aliased constant carries the constant's comments. Run
// "go test ./verbs -run TestAliasDocs -update" after changing them in
// driver.
func TestAliasDocs(t *testing.T) {
	got, err := os.ReadFile("types.go")
	if err != nil {
		t.Fatal(err)
	}
	want, err := aliasDocs(got, "driver")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(got, want) {
		return
	}
	if *update {
		if err := os.WriteFile("types.go", want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("types.go does not carry package driver's documentation of the names it aliases: run go test ./verbs -run TestAliasDocs -update")
}

// driverDocs is what aliasDocs copies from package driver.
type driverDocs struct {
	typeDoc map[string][]string // a type's doc comment lines, and its definition for a struct
	specDoc map[string][]string // a constant's doc comment lines
	specEnd map[string]string   // a constant's line comment
}

// readDriverDocs parses the non-test files of the package in dir.
func readDriverDocs(dir string) (*driverDocs, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	d := &driverDocs{typeDoc: map[string][]string{}, specDoc: map[string][]string{}, specEnd: map[string]string{}}
	for _, e := range entries {
		if name := e.Name(); strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			src, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				return nil, err
			}
			f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
			if err != nil {
				return nil, err
			}
			for _, decl := range f.Decls {
				g, ok := decl.(*ast.GenDecl)
				if !ok {
					continue
				}
				for _, spec := range g.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						doc := commentLines(g.Doc)
						if s.Doc != nil {
							doc = commentLines(s.Doc)
						}
						if _, isStruct := s.Type.(*ast.StructType); isStruct {
							def := "type " + string(src[fset.Position(s.Pos()).Offset:fset.Position(s.End()).Offset])
							doc = append(doc, "//")
							for _, l := range strings.Split(def, "\n") {
								if l == "" {
									doc = append(doc, "//")
								} else {
									doc = append(doc, "//\t"+l)
								}
							}
						}
						d.typeDoc[s.Name.Name] = doc
					case *ast.ValueSpec:
						if g.Tok != token.CONST || len(s.Names) != 1 {
							continue
						}
						n := s.Names[0].Name
						d.specDoc[n] = commentLines(s.Doc)
						if s.Comment != nil {
							d.specEnd[n] = strings.TrimSpace(s.Comment.Text())
						}
					}
				}
			}
		}
	}
	return d, nil
}

// commentLines returns the lines of a comment group as written ("// ...").
func commentLines(g *ast.CommentGroup) []string {
	if g == nil {
		return nil
	}
	var out []string
	for _, c := range g.List {
		out = append(out, strings.Split(c.Text, "\n")...)
	}
	return out
}

var (
	aliasType  = regexp.MustCompile(`^type (\w+) = driver\.(\w+)$`)
	aliasConst = regexp.MustCompile(`^\t(\w+)(\s*)= driver\.(\w+)\s*(//.*)?$`)
)

// aliasDocs returns src, the source of types.go, with the documentation
// of its aliases of the package in driverDir's names replaced by that
// package's.
func aliasDocs(src []byte, driverDir string) ([]byte, error) {
	d, err := readDriverDocs(driverDir)
	if err != nil {
		return nil, err
	}
	var out []string
	// trimDoc drops the comment lines just written, prefixed by indent.
	trimDoc := func(indent string) {
		for len(out) > 0 && strings.HasPrefix(out[len(out)-1], indent+"//") {
			out = out[:len(out)-1]
		}
	}
	inConst := false
	for _, line := range strings.Split(string(src), "\n") {
		switch {
		case line == "const (":
			inConst = true
		case line == ")":
			inConst = false
		}
		if m := aliasType.FindStringSubmatch(line); m != nil {
			if doc, ok := d.typeDoc[m[2]]; ok {
				trimDoc("")
				out = append(out, doc...)
			}
		} else if m := aliasConst.FindStringSubmatch(line); m != nil && inConst {
			trimDoc("\t")
			for _, l := range d.specDoc[m[3]] {
				out = append(out, "\t"+l)
			}
			line = "\t" + m[1] + " = driver." + m[3]
			if c := d.specEnd[m[3]]; c != "" {
				line += " // " + c
			}
		}
		out = append(out, line)
	}
	return format.Source([]byte(strings.Join(out, "\n")))
}
