"""The test cluster: real Kubernetes components built from source (catalog, build), one module per
kind of process (components), what starts and stops them (controlplane, controllers, reaper), and
the operator installed on them (operator)."""
