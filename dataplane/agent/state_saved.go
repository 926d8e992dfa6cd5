package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Files of the state directory: the ports, and the handoff's socket and
// lock (an uninstall removes them once no port is left).
const (
	StateFileName     = stateName
	HandoffSocketName = handoffName
	LockFileName      = lockName
)

// SavedPorts counts the ports the state file in dir lists, whatever its
// schema version: an uninstall must not remove the state of ports VMs
// still use, even when a newer agent wrote it. No file counts 0.
func SavedPorts(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateName))
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var sj stateJSON
	if err := json.Unmarshal(b, &sj); err != nil {
		return 0, fmt.Errorf("%s: %w", filepath.Join(dir, stateName), err)
	}
	return len(sj.Ports), nil
}
