// The etcd binary, as upstream's server/main.go builds it, from the go.etcd.io/etcd/server/v3
// release pinned in go.mod. Built by scripts/kube-current.sh; tests and benchmarks only.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
