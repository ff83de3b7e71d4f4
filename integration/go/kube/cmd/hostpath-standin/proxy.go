// csi-mock-proxy stands in for the kubernetes-csi hostpath driver in the one
// mode Kubernetes' storage e2e "CSI Mock" specs run it in when the mock
// driver lives inside e2e.test (`hostpathplugin -proxy-endpoint=tcp://:9000`):
// it relays each connection to the CSI socket to the next connection on the
// TCP port. e2e.test opens those TCP connections ahead of time through the
// apiserver's port-forward, and serves gRPC on them. Nothing is parsed: the
// bytes are copied both ways until either side closes.
//
// The hostpath driver's other flags are accepted and ignored, so the e2e
// manifests run it unchanged.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strings"
	"sync"
)

func main() {
	endpoint := flag.String("endpoint", "unix:///csi/csi.sock", "the CSI socket the sidecars and the kubelet dial")
	proxy := flag.String("proxy-endpoint", "", "tcp://[host]:port where e2e.test's connections arrive")
	flag.String("nodeid", "", "ignored (hostpath driver flag)")
	flag.String("drivername", "", "ignored (hostpath driver flag)")
	flag.Int("v", 0, "ignored (log verbosity)")
	flag.Parse()
	if *proxy == "" {
		fail("only the proxy mode is provided: -proxy-endpoint is required")
	}
	socket := strings.TrimPrefix(*endpoint, "unix://")
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		fail("remove the stale socket %s: %v", socket, err)
	}
	clients, err := net.Listen("unix", socket)
	if err != nil {
		fail("listen on %s: %v", socket, err)
	}
	address := strings.TrimPrefix(*proxy, "tcp://")
	upstream, err := net.Listen("tcp", address)
	if err != nil {
		fail("listen on %s: %v", address, err)
	}
	log.Printf("relaying %s to the connections arriving on %s", socket, address)
	for {
		client, err := clients.Accept()
		if err != nil {
			fail("accept on %s: %v", socket, err)
		}
		server, err := upstream.Accept()
		if err != nil {
			fail("accept on %s: %v", address, err)
		}
		go relay(client, server)
	}
}

// relay copies bytes both ways; when either direction ends, both
// connections close.
func relay(a, b net.Conn) {
	var once sync.Once
	done := func() {
		once.Do(func() {
			a.Close()
			b.Close()
		})
	}
	go func() {
		io.Copy(a, b)
		done()
	}()
	io.Copy(b, a)
	done()
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "csi-mock-proxy: "+format+"\n", args...)
	os.Exit(1)
}
