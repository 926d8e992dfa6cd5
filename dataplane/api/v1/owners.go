package agentv1

// Reservation owners by convention (ReserveRequest.owner): the agent
// arbitrates between the two Kubernetes paths that hand slots out. A DRA
// claim's slots are reported unhealthy to the device plugin (the kubelet
// must not allocate them); a port may take a slot the device plugin's
// allocation holds without naming it (the kubelet's allocation is the
// pod's).
const (
	OwnerAllocation = "alloc/" // + allocation directory (device plugin)
	OwnerClaim      = "claim/" // + ResourceClaim UID (DRA driver)
)

// LabelInterface is the port label naming the pod's interface for the
// port (the CNI plugin sets it; the DRA driver reports it in the claim's
// status).
const LabelInterface = "interface"
