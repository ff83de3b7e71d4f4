// hostpath-standin stands in for the kubernetes-csi hostpath driver
// (`hostpathplugin`) in the two ways Kubernetes' storage e2e "CSI Mock" specs
// run it; that driver is not served here.
//
//   - Proxy mode (`-proxy-endpoint=tcp://:9000`), used by the specs with
//     hooks, whose mock driver lives inside e2e.test: each connection to the
//     CSI socket is relayed to the next connection arriving on the TCP port.
//     e2e.test opens those connections ahead of time through the apiserver's
//     port-forward and serves gRPC on them. Nothing is parsed: bytes are
//     copied both ways until either side closes (proxy.go).
//   - Driver mode (no -proxy-endpoint), used by the other specs: Kubernetes'
//     own e2e mock CSI service (the one e2e.test embeds) is served on the
//     socket, configured from the hostpath driver's flags the e2e manifests
//     pass, and every call is logged as the hostpath driver logs it
//     (`gRPCCall: {"Method":...}`), the line the specs read back from the
//     container's log (driver.go).
//
// The hostpath driver's other flags are accepted and ignored, so the e2e
// manifests run it unchanged.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"k8s.io/klog/v2"
)

const prog = "hostpath-standin"

// options are the hostpath driver's flags that change what the stand-in does.
type options struct {
	endpoint           string
	proxyEndpoint      string
	driverName         string
	nodeID             string
	enableAttach       bool
	enableTopology     bool
	attachLimit        int64
	nodeExpandRequired bool
}

func main() {
	var o options
	flag.StringVar(&o.endpoint, "endpoint", "unix:///csi/csi.sock", "the CSI socket the sidecars and the kubelet dial")
	flag.StringVar(&o.proxyEndpoint, "proxy-endpoint", "", "proxy mode: tcp://[host]:port where e2e.test's connections arrive")
	flag.StringVar(&o.driverName, "drivername", "hostpath.csi.k8s.io", "driver mode: the name GetPluginInfo reports")
	flag.StringVar(&o.nodeID, "nodeid", "", "the node's name (the mock service reports the driver name as node ID, as it does inside e2e.test)")
	flag.BoolVar(&o.enableAttach, "enable-attach", false, "driver mode: advertise and serve ControllerPublish/Unpublish")
	flag.BoolVar(&o.enableTopology, "enable-topology", false, "driver mode: advertise topology")
	flag.Int64Var(&o.attachLimit, "attach-limit", 0, "driver mode: volumes per node (0: no limit)")
	flag.BoolVar(&o.nodeExpandRequired, "node-expand-required", false, "driver mode: advertise node expansion")
	for _, ignored := range []string{"statedir", "capacity", "default-volume-size", "max-volume-size"} {
		flag.String(ignored, "", "ignored (hostpath driver flag)")
	}
	for _, ignored := range []string{"ephemeral", "enable-volume-expansion", "check-volume-lifecycle", "enable-list-snapshots"} {
		flag.Bool(ignored, false, "ignored (hostpath driver flag)")
	}
	klog.InitFlags(nil) // -v: the gRPCCall lines are logged at 3, as the hostpath driver's
	flag.Parse()

	socket := strings.TrimPrefix(o.endpoint, "unix://")
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		fail("remove the stale socket %s: %v", socket, err)
	}
	if o.proxyEndpoint != "" {
		relayForever(socket, strings.TrimPrefix(o.proxyEndpoint, "tcp://"))
	}
	serveMock(socket, o)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, prog+": "+format+"\n", args...)
	os.Exit(1)
}
