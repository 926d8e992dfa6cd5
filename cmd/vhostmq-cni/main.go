// Command vhostmq-cni is the vhostmq CNI plugin (see package cni).
package main

import (
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/vhostmq/vhostmq/cni"
)

func init() {
	// The plugin never enters a namespace, but CNI plugins conventionally
	// keep the main goroutine on its thread.
	runtime.LockOSThread()
}

func main() {
	skel.PluginMainFuncs(cni.Funcs(), cni.Versions, cni.About)
}
