package agentv1

// PortSecurityOn reports whether the port's guest may send only from its
// own addresses: unset counts as on, which the generated
// GetPortSecurity (false when unset) does not say.
func (x *PortSpec) PortSecurityOn() bool {
	return x == nil || x.PortSecurity == nil || *x.PortSecurity
}
