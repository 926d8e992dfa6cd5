// Package afxdp is the af_xdp uplink's device: an XDP program on a named
// NIC that steers the frames addressed to the dataplane's guests into
// AF_XDP sockets, one per NIC queue, and passes everything else to the
// kernel, which keeps using the NIC as before.
//
// Which frames are ours. XDP cannot clone a frame: each one goes either to
// a socket or to the kernel. The rule is:
//
//   - unicast to a MAC in the guest MAC map (the dataplane adds its guests'
//     addresses as it learns them): to the socket of the frame's RX queue
//     (bpf_redirect_map on an XSKMAP keyed by rx_queue_index; a queue
//     without a socket passes the frame to the kernel);
//   - broadcast and multicast (the I/G bit): on a shared NIC (the default)
//     to the kernel, and the dataplane reads a copy through an AF_PACKET
//     socket that keeps only group frames (a classic BPF filter), ignores
//     the host's own outgoing ones and gets their VLAN tag back from
//     PACKET_AUXDATA; so an ARP request for a guest reaches the guest and
//     one for the host reaches the host. On a Dedicated NIC (the host does
//     not use it) they go to the sockets only;
//   - everything else: to the kernel.
//
// Guests send through the TX ring of a socket. Frames a guest sends do not
// reach the host's own stack on that NIC (XDP sees received frames only):
// guests reach other nodes and the network, not their own node's
// addresses on that NIC. The NIC is put in promiscuous mode while the
// device is open, so frames to guest MACs get past its address filter.
//
// Modes. The program is attached in native (driver) mode where the driver
// offers it, else in generic (SKB) mode; sockets are bound zero-copy where
// the driver supports it, else in copy mode (veth: native XDP, copy mode).
// Mode says which, and why the faster one was refused. The program is
// attached through a BPF link owned by the process: it goes away with the
// last fd, so a crashed dataplane leaves no program on the NIC, and no one
// else can replace it while the link lives.
//
// Memory. Each socket has its own UMEM of 2048 frames of FrameSize bytes
// (8 MiB, pinned: the process needs CAP_IPC_LOCK or the memlock rlimit):
// half always on the fill ring for receiving, half for sending. Every ring
// has room for all frames of its half, so no ring can overflow. Ring
// entries written by the kernel are copied once and checked before use: a
// descriptor must lie inside one receive chunk, a completed address must
// be a send chunk; anything else is counted and dropped.
//
// Workers. Worker i receives on the NIC queues q with q mod workers == i
// (and worker 0 on the group socket) and sends on socket i mod queues; a
// socket's send side is shared under a lock only when there are more
// workers than NIC queues (a veth has one queue unless made with more).
package afxdp
