// Package atomicfile replaces a file so that a reader sees the old content
// or the new, never a part: the new content goes to a temporary file in the
// same directory, which is renamed over the old one.
package atomicfile

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
)

// Write replaces path with src's content and mode perm; with sync the data
// reach the disk before the rename (state that must survive a crash).
func Write(path string, src io.Reader, perm os.FileMode, sync bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if sync {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// WriteBytes is Write of b.
func WriteBytes(path string, b []byte, perm os.FileMode, sync bool) error {
	return Write(path, bytes.NewReader(b), perm, sync)
}
