package dra

import (
	"encoding/json"
	"os"
	"path/filepath"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/vhostmq/vhostmq/internal/atomicfile"
)

// cdiKind is the CDI vendor/class of the claims' devices.
const cdiKind = "vhostmq.io/queues"

func cdiSpecPath(dir, name string) string {
	return filepath.Join(dir, "vhostmq.io-queues_"+name+".json")
}

// writeCDISpec writes (atomically: the runtime may read it any time) the
// CDI spec of one claim's device: its socket directory bind-mounted where
// the container expects it, and its environment.
func writeCDISpec(dir, name, hostDir, containerDir string, env []string) error {
	spec := &cdispec.Spec{
		Kind: cdiKind,
		Devices: []cdispec.Device{{
			Name: name,
			ContainerEdits: cdispec.ContainerEdits{
				Env:    env,
				Mounts: []*cdispec.Mount{{HostPath: hostDir, ContainerPath: containerDir, Options: []string{"rbind", "rw"}}},
			},
		}},
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return err
	}
	spec.Version = v
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return atomicfile.WriteBytes(cdiSpecPath(dir, name), append(b, '\n'), 0o644, false)
}

func removeCDISpec(dir, name string) error {
	if err := os.Remove(cdiSpecPath(dir, name)); err != nil && !gone(err) {
		return err
	}
	return nil
}
