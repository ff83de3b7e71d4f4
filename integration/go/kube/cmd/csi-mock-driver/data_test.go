package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o640); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A snapshot keeps the files its volume had when it was taken; a restore
// and a clone start with their source's files; deletes remove the data.
func TestSnapshotsRestoresAndClonesCarryTheFiles(t *testing.T) {
	d, err := newDataDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	call := func(req, resp any) {
		t.Helper()
		if err := d.after(req, resp); err != nil {
			t.Fatalf("%T: %v", req, err)
		}
	}
	call(&csi.CreateVolumeRequest{Name: "a"}, &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "v1"}})
	sub := filepath.Join(d.volume("v1"), "sub")
	if err := os.Mkdir(sub, 0o770); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sub, 0o770|os.ModeSetgid); err != nil { // as fsGroup leaves it
		t.Fatal(err)
	}
	write(t, filepath.Join(d.volume("v1"), "sub", "file"), "before")
	call(&csi.CreateSnapshotRequest{SourceVolumeId: "v1"}, &csi.CreateSnapshotResponse{Snapshot: &csi.Snapshot{SnapshotId: "s1"}})
	write(t, filepath.Join(d.volume("v1"), "sub", "file"), "after")

	fromSnapshot := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "s1"}}}
	call(&csi.CreateVolumeRequest{Name: "b", VolumeContentSource: fromSnapshot}, &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "v2"}})
	if got := read(t, filepath.Join(d.volume("v2"), "sub", "file")); got != "before" {
		t.Fatalf("the restore has %q, the snapshot was taken with %q", got, "before")
	}
	info, err := os.Stat(filepath.Join(d.volume("v2"), "sub"))
	if err != nil || info.Mode()&os.ModeSetgid == 0 {
		t.Fatalf("the setgid bit of a directory is lost in the copy: %v %v", info.Mode(), err)
	}
	clone := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "v1"}}}
	call(&csi.CreateVolumeRequest{Name: "c", VolumeContentSource: clone}, &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "v3"}})
	if got := read(t, filepath.Join(d.volume("v3"), "sub", "file")); got != "after" {
		t.Fatalf("the clone has %q", got)
	}
	// A retried create keeps what the volume has by then.
	write(t, filepath.Join(d.volume("v3"), "sub", "file"), "written")
	call(&csi.CreateVolumeRequest{Name: "c", VolumeContentSource: clone}, &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "v3"}})
	if got := read(t, filepath.Join(d.volume("v3"), "sub", "file")); got != "written" {
		t.Fatalf("a retried create overwrote the volume: %q", got)
	}
	call(&csi.DeleteVolumeRequest{VolumeId: "v1"}, &csi.DeleteVolumeResponse{})
	call(&csi.DeleteSnapshotRequest{SnapshotId: "s1"}, &csi.DeleteSnapshotResponse{})
	for _, gone := range []string{d.volume("v1"), d.snapshot("s1")} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Fatalf("%s is still there (%v)", gone, err)
		}
	}
}

// Publishing bind-mounts the volume's directory; unpublishing unmounts it
// before the target path is removed, so the files stay (needs root).
func TestPublishedFilesLandInTheVolume(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root")
	}
	d, err := newDataDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.after(&csi.CreateVolumeRequest{Name: "a"}, &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "v1"}}); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "mount")
	if err := os.Mkdir(target, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := d.after(&csi.NodePublishVolumeRequest{VolumeId: "v1", TargetPath: target}, &csi.NodePublishVolumeResponse{}); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(target, "file"), "data")
	if err := d.before(&csi.NodeUnpublishVolumeRequest{VolumeId: "v1", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(target); err != nil { // what the mock service does next
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(d.volume("v1"), "file")); got != "data" {
		t.Fatalf("the volume has %q", got)
	}
}
