package ctl

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

type overlayJSON struct {
	Local         string             `json:"local"`
	MTU           uint32             `json:"mtu"`
	RxUnknownVTEP uint64             `json:"rx_unknown_vtep"`
	RxInvalid     uint64             `json:"rx_invalid"`
	TxNoVTEP      uint64             `json:"tx_no_vtep"`
	VTEPs         []vtepJSON         `json:"vteps"`
	Entries       []overlayEntryJSON `json:"entries"`
}

type vtepJSON struct {
	Address   string `json:"address"`
	RxPackets uint64 `json:"rx_packets"`
	RxBytes   uint64 `json:"rx_bytes"`
	TxPackets uint64 `json:"tx_packets"`
	TxBytes   uint64 `json:"tx_bytes"`
	TxErrors  uint64 `json:"tx_errors"`
	TxDropped uint64 `json:"tx_dropped"`
	MACs      uint32 `json:"macs"`
}

type overlayEntryJSON struct {
	Network    string `json:"network"`
	VNI        uint32 `json:"vni"`
	MAC        string `json:"mac"`
	VTEP       string `json:"vtep"`
	AgeSeconds uint32 `json:"age_seconds"`
}

func overlaySetup(fs *pflag.FlagSet) runFunc {
	var macs bool
	fs.BoolVar(&macs, "macs", false, "list every address learned behind a VTEP (the overlay's forwarding table)")
	return func(ctx context.Context, c *cli, _ []string) error {
		o, err := call(ctx, c, agentv1.AgentClient.GetOverlay, &agentv1.GetOverlayRequest{})
		if err != nil {
			return err
		}
		out := overlayJSON{Local: o.GetLocal(), MTU: o.GetMtu(), RxUnknownVTEP: o.GetRxUnknownVtep(), RxInvalid: o.GetRxInvalid(),
			TxNoVTEP: o.GetTxNoVtep(), VTEPs: []vtepJSON{}, Entries: []overlayEntryJSON{}}
		for _, v := range o.GetVteps() {
			out.VTEPs = append(out.VTEPs, vtepJSON{Address: v.GetAddress(), RxPackets: v.GetRxPackets(), RxBytes: v.GetRxBytes(),
				TxPackets: v.GetTxPackets(), TxBytes: v.GetTxBytes(), TxErrors: v.GetTxErrors(), TxDropped: v.GetTxDropped(), MACs: v.GetMacs()})
		}
		for _, e := range o.GetEntries() {
			out.Entries = append(out.Entries, overlayEntryJSON{Network: e.GetNetwork(), VNI: e.GetVni(), MAC: e.GetMac(), VTEP: e.GetVtep(), AgeSeconds: e.GetAgeSeconds()})
		}
		if c.output == "json" {
			return writeJSON(c.stdout, out)
		}
		t := newTable(c.stdout)
		t.row("LOCAL", out.Local)
		t.row("MTU", fmt.Sprintf("%d (the guests'; the underlay's less 50)", out.MTU))
		t.row("DROPPED", fmt.Sprintf("%d from no VTEP, %d not VXLAN, %d with no VTEP to go to", out.RxUnknownVTEP, out.RxInvalid, out.TxNoVTEP))
		if err := t.flush(); err != nil {
			return err
		}
		fmt.Fprintln(c.stdout)
		t = newTable(c.stdout)
		t.row("VTEP", "RX_PKTS", "RX_BYTES", "TX_PKTS", "TX_BYTES", "TX_ERRORS", "TX_DROPPED", "MACS")
		for _, v := range out.VTEPs {
			t.row(v.Address, fmt.Sprint(v.RxPackets), fmt.Sprint(v.RxBytes), fmt.Sprint(v.TxPackets), fmt.Sprint(v.TxBytes),
				fmt.Sprint(v.TxErrors), fmt.Sprint(v.TxDropped), fmt.Sprint(v.MACs))
		}
		if !macs {
			return t.flush()
		}
		if err := t.flush(); err != nil {
			return err
		}
		fmt.Fprintln(c.stdout)
		t = newTable(c.stdout)
		t.row("NETWORK", "VNI", "MAC", "VTEP", "AGE")
		for _, e := range out.Entries {
			t.row(e.Network, fmt.Sprint(e.VNI), e.MAC, e.VTEP, fmt.Sprintf("%ds", e.AgeSeconds))
		}
		return t.flush()
	}
}
