// Package repo finds the repository's root, for the tools and tests that
// read its files (go run and go test start in other folders).
package repo

import (
	"errors"
	"os"
	"path/filepath"
)

// Root is the nearest directory from the working directory up that holds
// go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: run it inside the repository")
		}
		dir = parent
	}
}
