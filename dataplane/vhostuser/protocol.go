// Package vhostuser implements the vhost-user wire protocol as specified in
// QEMU's docs/interop/vhost-user.rst: message framing, payload layouts, file
// descriptors passed with SCM_RIGHTS, and validation of everything a frontend
// sends. It knows nothing about rings, memory or devices; the backend
// (dataplane/netdev) and the test frontend (dataplane/frontend) both build on
// it.
//
// All vhost-user integers are host-endian; this package only builds for
// little-endian hosts (see endian.go), so binary.LittleEndian is used.
package vhostuser

import "fmt"

// Request is a frontend-to-backend request code ("front-end message types" in
// the spec).
type Request uint32

// Frontend request codes, named as the spec names them.
const (
	ReqGetFeatures         Request = 1
	ReqSetFeatures         Request = 2
	ReqSetOwner            Request = 3
	ReqResetOwner          Request = 4
	ReqSetMemTable         Request = 5
	ReqSetLogBase          Request = 6
	ReqSetLogFD            Request = 7
	ReqSetVringNum         Request = 8
	ReqSetVringAddr        Request = 9
	ReqSetVringBase        Request = 10
	ReqGetVringBase        Request = 11
	ReqSetVringKick        Request = 12
	ReqSetVringCall        Request = 13
	ReqSetVringErr         Request = 14
	ReqGetProtocolFeatures Request = 15
	ReqSetProtocolFeatures Request = 16
	ReqGetQueueNum         Request = 17
	ReqSetVringEnable      Request = 18
	ReqSendRARP            Request = 19
	ReqNetSetMTU           Request = 20
	ReqSetBackendReqFD     Request = 21
	ReqIOTLBMsg            Request = 22
	ReqSetVringEndian      Request = 23
	ReqGetConfig           Request = 24
	ReqSetConfig           Request = 25
	ReqGetInflightFD       Request = 31
	ReqSetInflightFD       Request = 32
	ReqResetDevice         Request = 34
	ReqVringKick           Request = 35
	ReqGetMaxMemSlots      Request = 36
	ReqAddMemReg           Request = 37
	ReqRemMemReg           Request = 38
	ReqSetStatus           Request = 39
	ReqGetStatus           Request = 40
)

var requestNames = map[Request]string{
	ReqGetFeatures: "GET_FEATURES", ReqSetFeatures: "SET_FEATURES", ReqSetOwner: "SET_OWNER",
	ReqResetOwner: "RESET_OWNER", ReqSetMemTable: "SET_MEM_TABLE", ReqSetLogBase: "SET_LOG_BASE",
	ReqSetLogFD: "SET_LOG_FD", ReqSetVringNum: "SET_VRING_NUM", ReqSetVringAddr: "SET_VRING_ADDR",
	ReqSetVringBase: "SET_VRING_BASE", ReqGetVringBase: "GET_VRING_BASE", ReqSetVringKick: "SET_VRING_KICK",
	ReqSetVringCall: "SET_VRING_CALL", ReqSetVringErr: "SET_VRING_ERR",
	ReqGetProtocolFeatures: "GET_PROTOCOL_FEATURES", ReqSetProtocolFeatures: "SET_PROTOCOL_FEATURES",
	ReqGetQueueNum: "GET_QUEUE_NUM", ReqSetVringEnable: "SET_VRING_ENABLE", ReqSendRARP: "SEND_RARP",
	ReqNetSetMTU: "NET_SET_MTU", ReqSetBackendReqFD: "SET_BACKEND_REQ_FD", ReqIOTLBMsg: "IOTLB_MSG",
	ReqSetVringEndian: "SET_VRING_ENDIAN", ReqGetConfig: "GET_CONFIG", ReqSetConfig: "SET_CONFIG",
	ReqGetInflightFD: "GET_INFLIGHT_FD", ReqSetInflightFD: "SET_INFLIGHT_FD", ReqResetDevice: "RESET_DEVICE",
	ReqVringKick: "VRING_KICK", ReqGetMaxMemSlots: "GET_MAX_MEM_SLOTS", ReqAddMemReg: "ADD_MEM_REG",
	ReqRemMemReg: "REM_MEM_REG", ReqSetStatus: "SET_STATUS", ReqGetStatus: "GET_STATUS",
}

func (r Request) String() string {
	if n, ok := requestNames[r]; ok {
		return n
	}
	return fmt.Sprintf("REQUEST_%d", uint32(r))
}

// Header flag bits (spec "Header").
const (
	FlagVersionMask uint32 = 0x3
	Version         uint32 = 0x1
	FlagReply       uint32 = 1 << 2
	FlagNeedReply   uint32 = 1 << 3
)

// Protocol feature bits (GET/SET_PROTOCOL_FEATURES).
const (
	ProtoMQ                  = 0
	ProtoLogSHMFD            = 1
	ProtoRARP                = 2
	ProtoReplyAck            = 3
	ProtoNetMTU              = 4
	ProtoBackendReq          = 5
	ProtoCrossEndian         = 6
	ProtoConfig              = 9
	ProtoInbandNotifications = 14
	ProtoConfigureMemSlots   = 15
	ProtoStatus              = 16
)

// FeatureProtocolFeatures is VHOST_USER_F_PROTOCOL_FEATURES, bit 30 of the
// virtio feature word: set when the backend speaks protocol features.
const FeatureProtocolFeatures = 30

// FeatureLogAll is VHOST_F_LOG_ALL (dirty logging during migration).
const FeatureLogAll = 26

// Limits. Payloads are small fixed structs; the largest legitimate one is a
// full SET_MEM_TABLE (8 + 8*32 bytes) or a config blob, so 4 KiB (the limit
// rust-vmm uses) leaves room and stops memory DoS by huge sizes.
const (
	HeaderSize        = 12
	MaxPayload        = 4096
	MaxFDs            = 8   // SET_MEM_TABLE carries at most one fd per region
	MaxMemTableRegion = 8   // VHOST_MEMORY_MAX_NREGIONS
	MaxVrings         = 256 // KICK/CALL/ERR carry an 8-bit vring index
	MaxQueuePairs     = MaxVrings / 2
	MemRegionSize     = 32
	VringAddrSize     = 40
	VringStateSize    = 8
	U64Size           = 8
)

// Flag bits in the u64 payload of SET_VRING_KICK/CALL/ERR.
const (
	VringIndexMask = 0xff
	VringNoFD      = 1 << 8
)

// VringAddrFlagLog is VHOST_VRING_F_LOG in VringAddr.Flags.
const VringAddrFlagLog = 1 << 0
