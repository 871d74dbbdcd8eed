package parley_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOnlyTestsImportTheTestHarness fails when a non-test file outside
// test/ imports a package under test/ (the harness imports server, so
// production code importing it would run the import graph backwards).
// Direct imports are enough: the harness packages are the only ones left
// that could bring it in transitively.
func TestOnlyTestsImportTheTestHarness(t *testing.T) {
	const harness = "github.com/parley-im/parley/test/"
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path == "test" || path != "." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, harness) {
				t.Errorf("%s imports %s: only tests may import the test harness", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
