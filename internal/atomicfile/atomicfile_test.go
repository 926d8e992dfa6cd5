package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteReplacesWholeAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.json")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, sync := range []bool{false, true} {
		if err := WriteBytes(p, []byte("new content"), 0o644, sync); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		fi, _ := os.Stat(p)
		if err != nil || string(b) != "new content" || fi.Mode().Perm() != 0o644 {
			t.Fatalf("sync %v: %q %v %v", sync, b, fi.Mode(), err)
		}
	}
	if err := Write(p, strings.NewReader("x"), 0o600, false); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("%d files in the directory, want only f.json", len(ents))
	}
	// A directory that is not there: an error, nothing made.
	if err := WriteBytes(filepath.Join(dir, "no", "f"), nil, 0o644, false); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
}
