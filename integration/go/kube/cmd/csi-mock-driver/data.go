package main

// --data-dir: volumes that keep data, for Kubernetes' external storage
// testsuites (a pod writes, another pod reads; restores and clones start
// with their source's files). The mock service keeps its in-memory
// bookkeeping; this file adds the data:
//
//   - a volume is the directory <data-dir>/volumes/<ID>, made after
//     CreateVolume (a copy of the snapshot's or the source volume's files for
//     a restore or a clone) and removed after DeleteVolume;
//   - a snapshot is a copy of its volume's directory at
//     <data-dir>/snapshots/<ID>, made after CreateSnapshot and removed after
//     DeleteSnapshot;
//   - NodePublishVolume bind-mounts the volume's directory on the target path
//     (read-only when asked); NodeUnpublishVolume unmounts it first, so the
//     mock's removal of the target path never reaches the volume's files. An
//     inline ephemeral volume gets its directory at publish and loses it at
//     unpublish.
//
// IDs are the callers' (with --adopt-volumes, the same in every instance),
// so a controller instance and a node instance sharing the directory see the
// same volumes.

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const ephemeralKey = "csi.storage.k8s.io/ephemeral"

type dataDir struct {
	root      string
	ephemeral map[string]bool // target path -> an inline volume published there
}

func newDataDir(root string) (*dataDir, error) {
	for _, sub := range []string{"volumes", "snapshots"} {
		if err := os.MkdirAll(filepath.Join(root, sub), 0o755); err != nil {
			return nil, err
		}
	}
	return &dataDir{root: root, ephemeral: map[string]bool{}}, nil
}

// name keeps an ID to one path element.
func name(id string) string {
	return strings.NewReplacer("/", "_", "..", "__").Replace(id)
}

func (d *dataDir) volume(id string) string   { return filepath.Join(d.root, "volumes", name(id)) }
func (d *dataDir) snapshot(id string) string { return filepath.Join(d.root, "snapshots", name(id)) }

// before runs ahead of the mock service's handler, with the callers' IDs.
func (d *dataDir) before(req any) error {
	if r, ok := req.(*csi.NodeUnpublishVolumeRequest); ok {
		if err := unmount(r.TargetPath); err != nil {
			return status.Errorf(codes.Internal, "unmounting %s: %v", r.TargetPath, err)
		}
	}
	return nil
}

// after runs once the handler succeeded: req with the callers' IDs (a copy
// taken before the call), resp as the callers get it.
func (d *dataDir) after(req, resp any) error {
	var err error
	switch r := req.(type) {
	case *csi.CreateVolumeRequest:
		err = d.created(r, resp.(*csi.CreateVolumeResponse).GetVolume().GetVolumeId())
	case *csi.DeleteVolumeRequest:
		err = os.RemoveAll(d.volume(r.VolumeId))
	case *csi.CreateSnapshotRequest:
		snap := resp.(*csi.CreateSnapshotResponse).GetSnapshot().GetSnapshotId()
		err = copyOnce(d.volume(r.SourceVolumeId), d.snapshot(snap))
	case *csi.DeleteSnapshotRequest:
		err = os.RemoveAll(d.snapshot(r.SnapshotId))
	case *csi.NodePublishVolumeRequest:
		err = d.publish(r)
	case *csi.NodeUnpublishVolumeRequest:
		if d.ephemeral[r.TargetPath] {
			delete(d.ephemeral, r.TargetPath)
			err = os.RemoveAll(d.volume(r.VolumeId))
		}
	}
	if err != nil {
		return status.Errorf(codes.Internal, "volume data: %v", err)
	}
	return nil
}

func (d *dataDir) created(r *csi.CreateVolumeRequest, id string) error {
	dir := d.volume(id)
	source := ""
	switch {
	case r.GetVolumeContentSource().GetSnapshot() != nil:
		source = d.snapshot(r.GetVolumeContentSource().GetSnapshot().GetSnapshotId())
	case r.GetVolumeContentSource().GetVolume() != nil:
		source = d.volume(r.GetVolumeContentSource().GetVolume().GetVolumeId())
	}
	if source == "" {
		return os.MkdirAll(dir, 0o755)
	}
	return copyOnce(source, dir)
}

func (d *dataDir) publish(r *csi.NodePublishVolumeRequest) error {
	source := d.volume(r.VolumeId)
	if r.GetVolumeContext()[ephemeralKey] == "true" {
		if err := os.MkdirAll(source, 0o755); err != nil {
			return err
		}
		d.ephemeral[r.TargetPath] = true
	}
	if _, err := os.Stat(source); err != nil {
		return fmt.Errorf("volume %s has no data directory: %w", r.VolumeId, err)
	}
	// The mock service makes the target of a persistent volume, not of an
	// inline one.
	if err := os.MkdirAll(r.TargetPath, 0o750); err != nil {
		return err
	}
	if err := unix.Mount(source, r.TargetPath, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", source, r.TargetPath, err)
	}
	if r.Readonly {
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
		if err := unix.Mount("", r.TargetPath, "", flags, ""); err != nil {
			_ = unix.Unmount(r.TargetPath, 0)
			return fmt.Errorf("making %s read-only: %w", r.TargetPath, err)
		}
	}
	return nil
}

// unmount unmounts path until nothing is mounted there (not mounted, or
// gone: nothing to do).
func unmount(path string) error {
	for {
		err := unix.Unmount(path, 0)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		default:
			return err
		}
	}
}

// copyOnce copies the tree src to dst unless dst exists (a retried call).
func copyOnce(src, dst string) error {
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	tmp := dst + ".partial"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := copyTree(src, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := e.Info()
		if err != nil {
			return err
		}
		switch {
		case e.IsDir():
			if err := os.MkdirAll(target, info.Mode().Perm()); err != nil {
				return err
			}
		case e.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case e.Type().IsRegular():
			if err := copyFile(path, target, info.Mode().Perm()); err != nil {
				return err
			}
		}
		if e.Type()&fs.ModeSymlink == 0 {
			special := info.Mode() & (fs.ModePerm | fs.ModeSetgid | fs.ModeSetuid | fs.ModeSticky)
			if err := os.Chmod(target, special); err != nil {
				return err
			}
		}
		return lchown(target, info)
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// lchown keeps the owner (fsGroup tests check ownership after a restore).
func lchown(path string, info fs.FileInfo) error {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return os.Lchown(path, int(st.Uid), int(st.Gid))
	}
	return nil
}
