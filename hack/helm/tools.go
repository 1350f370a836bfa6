//go:build tools

// Helm, as the chart test runs it: hack/install-deps.sh builds it from this module. Nothing
// built from it is committed.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
