package plugin

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// A DRA claim's socket directory and its record, shared by the DRA driver
// (plugin/dra, which makes them) and the CNI plugin (which finds them).

// ClaimSocketName is the vhost-user socket in a claim's directory: a claim
// is one NIC.
const ClaimSocketName = "vhost-user.sock"

// ClaimOwner is the agent reservation of a claim.
func ClaimOwner(claimUID string) string { return agentv1.OwnerClaim + claimUID }

// ClaimDir is the host directory name of a claim's socket directory: a
// hash of its UID keeps it short (unix socket paths stay under 108 bytes)
// and apart from the device plugin's qp-* directories, which it reclaims.
func ClaimDir(claimUID string) string {
	sum := sha256.Sum256([]byte(claimUID))
	return "claim-" + hex.EncodeToString(sum[:8])
}

// ClaimRecord is what a prepared claim leaves beside its socket directory
// (ClaimRecordFile): the CNI plugin finds the pod's claim through the
// agent's reservations and reads here where the container sees the socket.
type ClaimRecord struct {
	Claim        string   `json:"claim"`
	Namespace    string   `json:"namespace"`
	Name         string   `json:"name"`
	Slots        []string `json:"slots"`
	ContainerDir string   `json:"containerDir"`
}

// ClaimRecordFile is the record's path: beside the directory, not in it
// (the container sees the directory).
func ClaimRecordFile(socketRoot, claimUID string) string {
	return filepath.Join(socketRoot, "."+ClaimDir(claimUID)+".json")
}

// ReadClaimRecord reads a claim's record.
func ReadClaimRecord(socketRoot, claimUID string) (*ClaimRecord, error) {
	f := ClaimRecordFile(socketRoot, claimUID)
	b, err := os.ReadFile(f)
	if err != nil {
		return nil, err
	}
	var r ClaimRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", f, err)
	}
	if r.Claim != claimUID {
		return nil, fmt.Errorf("%s: the record of claim %q, not %q", f, r.Claim, claimUID)
	}
	return &r, nil
}
