"""One module per kind of process of the test cluster, each with its flags, its readiness probe and
an ``extra_args`` hook, as controller-runtime's envtest keeps one type per process."""
