// csi-translate runs k8s.io/csi-translation-lib over a corpus and prints
// the results, so that csi-sidecar's own translation (src/migration) can be
// compared with the real library case by case
// (integration/tests/no_cluster/migration_corpus.rs).
//
//	csi-translate < corpus.json > results.json
//
// Input: {"pvs": [{"name", "pv"}], "csiPvs": [{"name", "pv"}],
// "classes": [{"name", "plugin", "class"}], "inline": [{"name",
// "podNamespace", "volume"}], "repair": [{"name", "driver", "volumeHandle",
// "nodeId"}]}. Output: the same five keys, each an object
// from case name to {"result": <object>} or {"error": "<text>"} (a panic of
// the library is reported as an error starting with "panic: ").
package main

import (
	"encoding/json"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	storage "k8s.io/api/storage/v1"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"
)

type pvCase struct {
	Name string              `json:"name"`
	PV   v1.PersistentVolume `json:"pv"`
}

type classCase struct {
	Name   string               `json:"name"`
	Plugin string               `json:"plugin"`
	Class  storage.StorageClass `json:"class"`
}

type inlineCase struct {
	Name         string    `json:"name"`
	PodNamespace string    `json:"podNamespace"`
	Volume       v1.Volume `json:"volume"`
}

type repairCase struct {
	Name         string `json:"name"`
	Driver       string `json:"driver"`
	VolumeHandle string `json:"volumeHandle"`
	NodeID       string `json:"nodeId"`
}

type corpus struct {
	PVs     []pvCase     `json:"pvs"`
	CSIPVs  []pvCase     `json:"csiPvs"`
	Classes []classCase  `json:"classes"`
	Inline  []inlineCase `json:"inline"`
	Repair  []repairCase `json:"repair"`
}

type result struct {
	Result any    `json:"result,omitempty"`
	Error  string `json:"error,omitempty"`
}

func run(f func() (any, error)) (r result) {
	defer func() {
		if p := recover(); p != nil {
			r = result{Error: fmt.Sprintf("panic: %v", p)}
		}
	}()
	out, err := f()
	if err != nil {
		return result{Error: err.Error()}
	}
	return result{Result: out}
}

func main() {
	var c corpus
	if err := json.NewDecoder(os.Stdin).Decode(&c); err != nil {
		fmt.Fprintf(os.Stderr, "csi-translate: reading the corpus: %v\n", err)
		os.Exit(2)
	}
	t := csitrans.New()
	logger := klog.Background()
	out := map[string]map[string]result{"pvs": {}, "csiPvs": {}, "classes": {}, "inline": {}, "repair": {}}
	for _, k := range c.PVs {
		pv := k.PV
		out["pvs"][k.Name] = run(func() (any, error) { return t.TranslateInTreePVToCSI(logger, &pv) })
	}
	for _, k := range c.CSIPVs {
		pv := k.PV
		out["csiPvs"][k.Name] = run(func() (any, error) { return t.TranslateCSIPVToInTree(&pv) })
	}
	for _, k := range c.Classes {
		sc := k.Class
		plugin := k.Plugin
		out["classes"][k.Name] = run(func() (any, error) { return t.TranslateInTreeStorageClassToCSI(logger, plugin, &sc) })
	}
	for _, k := range c.Inline {
		vol := k.Volume
		ns := k.PodNamespace
		out["inline"][k.Name] = run(func() (any, error) { return t.TranslateInTreeInlineVolumeToCSI(logger, &vol, ns) })
	}
	for _, k := range c.Repair {
		k := k
		out["repair"][k.Name] = run(func() (any, error) { return t.RepairVolumeHandle(k.Driver, k.VolumeHandle, k.NodeID) })
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "csi-translate: %v\n", err)
		os.Exit(1)
	}
}
