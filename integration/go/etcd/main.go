// Command etcd is etcd v3.6 built from the Go module proxy: upstream's
// go.etcd.io/etcd/server/v3 main package (server/main.go) cannot be
// `go install`ed because its go.mod carries monorepo replace directives, so this
// wrapper module requires it as a dependency and calls the same entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
