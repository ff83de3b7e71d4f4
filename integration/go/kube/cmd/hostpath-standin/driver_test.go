package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// e2eCall mirrors the fields Kubernetes' e2e MockCSICall decodes from a
// gRPCCall line (test/e2e/storage/drivers/csi.go).
type e2eCall struct {
	Method  string
	Request struct {
		VolumeContext map[string]string `json:"volume_context"`
		Secrets       map[string]string `json:"secrets"`
	}
	FullError struct {
		Code    codes.Code `json:"code"`
		Message string     `json:"message"`
	}
	Error string
}

func TestTheSpecsReadBackAFailedCall(t *testing.T) {
	req := &csi.NodePublishVolumeRequest{VolumeId: "4", VolumeContext: map[string]string{"csi.storage.k8s.io/pod.name": "pvc-volume-tester"}}
	line := callLine("/csi.v1.Node/NodePublishVolume", req, nil, status.Error(codes.ResourceExhausted, "no space"))
	var call e2eCall
	if err := json.Unmarshal(line, &call); err != nil {
		t.Fatalf("the line %s does not decode: %v", line, err)
	}
	if call.Method != "/csi.v1.Node/NodePublishVolume" || call.FullError.Code != codes.ResourceExhausted ||
		call.FullError.Message != "no space" || !strings.Contains(call.Error, "no space") ||
		call.Request.VolumeContext["csi.storage.k8s.io/pod.name"] != "pvc-volume-tester" {
		t.Fatalf("decoded %+v from %s", call, line)
	}
}

func TestASuccessfulCallHasNoError(t *testing.T) {
	line := callLine("/csi.v1.Identity/Probe", &csi.ProbeRequest{}, &csi.ProbeResponse{}, nil)
	var call e2eCall
	if err := json.Unmarshal(line, &call); err != nil {
		t.Fatalf("the line %s does not decode: %v", line, err)
	}
	if call.Error != "" || call.FullError.Code != codes.OK {
		t.Fatalf("decoded %+v from %s", call, line)
	}
}

func TestANodeCallWithoutAPublishContextGetsTheMocksDevice(t *testing.T) {
	bare := &csi.NodeStageVolumeRequest{VolumeId: "4"}
	got, ok := withDevice(bare).(*csi.NodeStageVolumeRequest)
	if !ok || got.PublishContext["device"] != mockDevice || bare.PublishContext != nil {
		t.Fatalf("got %v, the caller's request became %v", got, bare)
	}
	published := &csi.NodePublishVolumeRequest{PublishContext: map[string]string{"device": "/dev/x"}}
	if withDevice(published) != any(published) {
		t.Fatal("a request with a device must pass unchanged")
	}
}
