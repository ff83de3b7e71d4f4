package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

// An inline ephemeral volume (its ID the kubelet's) is published and
// unpublished as the mock service expects, not adopted (--adopt-volumes):
// adopting it made the service answer AlreadyExists.
func TestAnInlineVolumeIsNotAdopted(t *testing.T) {
	svc := service.New(service.Config{DriverName: "d", DisableAttach: true})
	tr := &translator{internal: "d", external: "d", adopter: svc, instance: "abcd1234",
		adopted: map[string]string{}, adoptedBy: map[string]string{}, ephemeral: map[string]bool{}}
	target := filepath.Join(t.TempDir(), "mount")
	publish := &csi.NodePublishVolumeRequest{
		VolumeId:         "csi-0123",
		TargetPath:       target,
		VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}},
		VolumeContext:    map[string]string{ephemeralKey: "true"},
	}
	ctx := context.Background()
	if _, err := tr.call(ctx, publish, func(ctx context.Context, req any) (any, error) {
		return svc.NodePublishVolume(ctx, req.(*csi.NodePublishVolumeRequest))
	}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if len(tr.adopted) != 0 {
		t.Fatalf("adopted %v", tr.adopted)
	}
	unpublish := &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-0123", TargetPath: target}
	if _, err := tr.call(ctx, unpublish, func(ctx context.Context, req any) (any, error) {
		return svc.NodeUnpublishVolume(ctx, req.(*csi.NodeUnpublishVolumeRequest))
	}); err != nil {
		t.Fatalf("unpublish: %v", err)
	}
	if len(tr.adopted) != 0 || len(tr.ephemeral) != 0 {
		t.Fatalf("adopted %v, ephemeral %v", tr.adopted, tr.ephemeral)
	}
}

// A clone names its source by the callers' ID (--adopt-volumes): the
// service gets its own ID for it, so the clone is made.
func TestACloneOfAnAdoptedInstancesVolumeIsMade(t *testing.T) {
	svc := service.New(service.Config{DriverName: "d", DisableAttach: true})
	tr := &translator{internal: "d", external: "d", adopter: svc, instance: "abcd1234",
		adopted: map[string]string{}, adoptedBy: map[string]string{}, ephemeral: map[string]bool{}}
	ctx := context.Background()
	mount := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	create := func(req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
		resp, err := tr.call(ctx, req, func(ctx context.Context, req any) (any, error) {
			return svc.CreateVolume(ctx, req.(*csi.CreateVolumeRequest))
		})
		if err != nil {
			return nil, err
		}
		return resp.(*csi.CreateVolumeResponse), nil
	}
	source, err := create(&csi.CreateVolumeRequest{Name: "source", VolumeCapabilities: []*csi.VolumeCapability{mount}})
	if err != nil {
		t.Fatal(err)
	}
	id := source.GetVolume().GetVolumeId()
	clone, err := create(&csi.CreateVolumeRequest{Name: "clone", VolumeCapabilities: []*csi.VolumeCapability{mount},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}})
	if err != nil {
		t.Fatalf("cloning %s: %v", id, err)
	}
	if got := clone.GetVolume().GetContentSource().GetVolume().GetVolumeId(); got != id {
		t.Errorf("the clone's source is %q, the caller named %q", got, id)
	}
}
