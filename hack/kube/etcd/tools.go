//go:build tools

// Package tools pins the etcd server hack/install-deps.sh builds from this module.
package tools

import _ "go.etcd.io/etcd/server/v3"
