package afxdp

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// maxMACs bounds the guest MAC map.
const maxMACs = 4096

// struct xdp_md offsets.
const (
	xdpData         = 0
	xdpDataEnd      = 4
	xdpRxQueueIndex = 16
)

const xdpPass = 2

// newMaps creates the guest MAC set (6-byte key, 1-byte value) and the
// XSKMAP (NIC queue -> socket).
func newMaps(queues int) (macs, xsks *ebpf.Map, err error) {
	macs, err = ebpf.NewMap(&ebpf.MapSpec{Name: "vhostmq_macs", Type: ebpf.Hash, KeySize: 6, ValueSize: 1, MaxEntries: maxMACs})
	if err != nil {
		return nil, nil, fmt.Errorf("BPF hash map: %w", err)
	}
	xsks, err = ebpf.NewMap(&ebpf.MapSpec{Name: "vhostmq_xsks", Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: uint32(queues)})
	if err != nil {
		macs.Close()
		return nil, nil, fmt.Errorf("BPF XSKMAP: %w", err)
	}
	return macs, xsks, nil
}

// program returns the XDP program (see the package doc for the rule):
//
//	if the frame is shorter than an Ethernet header: pass
//	if the destination is a group address (I/G bit): dedicated ? redirect : pass
//	if the destination is in macs: redirect
//	pass
//
// where redirect is bpf_redirect_map(xsks, rx_queue_index, XDP_PASS): a
// queue without a socket passes the frame to the kernel.
func program(macs, xsks *ebpf.Map, dedicated bool) asm.Instructions {
	group := asm.Ja.Label("pass")
	if dedicated {
		group = asm.Ja.Label("redirect")
	}
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, xdpData, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, xdpDataEnd, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		// the destination MAC, the map key, at fp-8
		asm.LoadMem(asm.R5, asm.R2, 0, asm.Word),
		asm.StoreMem(asm.RFP, -8, asm.R5, asm.Word),
		asm.LoadMem(asm.R5, asm.R2, 4, asm.Half),
		asm.StoreMem(asm.RFP, -4, asm.R5, asm.Half),
		asm.LoadMem(asm.R5, asm.R2, 0, asm.Byte),
		asm.And.Imm(asm.R5, 1),
		asm.JEq.Imm(asm.R5, 0, "unicast"),
		group,
		asm.LoadMapPtr(asm.R1, macs.FD()).WithSymbol("unicast"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R2, asm.R6, xdpRxQueueIndex, asm.Word).WithSymbol("redirect"),
		asm.LoadMapPtr(asm.R1, xsks.FD()),
		asm.Mov.Imm(asm.R3, xdpPass),
		asm.FnRedirectMap.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("pass"),
		asm.Return(),
	}
}

func loadProgram(macs, xsks *ebpf.Map, dedicated bool) (*ebpf.Program, error) {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "vhostmq_xdp", Type: ebpf.XDP, License: "GPL",
		Instructions: program(macs, xsks, dedicated)})
	if err != nil {
		return nil, fmt.Errorf("loading the XDP program: %w", err)
	}
	return p, nil
}
