package main

import (
	"context"
	"encoding/json"
	"net"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	mockdriver "k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/driver"
	mockservice "k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

// serveMock serves Kubernetes' e2e mock CSI service on the socket, configured
// as e2e.test configures its embedded copy, with the node's directories
// handled locally (the container mounts the kubelet's pods and CSI
// directories at the host's paths). It never returns.
func serveMock(socket string, o options) {
	service := mockservice.New(mockservice.Config{
		DisableAttach:         !o.enableAttach,
		DriverName:            o.driverName,
		AttachLimit:           o.attachLimit,
		NodeExpansionRequired: o.nodeExpandRequired,
		EnableTopology:        o.enableTopology,
		IO:                    mockservice.OSDirIO{},
	})
	listener, err := net.Listen("unix", socket)
	if err != nil {
		fail("listen on %s: %v", socket, err)
	}
	driver := mockdriver.NewCSIDriver(&mockdriver.CSIDriverServers{Controller: service, Identity: service, Node: service})
	if err := driver.Start(listener, oneAtATimeLogged()); err != nil {
		fail("serve on %s: %v", socket, err)
	}
	klog.Infof("serving the mock CSI service %q on %s (attach %v, topology %v, attach limit %d, node expansion %v)",
		o.driverName, socket, o.enableAttach, o.enableTopology, o.attachLimit, o.nodeExpandRequired)
	select {}
}

// oneAtATimeLogged serves one call at a time (the mock service shares maps
// between its state and its answers, which would race) and logs each call as
// the hostpath driver does: `gRPCCall: <JSON>` at -v=3, the line the e2e
// specs parse back from the container's log.
func oneAtATimeLogged() grpc.UnaryServerInterceptor {
	var serial sync.Mutex
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		serial.Lock()
		defer serial.Unlock()
		resp, err := handler(ctx, withDevice(req))
		klog.V(3).Infof("gRPCCall: %s\n", callLine(info.FullMethod, req, resp, err))
		return resp, err
	}
}

// mockDevice is the "device" the mock service's ControllerPublishVolume
// answers in the publish context.
const mockDevice = "/dev/mock"

// withDevice gives a node call without a publish context the "device" the
// mock service requires when attach is on. The hostpath driver stages and
// publishes without one, and a spec relies on that: a volume attached while
// its CSIDriver required attach is staged after the CSIDriver stopped
// requiring it, so the kubelet passes no publish context.
func withDevice(req any) any {
	switch r := req.(type) {
	case *csi.NodeStageVolumeRequest:
		if _, ok := r.PublishContext["device"]; !ok {
			c := *r // csi v1.9's messages are plain structs (APIv1)
			c.PublishContext = withKey(r.PublishContext)
			return &c
		}
	case *csi.NodePublishVolumeRequest:
		if _, ok := r.PublishContext["device"]; !ok {
			c := *r
			c.PublishContext = withKey(r.PublishContext)
			return &c
		}
	}
	return req
}

// withKey: a copy of the context with the device.
func withKey(context map[string]string) map[string]string {
	out := map[string]string{"device": mockDevice}
	for k, v := range context {
		out[k] = v
	}
	return out
}

// callLine is the JSON the specs decode: Method, Request, Response, Error (a
// string, "" without one) and FullError ({"code":..,"message":..}).
func callLine(method string, req, resp any, err error) []byte {
	line := struct {
		Method    string
		Request   any
		Response  any
		Error     string
		FullError *spb.Status
	}{Method: method, Request: req, Response: resp}
	if err != nil {
		line.Error = err.Error()
		line.FullError = status.Convert(err).Proto()
	}
	encoded, marshalErr := json.Marshal(line)
	if marshalErr != nil {
		return []byte(`{"Method":"` + method + `","Error":"unloggable call"}`)
	}
	return encoded
}
