package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestInstallStreamsAndReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "vhostmq-cni")
	bin := filepath.Join(dir, "bin")
	os.WriteFile(src, []byte("version 1"), 0o700)
	if err := install(src, bin); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(bin, "vhostmq-cni")
	fi, err := os.Stat(dst)
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("installed: %v, %v", fi, err)
	}
	// same content: the file is left alone (same inode)
	if err := install(src, bin); err != nil {
		t.Fatal(err)
	}
	if fi2, _ := os.Stat(dst); !os.SameFile(fi, fi2) {
		t.Error("an identical plugin was rewritten")
	}
	// new content of the same size: replaced by rename, the old inode stays intact for a running ADD
	old, _ := os.Open(dst)
	defer old.Close()
	os.WriteFile(src, []byte("version 2"), 0o700)
	if err := install(src, bin); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "version 2" {
		t.Errorf("installed %q, want version 2", b)
	}
	if b, _ := io.ReadAll(old); string(b) != "version 1" {
		t.Errorf("the open old plugin reads %q: it was overwritten in place", b)
	}
	if ents, _ := os.ReadDir(bin); len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
}
