package agent

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/internal/atomicfile"
)

// stateSchema is the version of ports.json; a file with another version is
// refused rather than misread. Version 2 added network, vlan, ip and dhcp
// to the port spec; a version 1 file reads as version 2 with none of them.
// Version 3 added the slot reservations (written only when there are
// some); an older file has none. Version 4 added port_security to the
// port spec (written only when a port turns it off, the one value that
// is stored); an older file's ports have it on. Version 5 added bandwidth
// (written only when a port has rate limits); an older file's ports have
// none.
const stateSchema = 5

// oldestSchema is the oldest version this agent still reads.
const oldestSchema = 1

const stateName = "ports.json"

// stateFile is the desired ports on disk, written atomically: a temp file,
// fsync, rename, fsync of the directory.
type stateFile struct {
	dir          string
	ports        []*agentv1.PortSpec
	reservations []*agentv1.Reservation
	// aside names the copy a corrupt file was moved to, for health reports.
	aside string
}

type stateJSON struct {
	SchemaVersion int               `json:"schemaVersion"`
	Ports         []json.RawMessage `json:"ports"`
	Reservations  []json.RawMessage `json:"reservations,omitempty"`
}

func openState(dir string, log *slog.Logger) (*stateFile, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	st := &stateFile{dir: dir}
	path := filepath.Join(dir, stateName)
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	ports, res, perr := decodeState(b)
	if perr != nil {
		aside := fmt.Sprintf("%s.corrupt-%s", path, time.Now().UTC().Format("20060102T150405Z"))
		if err := os.Rename(path, aside); err != nil {
			return nil, fmt.Errorf("state file %s is unreadable (%v) and cannot be moved aside: %w", path, perr, err)
		}
		log.Error("state file is corrupt; it was kept aside and no port was restored from it", "file", path, "keptAs", aside, "err", perr)
		st.aside = aside
		return st, nil
	}
	st.ports, st.reservations = ports, res
	return st, nil
}

func decodeState(b []byte) ([]*agentv1.PortSpec, []*agentv1.Reservation, error) {
	var sj stateJSON
	if err := json.Unmarshal(b, &sj); err != nil {
		return nil, nil, err
	}
	if sj.SchemaVersion < oldestSchema || sj.SchemaVersion > stateSchema {
		return nil, nil, fmt.Errorf("schemaVersion %d, this agent reads %d..%d", sj.SchemaVersion, oldestSchema, stateSchema)
	}
	var out []*agentv1.PortSpec
	for i, raw := range sj.Ports {
		var spec agentv1.PortSpec
		if err := protojson.Unmarshal(raw, &spec); err != nil {
			return nil, nil, fmt.Errorf("ports[%d]: %w", i, err)
		}
		out = append(out, &spec)
	}
	var res []*agentv1.Reservation
	for i, raw := range sj.Reservations {
		var r agentv1.Reservation
		if err := protojson.Unmarshal(raw, &r); err != nil {
			return nil, nil, fmt.Errorf("reservations[%d]: %w", i, err)
		}
		res = append(res, &r)
	}
	return out, res, nil
}

func (st *stateFile) save(specs []*agentv1.PortSpec, res []*agentv1.Reservation) error {
	// Each file takes the oldest version that holds what it stores, so
	// an agent from before reservations, port security and rate limits
	// reads it: a rollback keeps its ports.
	sj := stateJSON{SchemaVersion: 2, Ports: []json.RawMessage{}}
	if len(res) > 0 {
		sj.SchemaVersion = 3
	}
	for _, s := range specs {
		if s.PortSecurity != nil {
			sj.SchemaVersion = max(sj.SchemaVersion, 4)
		}
		if s.Bandwidth != nil {
			sj.SchemaVersion = 5
		}
	}
	for _, s := range specs {
		b, err := protojson.Marshal(s)
		if err != nil {
			return err
		}
		sj.Ports = append(sj.Ports, b)
	}
	for _, r := range res {
		b, err := protojson.Marshal(r)
		if err != nil {
			return err
		}
		sj.Reservations = append(sj.Reservations, b)
	}
	b, err := json.MarshalIndent(sj, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteBytes(filepath.Join(st.dir, stateName), append(b, '\n'), 0o600, true); err != nil {
		return err
	}
	d, err := os.Open(st.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
